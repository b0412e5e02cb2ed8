"""Pixels across processes: collectors write single LZ4 frames to the Reverb server, the
learner samples frame stacks from it (real roles, the tiny Pong config)."""

import os

import pytest

from experiment.distributed import common, tables
from experiment.distributed.cluster import Cluster, free_port
from tests.distributed.conftest import FAST, ROOT, pushed_step, wait_until

pytestmark = [pytest.mark.reverb, pytest.mark.timeout(600)]


@pytest.mark.parametrize('shards', [1, 2])
def test_collectors_write_frames_and_the_learner_trains_on_stacks(tmp_path, shards):
    os.chdir(ROOT)
    cluster = Cluster(
        gin_files=['configs/dqn_atari.gin', 'configs/testing/tiny_pixels.gin'],
        gin_bindings=FAST + ['run.num_env_steps = 1000000',
                             f'distributed.settings.replay_shards = {shards}'],
        root_dir=str(tmp_path / 'run'), port=free_port(), bind_all_interfaces=True,
        shards=shards)
    try:
        for shard in range(shards):
            cluster.start('replay', shard)
        learner = cluster.start('learn')
        collector = cluster.start('collect', 0)
        weights = cluster.shard_addresses[0]
        wait_until(lambda: (pushed_step(weights) or 0) >= 40,
                   'the learner to push weights after 40 gradient steps', cluster)
        for address in cluster.shard_addresses:  # with 2 shards, frames in both, both sampled
            counters = common.replay_counters(tables.WeightStore(
                address, timeout_s=5).server_info())
            assert counters['inserted'] > 0 and counters['sampled'] > 0, (address, counters)
        assert cluster.alive(collector) and cluster.alive(learner)
        for name in (collector, learner):
            assert 'Traceback' not in open(cluster.log_path(name)).read()
    finally:
        for name in list(cluster.procs):
            if cluster.alive(name):
                cluster.kill(name)
