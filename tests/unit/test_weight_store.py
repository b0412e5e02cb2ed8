"""The weight hand-off: a pull brings each push once, and nothing while no new push landed."""

import numpy as np
import pytest
import reverb
import tensorflow as tf

from experiment.distributed import tables

WEIGHTS = [tf.zeros([3, 2]), tf.zeros([2])]


@pytest.fixture
def address():
    server = reverb.Server([tables.variables_table(WEIGHTS)], port=None)
    yield f'localhost:{server.port}'
    server.stop()


def _weights(value):
    return [np.full([3, 2], value, np.float32), np.full([2], value, np.float32)]


def test_a_pull_brings_each_push_once(address):
    learner, collector = (tables.WeightStore(address, timeout_s=5) for _ in range(2))
    assert collector.pull() is None  # nothing pushed yet
    learner.push(_weights(1.0), 10)
    values, step = collector.pull()
    assert step == 10
    np.testing.assert_array_equal(values[0], _weights(1.0)[0])
    assert collector.pull() is None  # the same weights: not transferred again
    learner.push(_weights(2.0), 20)
    values, step = collector.pull()
    assert step == 20
    np.testing.assert_array_equal(values[1], _weights(2.0)[1])
    # Every store keeps its own count: a new one (a restarted collector) pulls at once.
    assert tables.WeightStore(address, timeout_s=5).pull()[1] == 20


def test_a_server_without_the_weights_table_is_refused_in_one_line_naming_it():
    from core.errors import UserError

    other = reverb.Server([reverb.Table.queue('somebody_elses', 10)], port=None)
    try:
        with pytest.raises(UserError, match=f"localhost:{other.port} has no 'variables' table"):
            tables.WeightStore(f'localhost:{other.port}', timeout_s=5).pull()
    finally:
        other.stop()
