"""A distributed learner on a prioritized Reverb table feeds its agent's priorities back.

Real roles (replay server, learner, one collector) on DQN CartPole and SAC
Pendulum shrunk to (8, 8) networks: collectors insert every window at
priority 1.0, so any other priority in the table was set by the learner's
`update_priorities`, the same call a single-process prioritized run makes.
SAC's priorities are its critics' TD errors (agents/sac.py); before they were,
a SAC learner left every priority at 1.0.
"""

import os

import numpy as np
import pytest
import reverb

from experiment.distributed import common, tables
from experiment.distributed.cluster import Cluster, free_port
from experiment.distributed.config import REPLAY_TABLE
from tests.distributed import conftest
from tests.distributed.conftest import start_training, tiny_dqn_cluster, wait_until

pytestmark = [pytest.mark.reverb, pytest.mark.timeout(600)]


def _sampled_priorities(address, count=256):
    client = reverb.Client(address)
    samples = client.sample(REPLAY_TABLE, num_samples=count, emit_timesteps=False)
    return np.array([sample.info.priority for sample in samples], np.float64)


def _tiny_sac_cluster(tmp_path, *bindings):
    os.chdir(conftest.ROOT)
    return Cluster(gin_files=conftest.GIN_FILES,
                   gin_bindings=conftest.FAST + [*bindings, 'run.num_env_steps = 1000000'],
                   root_dir=str(tmp_path / 'run'), port=free_port(), bind_all_interfaces=True)


@pytest.mark.parametrize('make_cluster', [tiny_dqn_cluster, _tiny_sac_cluster],
                         ids=['dqn', 'sac'])
def test_the_learner_updates_priorities_on_the_server(tmp_path, make_cluster):
    # A local PrioritizedReplay maps to its Reverb counterpart in a distributed run.
    cluster = make_cluster(tmp_path, 'run.replay_backend = @PrioritizedReplay')
    try:
        start_training(cluster)
        info = reverb.Client(cluster.address).server_info(5)[REPLAY_TABLE]
        assert 'prioritized' in str(info.sampler_options)
        priorities = _sampled_priorities(cluster.address)
        # New windows enter at 1.0; the learner's |TD error| + epsilon replaced some.
        assert np.any(np.abs(priorities - 1.0) > 1e-6), priorities
        assert np.all(priorities > 0)
        counters = common.replay_counters(reverb.Client(cluster.address).server_info(5))
        assert counters['sampled'] > 0
        assert 'ReverbPrioritizedReplay' in open(cluster.log_path('replay')).read()
    finally:
        for name in list(cluster.procs):
            if cluster.alive(name):
                cluster.kill(name)


def test_a_diverging_learner_stops_with_one_line_and_pushes_nothing_non_finite(tmp_path):
    cluster = tiny_dqn_cluster(tmp_path, 'dqn.make_agent.learning_rate = 1e30')
    try:
        cluster.start('replay')
        learner = cluster.start('learn')
        cluster.start('collect', 0)
        wait_until(lambda: not cluster.alive(learner), 'the diverging learner to stop', cluster)
        assert cluster.returncode(learner) != 0
        log = open(cluster.log_path(learner)).read()
        assert 'the learner diverged: train/' in log and 'not finite at train step' in log
        assert 'Traceback' not in log
        pushed = tables.WeightStore(cluster.address, timeout_s=2).pull()
        if pushed is not None:  # whatever reached the collectors is finite
            assert all(np.all(np.isfinite(w)) for w in pushed[0]), 'non-finite weights pushed'
    finally:
        for name in list(cluster.procs):
            if cluster.alive(name):
                cluster.kill(name)
