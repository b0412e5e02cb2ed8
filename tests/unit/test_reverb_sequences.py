"""Sequence replay on Reverb: the same sequences, start states and keys as in process, each step
stored once in Reverb's chunks, priorities routed back."""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.environments import tf_py_environment

from agents import dqn
from buffers.reverb_replay import ReverbPrioritizedSequenceReplay, ReverbSequenceReplay
from buffers.sequence import PrioritizedSequenceReplay
from core.errors import UserError
from envs.suite import make_env
from experiment.loop import Collection

NUM_ENVS, PERIOD, STEPS = 3, 2, 60


@pytest.fixture(scope='module')
def filled():
    py_env = make_env('CartPole-v1', num_envs=NUM_ENVS, hidden_observations=(1, 3), seed=7)
    tf_env = tf_py_environment.TFPyEnvironment(py_env)
    agent = dqn.make_agent(tf_env.time_step_spec(), tf_env.action_spec(),
                           tf.Variable(0, dtype=tf.int64), fc_layer_params=(8,), lstm_size=(6,),
                           burn_in_steps=2, trace_length=4, sequence_period=PERIOD,
                           n_step_update=2, epsilon_start=0.5)
    length = agent.train_sequence_length
    options = dict(capacity=600, period=PERIOD, num_envs=NUM_ENVS, batch_size=8,
                   num_steps=length)
    reverb_backend = ReverbPrioritizedSequenceReplay(agent.collect_data_spec, **options)
    in_process = PrioritizedSequenceReplay(agent.collect_data_spec, **options)
    rows = []
    collection = Collection(tf_env=tf_env, collect_policy=agent.collect_policy,
                            observers=[reverb_backend.add, in_process.add, rows.append],
                            env_steps=tf.Variable(0, dtype=tf.int64))
    collection.run_policy(collection.collect_policy, STEPS)
    yield agent, reverb_backend, in_process, rows
    reverb_backend.close()


def test_the_same_sequences_as_in_process(filled):
    agent, reverb_backend, in_process, _ = filled
    length = agent.train_sequence_length
    leaves = in_process._tree.numpy()[in_process._num_leaves:]
    complete = (STEPS - length + 1) * NUM_ENVS
    assert reverb_backend.metrics()['sequences'] == (leaves[:complete] > 0).sum() > 0
    assert reverb_backend.metrics()['size'] == STEPS * NUM_ENVS


def test_sampled_sequences_hold_their_steps_and_start_state(filled):
    agent, reverb_backend, _, rows = filled
    length = agent.train_sequence_length
    experience, info = reverb_backend.sample(16, length)
    ids = np.asarray(reverb_backend._reader.first_ids(info.keys), np.int64)
    for row, key in enumerate(ids):
        step, env = divmod(int(key), NUM_ENVS)
        np.testing.assert_array_equal(
            experience.observation.numpy()[row],
            np.stack([rows[step + i].observation.numpy()[env] for i in range(length)]))
        for stored, recorded in zip(tf.nest.flatten(experience.policy_info),
                                    tf.nest.flatten(rows[step].policy_info)):
            np.testing.assert_array_equal(stored.numpy()[row, 0], recorded.numpy()[env])
            np.testing.assert_array_equal(stored.numpy()[row, -1], recorded.numpy()[env])


def test_priorities_reach_the_sampled_sequences(filled):
    agent, reverb_backend, _, _ = filled
    experience, info = reverb_backend.sample(8, agent.train_sequence_length)
    loss_info = agent.train(experience, weights=tf.ones([8]))
    reverb_backend.update_priorities(info.keys, agent.sample_priorities(loss_info))
    expected = agent.sample_priorities(loss_info).numpy() + 1e-6
    assert reverb_backend._max_priority.numpy() == pytest.approx(max(1.0, expected.max()))


def test_the_table_keeps_capacity_over_period_sequences(filled):
    _, reverb_backend, _, _ = filled
    info = reverb_backend.table_info()
    assert info.max_size == 600 // PERIOD


def test_a_feed_forward_spec_is_refused(filled):
    agent, _, _, _ = filled
    spec = agent.collect_data_spec._replace(policy_info=())
    with pytest.raises(UserError, match='recurrent agent'):
        ReverbSequenceReplay(spec, capacity=100, period=2, num_steps=4)
