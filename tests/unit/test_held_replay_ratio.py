"""A learner that holds the replay: its window store and the ratio it keeps while draining.

`WindowStore` (buffers/windows.py) keeps whole windows and samples them as
`UniformReplay`/`PrioritizedReplay` sample steps; `HeldReplay`
(experiment/distributed/held.py) moves windows from the server's queue into it at the
run's samples-per-insert ratio. The queue here is a tf.data stand-in that counts what
was taken from it; the real roles are in tests/distributed/test_held_replay.py.
"""

import time
import types

import numpy as np
import pytest
import tensorflow as tf

from buffers.prioritized import PrioritizedReplay
from buffers.uniform import UniformReplay
from buffers.windows import WindowStore
from core.errors import UserError
from experiment.distributed import config
from experiment.distributed.held import HeldReplay

SPEC = {'observation': tf.TensorSpec([3], tf.float32), 'step': tf.TensorSpec([], tf.int64)}


def _windows(first, count, num_steps=2):
    """`count` windows numbered from `first`: window i holds steps (i, i + 1, ...)."""
    ids = np.arange(first, first + count)[:, None] + np.arange(num_steps)[None, :]
    return {'observation': np.repeat(ids[..., None], 3, -1).astype(np.float32),
            'step': ids.astype(np.int64)}


class _Queue:
    """Stands in for the learner's `ReverbWindowQueue`: `total` numbered windows, then the end
    of the dataset (what a timeout on an empty queue looks like)."""

    def __init__(self, total):
        self.total = total
        self.served = 0

    def as_dataset(self, batch_size, num_steps):
        def windows():
            while self.served + batch_size <= self.total:
                self.served += batch_size
                yield _windows(self.served - batch_size, batch_size, num_steps), 0
        signature = (tf.nest.map_structure(
            lambda s: tf.TensorSpec([batch_size, num_steps, *s.shape], s.dtype), SPEC),
            tf.TensorSpec([], tf.int32))
        return tf.data.Dataset.from_generator(windows, output_signature=signature)


def _agent(priorities=False):
    return types.SimpleNamespace(collect_data_spec=SPEC, train_sequence_length=None,
                                 sequence_period=None, gives_priorities=priorities)


def _held(*, min_size, run_windows, spi=4.0, batch=8, steps_per_call=2, backend=UniformReplay,
          frame_stack=1):
    settings = types.SimpleNamespace(learner_steps_per_call=steps_per_call,
                                     samples_per_insert=spi, min_size_to_sample=min_size)
    params = types.SimpleNamespace(batch_size=batch, replay_capacity=64, frame_stack=frame_stack,
                                   replay_backend=backend, num_env_steps=run_windows)
    return HeldReplay(settings, params, _agent(backend is PrioritizedReplay), seed=1)


def test_the_store_samples_the_windows_it_was_given():
    store = WindowStore(UniformReplay, SPEC, capacity=16, windows_per_add=4, batch_size=8,
                        num_steps=2)
    store.add(_windows(100, 4))
    windows, info = store.sample(8, 2)
    steps = windows['step'].numpy()
    assert steps.shape == (8, 2) and windows['observation'].shape == (8, 2, 3)
    assert set(steps[:, 0]) <= {100, 101, 102, 103}
    np.testing.assert_array_equal(steps[:, 1], steps[:, 0] + 1)  # whole windows, as given
    np.testing.assert_allclose(info.probabilities.numpy(), 0.25)
    assert store.capabilities.xla and not store.capabilities.priorities


def test_a_prioritized_store_samples_by_the_priorities_it_is_given():
    store = WindowStore(PrioritizedReplay, SPEC, capacity=16, windows_per_add=4, batch_size=8,
                        num_steps=2)
    assert store.capabilities.priorities
    store.add(_windows(0, 4))
    store.update_priorities(tf.constant([0, 1, 2, 3], tf.int64),
                            tf.constant([0.0, 0.0, 0.0, 50.0]))
    windows, _ = store.sample(64, 2)
    # Window 3 holds nearly all the mass: alpha 0.6 of 50 against epsilon.
    assert np.mean(windows['step'].numpy()[:, 0] == 3) > 0.95


