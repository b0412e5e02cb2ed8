"""Batches drawn ahead of the step that uses them change nothing: run.sample_ahead (the next
batch sampled while a gradient step runs) and the distributed learner's stacked chunks (every
batch of a chunk drawn before it starts, the chunk compiled without a sampling op)."""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory

from agents import dqn
from buffers.uniform import UniformReplay
from experiment.loop import Training

BATCH, STEPS = 8, 5


def _trained(sample_ahead, stacked=False):
    tf.random.set_seed(0)
    observation = tensor_spec.BoundedTensorSpec([3], tf.float32, -1, 1)
    action = tensor_spec.BoundedTensorSpec([], tf.int64, 0, 1)
    agent = dqn.make_agent(ts.time_step_spec(observation), action,
                           tf.Variable(0, dtype=tf.int64), fc_layer_params=(8,))
    backend = UniformReplay(agent.collect_data_spec, capacity=200, batch_size=BATCH, seed=3)
    rng = np.random.default_rng(0)
    for t in range(100):
        backend.add(trajectory.Trajectory(
            step_type=tf.constant([ts.StepType.MID], tf.int32),
            observation=tf.constant(rng.uniform(-1, 1, [1, 3]), tf.float32),
            action=tf.constant([t % 2], tf.int64), policy_info=(),
            next_step_type=tf.constant([ts.StepType.MID], tf.int32),
            reward=tf.constant([float(t % 3)]), discount=tf.ones([1])))
    training = Training(agent=agent, backend=backend, batch_size=BATCH, num_steps=2,
                        train_steps=STEPS, use_xla=False, sample_ahead=sample_ahead)
    if not stacked:
        return agent, backend, training.train()
    # The learner's way: a dataset of batches, stacked STEPS at a time, trained in one call.
    batches = [backend.sample(BATCH, 2) for _ in range(STEPS)]
    dataset = training.stacked_dataset(
        tf.data.Dataset.from_tensors(batches[0]).concatenate(
            tf.data.Dataset.from_tensor_slices(
                tf.nest.map_structure(lambda *x: tf.stack(x), *batches[1:]))))
    chunk = next(iter(dataset))
    training.trace_stacked(dataset.element_spec)
    return agent, backend, training.train_stacked(chunk)


def test_sampling_ahead_trains_on_the_same_batches_in_the_same_order():
    plain, plain_backend, plain_diagnostics = _trained(False)
    ahead, ahead_backend, ahead_diagnostics = _trained(True)
    assert int(ahead.train_step_counter.numpy()) == STEPS
    for a, b in zip(plain.trainable_variables, ahead.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert float(plain_diagnostics['loss']) == float(ahead_diagnostics['loss'])
    assert plain_backend.metrics()['sampled'] == ahead_backend.metrics()['sampled'] == \
        STEPS * BATCH


def test_a_stacked_chunk_trains_exactly_as_the_sampling_chunk_on_the_same_batches():
    plain, plain_backend, plain_diagnostics = _trained(False)
    stacked, stacked_backend, stacked_diagnostics = _trained(False, stacked=True)
    assert int(stacked.train_step_counter.numpy()) == STEPS
    for a, b in zip(plain.trainable_variables, stacked.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)
    assert float(stacked_diagnostics['loss']) == pytest.approx(
        float(plain_diagnostics['loss']), rel=1e-6)
    assert stacked_diagnostics['all_finite']
    assert stacked_backend.metrics()['sampled'] == plain_backend.metrics()['sampled']


def test_the_weight_norm_diagnostic_counts_weights_not_the_step_counter():
    agent, _, diagnostics = _trained(False)
    agent.train_step_counter.assign(10**6)  # an int64 tf.Variable, trainable by TF's default
    training = Training(agent=agent, backend=_trained(False)[1], batch_size=BATCH, num_steps=2,
                        train_steps=1, use_xla=False)
    norm = float(training.train()['weight_norm'])
    weights = [v.numpy() for v in agent.trainable_variables if v.dtype.is_floating]
    assert norm == pytest.approx(np.sqrt(sum((w.astype(np.float64) ** 2).sum()
                                             for w in weights)), rel=1e-4)
    assert norm < 1e3
