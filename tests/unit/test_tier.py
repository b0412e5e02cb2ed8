"""The replay tier of a sharded run: counters summed over shards, a dead shard counted with what
it last reported, and which shards are local."""

import socket

import pytest
import tensorflow as tf

from buffers.reverb_replay import ReverbUniformReplay
from experiment.distributed import tier
from experiment.replay import REPLAY_TABLE

pytestmark = pytest.mark.reverb

SPEC = {'t': tf.TensorSpec([], tf.int64)}


def _shard(steps):
    shard = ReverbUniformReplay(SPEC, capacity=100, num_envs=1, batch_size=1, num_steps=2,
                                table_name=REPLAY_TABLE)
    for t in range(steps):
        shard.add({'t': tf.constant([t], tf.int64)})
    shard.metrics()  # flushes
    return shard


def test_counters_add_up_and_a_dead_shard_counts_with_its_last_report():
    shards = [_shard(11), _shard(31)]  # 10 and 30 windows
    try:
        replay = tier.ReplayTier([s.server_address for s in shards], timeout_s=1)
        assert replay.weights_address == shards[0].server_address
        total = replay.counters()
        assert (total['size'], total['inserted'], total['shards_down']) == (40, 40, 0)
        shards[1].close()  # its server stops
        per_shard = replay.shard_counters()
        assert per_shard[0]['size'] == 10 and per_shard[1] is None
        total = replay.counters()
        assert total['inserted'] == 40  # shard 1 as it last reported
        assert total['shards_down'] == 1  # so collectors leave the ratio to the learner
        fresh = tier.ReplayTier([s.server_address for s in shards], timeout_s=1)
        with pytest.raises(Exception, match='did not answer'):
            fresh.counters()  # never heard from shard 1: no guess
    finally:
        for shard in shards:
            shard.close()


def test_shards_on_this_machine_are_local():
    replay = tier.ReplayTier(['localhost:1', '127.0.0.1:2', 'elsewhere.example:3'], timeout_s=1)
    assert replay.local_shards() == [True, True, False]
    assert 'replay shards at localhost:1, 127.0.0.1:2' in replay.describe()


def test_a_failed_reverb_write_is_logged_on_one_line_without_its_traceback():
    from experiment.distributed.waiting import one_line

    error = tf.errors.UnknownError(
        None, None, '{{function_node __inference_<lambda>_1545}} DeadlineExceededError: Flush '
        'call did not complete within provided timeout of 0:00:10\nTraceback (most recent '
        'call last):\n  File "reverb/trajectory_writer.py", line 1')
    assert one_line(error) == ('UnknownError: DeadlineExceededError: Flush call did not '
                               'complete within provided timeout of 0:00:10')


class _CountingClient:
    """A Reverb client that counts its `server_info` calls."""

    def __init__(self, client):
        self.client, self.calls = client, 0

    def server_info(self, timeout_s):
        self.calls += 1
        return self.client.server_info(timeout_s)


def test_a_dead_shard_is_not_asked_again_until_its_port_accepts_connections():
    """A Reverb call to a server that is gone waits its whole deadline (gRPC retries a
    refused connection), so reading a dead shard at every weight pull slowed the
    collectors to an eighth of their rate: it is asked once, then only when it listens."""
    shards = [_shard(11), _shard(31)]
    try:
        replay = tier.ReplayTier([s.server_address for s in shards], timeout_s=1)
        replay.counters()
        dead = replay._clients[1] = _CountingClient(replay._clients[1])
        shards[1].close()
        for _ in range(5):
            assert replay.shard_counters()[1] is None
        assert dead.calls == 1  # the read that found it down
        host, _, port = shards[1].server_address.rpartition(':')
        with socket.create_server((host.strip('[]'), int(port))):  # something listens again
            assert replay.shard_counters()[1] is None  # not Reverb: still down ...
        assert dead.calls == 2  # ... but it was asked
    finally:
        shards[0].close()