def test_the_learner_fills_to_the_minimum_then_drains_at_the_runs_ratio():
    # 2 steps x batch 8 = 16 samples per call; 4 samples per window -> 4 windows a drain.
    held = _held(min_size=8, run_windows=40)
    queue = _Queue(total=1000)
    held.open(queue)
    assert held.windows_per_drain == 4
    while not held.fill_step():
        pass
    assert queue.served >= 8 and held.size() == 8 and held.credit.numpy() == 0
    calls = 0
    for _ in range(20):
        held.ready_for_call()
        calls += 1
        held.settle()  # the next call's drain, taken in while this one trains
        taken = int(held.taken.numpy())
        # Never more than the run collects, whatever the calls ask.
        assert taken <= 40
        if taken < 40:
            # One drain per call (16 samples / 4 per window), and one drain ahead.
            assert taken == 8 + 4 * (calls + 1)
    assert int(held.taken.numpy()) == 40


def test_the_next_drain_is_taken_on_another_thread_while_the_call_trains():
    held = _held(min_size=8, run_windows=1000)
    queue = _Queue(total=1000)
    held.open(queue)
    while not held.fill_step():
        pass
    assert held.takes_ahead
    held.ready_for_call()  # the first call takes its own drain, then starts the next one's
    held.settle()
    assert int(held.taken.numpy()) == 16
    held.lock.acquire()  # as a checkpoint being saved: a drain received waits to be stored
    try:
        held.ready_for_call()  # its credit is there: it only starts the next drain
        time.sleep(0.5)  # ample for the thread to receive it
        assert int(held.taken.numpy()) == 16 and held.size() == 16  # not stored meanwhile
    finally:
        held.lock.release()
    held.settle()
    assert int(held.taken.numpy()) == 20 and held.size() == 20


def test_a_drain_ahead_that_failed_raises_at_the_next_call_and_stores_nothing():
    held = _held(min_size=8, run_windows=1000)
    held.open(_Queue(total=12))  # the fill (8) and one drain (4); the drain ahead finds none
    while not held.fill_step():
        pass
    held.ready_for_call()
    with pytest.raises(tf.errors.OutOfRangeError):
        held.ready_for_call()
    assert int(held.taken.numpy()) == 12 and held.size() == 12


def test_a_prioritized_store_takes_its_drains_between_calls():
    held = _held(min_size=8, run_windows=1000, backend=PrioritizedReplay)
    held.open(_Queue(total=1000))
    while not held.fill_step():
        pass
    assert not held.takes_ahead  # its sum tree cannot be written while it samples
    held.ready_for_call()
    time.sleep(0.5)  # a drain ahead would have been stored by now
    assert int(held.taken.numpy()) == 12


def test_windows_past_the_minimum_earn_credit_from_the_first_drain_on():
    held = _held(min_size=10, run_windows=1000)  # 3 drains of 4 reach it: 2 windows extra
    held.open(_Queue(total=1000))
    while not held.fill_step():
        pass
    assert int(held.taken.numpy()) == 12 and held.credit.numpy() == 2 * 4.0


def test_an_empty_queue_ends_the_drain_with_the_datasets_error():
    held = _held(min_size=8, run_windows=1000)
    held.open(_Queue(total=4))
    assert not held.fill_step()
    with pytest.raises(tf.errors.OutOfRangeError):
        held.fill_step()


def test_frames_are_refused_in_one_line():
    with pytest.raises(UserError, match='learner_holds_replay cannot be used here.*frames'):
        _held(min_size=8, run_windows=40, frame_stack=4)


def test_the_drain_size_is_one_calls_samples_at_the_ratio():
    settings = types.SimpleNamespace(learner_steps_per_call=64, samples_per_insert=256.0)
    assert config.windows_per_drain(settings, types.SimpleNamespace(batch_size=256)) == 64
    settings = types.SimpleNamespace(learner_steps_per_call=128, samples_per_insert=32.0)
    assert config.windows_per_drain(settings, types.SimpleNamespace(batch_size=64)) == 256
