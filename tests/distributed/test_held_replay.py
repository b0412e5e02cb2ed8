"""Real roles with `distributed.settings.learner_holds_replay`: a queue on the server, the
replay (with its priorities) in the learner and in its checkpoint, a restart resuming it,
a killed server restarting under a learner that trains on.

DQN CartPole shrunk to (8, 8) networks (conftest.tiny_dqn_cluster) on a prioritized
replay: the learner's own store samples by priority and gets the agent's TD errors back,
as a single-process `PrioritizedReplay` does. The store is read back here from the
learner's checkpoint, taken when the learner is stopped.
"""

import os
import signal
import time

import gin
import numpy as np
import pytest
import reverb
import tensorflow as tf

from experiment.distributed.config import REPLAY_TABLE
from tests.distributed.conftest import (
    FAST,
    counters_at,
    pushed_step,
    start_training,
    tiny_dqn_cluster,
    wait_until,
)

pytestmark = [pytest.mark.reverb, pytest.mark.timeout(600)]
HELD = ['distributed.settings.learner_holds_replay = True',
        'run.replay_backend = @PrioritizedReplay']


def _restored_store(cluster):
    """The learner's held replay, restored in this process from its latest checkpoint."""
    from app import cli
    from experiment.distributed import common, config
    from experiment.distributed.held import HeldReplay

    # What tiny_dqn_cluster gives every role.
    cli.load_gin_config(['configs/dqn_cartpole.gin', 'configs/testing/tiny.gin'],
                        FAST + HELD + ['run.num_env_steps = 1000000'])
    try:
        params, settings = config.run_params(), config.settings()
        agent, _, _ = common.build_agent(params, seed=0)
        held = HeldReplay(settings, params, agent, seed=0)
        directory = os.path.join(cluster.root_dir, 'learner', 'checkpoints')
        checkpoint = tf.train.Checkpoint(held_replay=held.checkpoint_items())
        checkpoint.read(tf.train.latest_checkpoint(directory)).expect_partial()
        return held, settings
    finally:
        gin.clear_config()


def test_the_learner_holds_the_replay_feeds_its_priorities_and_resumes_it(tmp_path):
    cluster = tiny_dqn_cluster(tmp_path, *HELD, 'distributed.settings.other_roles_niceness = 19')
    try:
        start_training(cluster)
        # The server only carries windows across: each is sampled once, oldest first.
        info = reverb.Client(cluster.address).server_info(5)[REPLAY_TABLE]
        assert info.max_times_sampled == 1 and 'fifo' in str(info.sampler_options).lower()
        counters = counters_at(cluster.address)
        assert counters['sampled'] > 0 and counters['size'] <= info.max_size
        # Bound niced: the server (only a queue here) and the collector give way to the learner.
        niceness = {name: os.getpriority(os.PRIO_PROCESS, cluster.procs[name][0].pid)
                    for name in ('replay', 'collector_0', 'learner')}
        assert niceness == {'replay': 19, 'collector_0': 19, 'learner': 0}, niceness

        cluster.stop(['learner'])  # SIGINT: it checkpoints, its store included
        assert cluster.returncode('learner') == 0, cluster.tail('learner', 30)
        held, settings = _restored_store(cluster)
        store = held.store.inner
        size = held.size()
        assert size >= settings.min_size_to_sample
        inserted = int(store.metrics()['inserted'])
        priorities = store.priorities(tf.range(inserted - size, inserted, dtype=tf.int64)).numpy()
        # New windows enter at the max priority (1.0 until a larger TD error); the learner's
        # |TD error| + epsilon replaced some.
        assert np.any(np.abs(priorities - 1.0) > 1e-6) and np.all(priorities > 0), priorities
        stopped_at = pushed_step(cluster.address)

        cluster.restart('learner')
        wait_until(lambda: (pushed_step(cluster.address) or 0) >= stopped_at + 40,
                   'the restarted learner to train on', cluster)
        log = open(cluster.log_path('learner')).read().split('starting learner')[-1]
        assert 'resumed from' in log
        # Its store came back whole: it did not wait for the minimum again.
        assert 'windows from the collectors' not in log

        # The server dies (its queue with it) and restarts from its checkpoint: the learner,
        # which holds the replay, rides out the outage and trains on fresh windows after it.
        step_before = pushed_step(cluster.address)
        cluster.kill('replay', signal.SIGKILL)
        time.sleep(5)
        assert cluster.alive('learner') and cluster.alive('collector_0')
        cluster.restart('replay')
        restored = wait_until(lambda: counters_at(cluster.address), 'the server to come back',
                              cluster)
        wait_until(lambda: (counters_at(cluster.address) or {}).get('sampled', 0)
                   > restored['sampled'] + 32, 'the learner to take windows again', cluster)
        wait_until(lambda: (pushed_step(cluster.address) or 0) > step_before + 8,
                   'the learner to train and push to the restarted server', cluster)
        assert cluster.alive('learner') and cluster.alive('collector_0')
    finally:
        for name in list(cluster.procs):
            if cluster.alive(name):
                cluster.kill(name)
