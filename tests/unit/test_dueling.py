"""The dueling Q-network (agents/networks.py) and `dqn.make_agent.dueling`."""

import numpy as np
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory

from agents import dqn
from agents.networks import DuelingQNetwork
from core.export import export_policy

FRAMES = tensor_spec.TensorSpec([12, 12, 2], tf.uint8, name='observation')
ACTIONS = tensor_spec.BoundedTensorSpec([], tf.int64, minimum=0, maximum=3, name='action')


def _frames(batch, seed=0):
    return tf.constant(np.random.default_rng(seed).integers(0, 256, (batch, 12, 12, 2)),
                       tf.uint8)


def _agent(**kwargs):
    return dqn.make_agent(ts.time_step_spec(FRAMES), ACTIONS,
                          tf.Variable(0, dtype=tf.int64), conv_layer_params=((4, 3, 2),),
                          fc_layer_params=(16,), **kwargs)


def test_q_is_value_plus_advantage_minus_its_mean():
    network = DuelingQNetwork(FRAMES, ACTIONS, conv_layer_params=((4, 3, 2),),
                              fc_layer_params=(16,),
                              preprocessing_layers=tf.keras.layers.Rescaling(1 / 255))
    frames = _frames(5)
    q_values, _ = network(frames)
    assert q_values.shape == (5, 4)
    state, _ = network._encoder(frames)
    value = network._value_head(state)
    advantage = network._advantage_head(state)
    # The mean over actions of Q is V: the heads are identifiable.
    np.testing.assert_allclose(tf.reduce_mean(q_values, -1), value[:, 0], atol=1e-5)
    np.testing.assert_allclose(q_values - value, advantage - tf.reduce_mean(
        advantage, -1, keepdims=True), atol=1e-5)
    np.testing.assert_array_equal(tf.argmax(q_values, -1), tf.argmax(advantage, -1))


def test_dueling_agent_trains_its_heads_keeps_a_separate_target_and_exports(tmp_path):
    agent = _agent(dueling=True, n_step_update=2, learning_rate=1e-2)
    network = agent._q_network
    assert isinstance(network, DuelingQNetwork)
    assert isinstance(agent._target_q_network, DuelingQNetwork)
    assert agent._target_q_network is not network
    heads = network._value_head.kernel, network._advantage_head.kernel
    before = [tf.identity(kernel) for kernel in heads]

    batch, steps = 8, 3
    experience = trajectory.Trajectory(
        step_type=tf.fill([batch, steps], ts.StepType.MID),
        observation=tf.reshape(_frames(batch * steps, seed=1), [batch, steps, 12, 12, 2]),
        action=tf.zeros([batch, steps], tf.int64),
        policy_info=(),
        next_step_type=tf.fill([batch, steps], ts.StepType.MID),
        reward=tf.ones([batch, steps]),
        discount=tf.ones([batch, steps]))
    loss = agent.train(experience).loss
    assert np.isfinite(loss.numpy())
    assert all(not np.allclose(old, new) for old, new in zip(before, heads))

    # The exported policy is plain TensorFlow: it takes the frames and returns the
    # argmax of the advantages.
    export_policy(agent.policy, str(tmp_path / 'policy'), agent.train_step_counter)
    loaded = tf.saved_model.load(str(tmp_path / 'policy'))
    frames = _frames(3, seed=2)
    step = ts.restart(frames, batch_size=3)
    q_values, _ = network(frames)
    np.testing.assert_array_equal(loaded.action(step).action, tf.argmax(q_values, -1))


def test_a_plain_agent_keeps_tf_agents_q_network():
    assert not isinstance(_agent()._q_network, DuelingQNetwork)
