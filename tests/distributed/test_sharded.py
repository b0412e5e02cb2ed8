"""Sharded replay with real roles (tiny DQN CartPole, prioritized): two replay shards, two
collectors and the learner. Both shards fill evenly and are sampled, priorities reach both,
and a shard killed with SIGKILL stalls nobody: the learner samples the other, the collectors
write there, and the restarted shard restores its checkpoint and is sampled again."""

import signal

import numpy as np
import pytest
import reverb

from tests.distributed.conftest import counters_at, pushed_step, tiny_dqn_cluster, wait_until

pytestmark = [pytest.mark.reverb, pytest.mark.timeout(900)]


def _priorities(address, draws=64):
    """Priorities of `draws` windows sampled straight from a shard's table (the shard's rate
    limiter counts them too, so a few, granted as the collectors insert)."""
    from experiment.replay import REPLAY_TABLE

    dataset = reverb.TrajectoryDataset.from_table_signature(
        address, REPLAY_TABLE, max_in_flight_samples_per_worker=8,
        rate_limiter_timeout_ms=30_000, max_samples=draws)
    return np.concatenate([sample.info.priority.numpy() for sample in dataset.batch(8)])


def test_two_shards_fill_evenly_are_both_sampled_and_survive_a_shard_kill(tmp_path):
    cluster = tiny_dqn_cluster(tmp_path, 'distributed.settings.replay_shards = 2',
                               'run.replay_backend = @PrioritizedReplay', shards=2)
    first, second = cluster.shard_addresses
    try:
        replay = [cluster.start('replay', shard) for shard in range(2)]
        assert replay == ['replay_0', 'replay_1']
        wait_until(lambda: counters_at(first) and counters_at(second), 'both shards to answer',
                   cluster)
        learner = cluster.start('learn')
        collectors = [cluster.start('collect', i) for i in range(2)]
        wait_until(lambda: (pushed_step(first) or 0) >= 200,
                   'the learner to train 200 steps over both shards', cluster)
        shards = [counters_at(first), counters_at(second)]
        inserted = [shard['inserted'] for shard in shards]
        # Balanced writes (whole weight-pull stretches of 16 steps move at a time).
        assert min(inserted) > 0.8 * max(inserted), inserted
        # The learner samples both, and its priorities reach both (new windows enter at the
        # largest priority seen by their collector, 1.0; updated ones differ).
        assert all(shard['sampled'] > 0 for shard in shards), shards
        for address in (first, second):
            assert np.mean(_priorities(address) != 1.0) > 0.2, address
        for name in replay:
            assert 'shard' in open(cluster.log_path(name)).read()

        # Shard 1 dies: the learner keeps training on shard 0, the collectors write there.
        wait_until(lambda: 'final checkpoint' in open(cluster.log_path('replay_1')).read()
                   or _has_checkpoint(tmp_path), 'a checkpoint of shard 1', cluster)
        cluster.kill('replay_1', signal.SIGKILL)
        step = pushed_step(first)
        before = counters_at(first)['inserted']
        wait_until(lambda: (pushed_step(first) or 0) >= step + 100,
                   'the learner to train on with one shard down', cluster)
        wait_until(lambda: counters_at(first)['inserted'] > before + 200,
                   'the collectors to write to the live shard', cluster)
        assert 'does not answer' in open(cluster.log_path(learner)).read()
        assert all(cluster.alive(name) for name in [learner, *collectors])

        # It comes back from its checkpoint and is sampled again.
        cluster.restart('replay_1')
        wait_until(lambda: counters_at(second), 'shard 1 to restart', cluster)
        log = open(cluster.log_path('replay_1')).read().split('starting replay_1')[-1]
        assert 'restored' in log
        wait_until(lambda: 'answers again' in open(cluster.log_path(learner)).read(),
                   'the learner to see shard 1 back', cluster)
        # More than the dataset it left behind could still draw (its requests in flight).
        sampled = counters_at(second)['sampled']
        wait_until(lambda: (counters_at(second) or {'sampled': 0})['sampled'] > sampled + 1000,
                   'the learner to sample the restarted shard', cluster)
        for name in [learner, *collectors]:
            assert cluster.alive(name)
            assert 'Traceback' not in open(cluster.log_path(name)).read()
    finally:
        for name in list(cluster.procs):
            if cluster.alive(name):
                cluster.kill(name)


def _has_checkpoint(tmp_path):
    return any((tmp_path / 'run' / 'replay_1' / 'reverb').glob('ckpt-*/DONE'))


def test_a_shard_with_a_damaged_checkpoint_starts_empty_with_one_line(tmp_path):
    cluster = tiny_dqn_cluster(tmp_path, 'distributed.settings.replay_shards = 2', shards=2)
    damaged = tmp_path / 'run' / 'replay_1' / 'reverb' / 'ckpt-000003'
    damaged.mkdir(parents=True)
    for name in ('tables.tfrecord', 'chunks.tfrecord'):
        (damaged / name).write_bytes(b'not a reverb checkpoint' * 10)
    (damaged / 'DONE').write_text('')
    try:
        cluster.start('replay', 1)
        wait_until(lambda: counters_at(cluster.shard_addresses[1]) is not None,
                   'the shard to serve', cluster)
        assert counters_at(cluster.shard_addresses[1])['size'] == 0
        log = open(cluster.log_path('replay_1')).read()
        assert log.count('starting this shard empty') == 1, log
        assert 'Traceback' not in log
        assert (damaged.parent / 'ckpt-000003.damaged').is_dir() and not damaged.exists()
    finally:
        for name in list(cluster.procs):
            if cluster.alive(name):
                cluster.kill(name)


def test_shards_stay_balanced_with_one_collector_three_times_slower(tmp_path):
    """Two collectors step 3 env copies each, one steps 1 (a third of their windows per
    step); every collector chooses its shard at each weight pull (16 env steps here)."""
    cluster = tiny_dqn_cluster(tmp_path, 'distributed.settings.replay_shards = 2', shards=2)
    try:
        for shard in range(2):
            cluster.start('replay', shard)
        wait_until(lambda: all(counters_at(a) for a in cluster.shard_addresses),
                   'both shards to answer', cluster)
        cluster.start('learn')
        for index, copies in enumerate((3, 3, 1)):
            cluster.start('collect', index, bindings=[f'make_env.num_envs = {copies}'])

        def inserted():
            counters = [counters_at(address) for address in cluster.shard_addresses]
            return None if None in counters else [c['inserted'] for c in counters]

        wait_until(lambda: sum(inserted() or [0]) >= 3000, '3,000 windows written', cluster)
        sizes = inserted()
        assert min(sizes) >= 0.9 * max(sizes), sizes
        for index, copies in enumerate((3, 3, 1)):  # all three wrote, with their copies
            assert f'({copies} envs,' in open(cluster.log_path(f'collector_{index}')).read()
    finally:
        for name in list(cluster.procs):
            if cluster.alive(name):
                cluster.kill(name)

