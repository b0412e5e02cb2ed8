"""run.overlap_collection: a collector thread writes replay while the learner samples it."""

import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.environments import tf_py_environment
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory

from agents import dqn
from buffers.base import Capabilities, allow_concurrent_writes
from buffers.frames import FrameStackedReplay
from buffers.prioritized import PrioritizedReplay
from buffers.uniform import UniformReplay
from core.errors import UserError
from envs.suite import make_env
from experiment.loop import FusedLoop

ROWS, WINDOW, GUARD = 16, 3, 8
WIDTH = 5_000  # wide rows make a gather slow enough for writes to land during it


def _spec():
    return trajectory.Trajectory(
        step_type=tf.TensorSpec([], tf.int32), observation=tf.TensorSpec([WIDTH], tf.int64),
        action=tf.TensorSpec([], tf.int64), policy_info=(),
        next_step_type=tf.TensorSpec([], tf.int32), reward=tf.TensorSpec([], tf.float32),
        discount=tf.TensorSpec([], tf.float32))


def _step(index):
    """Step `index`, written in every observation field (a torn row would disagree)."""
    mid = tf.constant([ts.StepType.MID], tf.int32)
    return trajectory.Trajectory(
        step_type=mid, observation=tf.fill([1, WIDTH], tf.cast(index, tf.int64)),
        action=tf.constant([0], tf.int64), policy_info=(), next_step_type=mid,
        reward=tf.zeros([1]), discount=tf.ones([1]))


def test_the_oldest_rows_of_a_full_ring_are_kept_out_of_sampling():
    backend = UniformReplay(_spec(), capacity=ROWS, batch_size=8, num_steps=WINDOW, seed=1)
    backend.allow_concurrent_writes(GUARD)
    for index in range(ROWS + 10):  # full and wrapped: the last ROWS steps are stored
        backend.add(_step(index))
    sample = tf.function(lambda: backend.sample(256, WINDOW))
    starts = np.concatenate([sample()[0].observation[:, 0, 0].numpy() for _ in range(20)])
    oldest_kept = ROWS + 10 - ROWS + GUARD
    assert starts.min() == oldest_kept  # every allowed start is drawn ...
    assert starts.max() == ROWS + 10 - WINDOW  # ... up to the newest whole window
    window, info = sample()
    assert np.allclose(info.probabilities.numpy(), 1 / (ROWS - GUARD - WINDOW + 1))


def test_windows_stay_whole_while_another_thread_writes():
    """A writer thread wraps the ring again and again while windows are sampled."""
    backend = UniformReplay(_spec(), capacity=ROWS, batch_size=8, num_steps=WINDOW, seed=2)
    backend.allow_concurrent_writes(GUARD)
    add = tf.function(lambda index: backend.add(_step(index)))
    for index in range(ROWS):
        add(tf.constant(index, tf.int64))
    sample = tf.function(lambda: backend.sample(32, WINDOW)[0].observation[..., ::1000])
    stop = threading.Event()

    def write():
        index = ROWS
        while not stop.is_set():
            add(tf.constant(index, tf.int64))
            index += 1
            time.sleep(0.0005)  # well under GUARD writes while one batch is gathered

    writer = threading.Thread(target=write)
    writer.start()
    try:
        windows = np.concatenate([sample().numpy() for _ in range(1000)])
    finally:
        stop.set()
        writer.join()
    assert int(backend.metrics()['inserted']) > 3 * ROWS  # the writer really wrapped it
    assert (windows == windows[..., :1]).all()  # no torn row
    assert (np.diff(windows[..., 0], axis=1) == 1).all()  # consecutive steps: no mixed window


def test_backends_that_cannot_be_written_while_sampling_are_refused():
    prioritized = PrioritizedReplay(_spec(), capacity=ROWS, batch_size=8, num_steps=WINDOW)
    with pytest.raises(UserError, match='PrioritizedReplay cannot be written while it samples'):
        allow_concurrent_writes(prioritized, 8)
    with pytest.raises(UserError, match='raise run.replay_capacity'):
        UniformReplay(_spec(), capacity=ROWS, batch_size=8).allow_concurrent_writes(ROWS)

    class NoConcurrency:
        capabilities = Capabilities()

    with pytest.raises(UserError, match='NoConcurrency cannot'):
        allow_concurrent_writes(NoConcurrency(), 8)


def test_frame_stacked_replay_passes_it_to_the_backend_that_stores_the_frames():
    spec = _spec()._replace(observation=tf.TensorSpec([6, 6, 4], tf.uint8))
    frames = FrameStackedReplay(UniformReplay, spec, num_frames=4, capacity=ROWS, batch_size=8)
    frames.allow_concurrent_writes(GUARD)
    assert frames.inner._write_guard == GUARD
    stacked_prioritized = FrameStackedReplay(PrioritizedReplay, spec, num_frames=4,
                                             capacity=ROWS, batch_size=8)
    with pytest.raises(UserError, match='PrioritizedReplay cannot'):
        stacked_prioritized.allow_concurrent_writes(GUARD)


def test_an_overlapped_iteration_collects_and_trains_a_whole_chunk_each():
    tf.random.set_seed(0)
    tf_env = tf_py_environment.TFPyEnvironment(make_env('CartPole-v1', num_envs=2, seed=0))
    agent = dqn.make_agent(tf_env.time_step_spec(), tf_env.action_spec(),
                           tf.Variable(0, dtype=tf.int64), fc_layer_params=(8,))
    backend = UniformReplay(agent.collect_data_spec, capacity=400, num_envs=2, batch_size=8)
    backend.allow_concurrent_writes(16)
    env_steps = tf.Variable(0, dtype=tf.int64)
    loop = FusedLoop(agent=agent, tf_env=tf_env, backend=backend, observers=[],
                     env_steps=env_steps, batch_size=8, num_steps=2, train_steps=5,
                     use_xla=False, overlap_collection=True)
    loop.collect_random(tf.constant(16, tf.int32))
    for _ in range(3):
        diagnostics = loop.iterate(tf.constant(16, tf.int32))
    assert int(env_steps.numpy()) == 4 * 16 * 2  # warm-up + 3 chunks, both copies
    assert int(backend.metrics()['size']) == 4 * 16 * 2
    assert int(agent.train_step_counter.numpy()) == 3 * 5
    assert np.isfinite(float(diagnostics['loss']))
    assert threading.active_count() >= 2  # the collector thread stays for the next chunk

