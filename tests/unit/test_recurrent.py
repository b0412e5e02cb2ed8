"""Recurrent DQN (R2D2) and sequence replay: episode masks, stored start states, burn-in,
the eta priority rule, the n-step targets, and state carried by collection and evaluation."""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.environments import tf_py_environment
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory as trajectory_lib

from agents import dqn, r2d2, recurrent
from buffers.sequence import PrioritizedSequenceReplay, SequenceReplay
from core.errors import UserError
from envs.suite import make_env
from experiment.evaluation import greedy_actor, play_episodes
from experiment.loop import Collection

BURN_IN, TRACE, PERIOD, N_STEP = 2, 4, 2, 2
LENGTH = BURN_IN + TRACE + N_STEP
NUM_ENVS = 3


@pytest.fixture(scope='module')
def setup():
    """A tiny R2D2 agent on masked CartPole, and 200 steps collected into sequence replay."""
    py_env = make_env('CartPole-v1', num_envs=NUM_ENVS, hidden_observations=(1, 3), seed=7)
    tf_env = tf_py_environment.TFPyEnvironment(py_env)
    train_step = tf.Variable(0, dtype=tf.int64)
    agent = dqn.make_agent(tf_env.time_step_spec(), tf_env.action_spec(), train_step,
                           fc_layer_params=(8,), lstm_size=(6,), output_fc_layer_params=(8,),
                           burn_in_steps=BURN_IN, trace_length=TRACE, sequence_period=PERIOD,
                           n_step_update=N_STEP, epsilon_start=0.5)
    buffer = PrioritizedSequenceReplay(agent.collect_data_spec, capacity=600, period=PERIOD,
                                       num_envs=NUM_ENVS, batch_size=8, num_steps=LENGTH,
                                       seed=3, alpha=0.6)
    rows = []
    collection = Collection(tf_env=tf_env, collect_policy=agent.collect_policy,
                            observers=[buffer.add, rows.append],
                            env_steps=tf.Variable(0, dtype=tf.int64))
    # Eager, so that every collected row can be compared with what the buffer returns; two
    # chunks, so that the state carried from one chunk to the next is checked too.
    collection.run_policy(collection.collect_policy, 100)
    collection.run_policy(collection.collect_policy, 50)
    return agent, buffer, rows, collection


def _stacked(rows):
    return tf.nest.map_structure(lambda *steps: np.stack([s.numpy() for s in steps]), *rows)


def test_sequences_start_at_episode_starts_and_every_period_after(setup):
    _, buffer, rows, _ = setup
    collected = _stacked(rows)  # [T, N, ...]
    leaves = buffer._tree.numpy()[buffer._num_leaves:]
    for env in range(NUM_ENVS):
        since_start = 0
        for step, step_type in enumerate(collected.step_type[:, env]):
            since_start = 0 if step_type == ts.StepType.FIRST else since_start
            is_entry = since_start % PERIOD == 0 and step_type != ts.StepType.LAST
            assert (leaves[step * NUM_ENVS + env] > 0) == is_entry, (env, step)
            since_start += 1


def test_stored_start_state_is_the_state_the_collect_policy_acted_from(setup):
    agent, buffer, rows, _ = setup
    collected = _stacked(rows)
    # Replay the collect policy's own network over each copy's steps from a zero state: the
    # state it acted from at each step (its network resets at FIRST).
    network = agent._q_network
    state = network.get_initial_state(NUM_ENVS)
    acted_from = []
    for step in range(len(rows)):
        acted_from.append(recurrent.zero_where_first(state, collected.step_type[step]))
        _, state = network(collected.observation[step], step_type=collected.step_type[step],
                           network_state=state)
    experience, info = buffer.sample(64, LENGTH)
    keys = info.keys.numpy()
    for row, key in enumerate(keys):
        step, env = divmod(int(key), NUM_ENVS)
        for stored, expected in zip(tf.nest.flatten(experience.policy_info),
                                    tf.nest.flatten(acted_from[step])):
            np.testing.assert_allclose(stored.numpy()[row, 0], expected.numpy()[env], atol=1e-5)
            # Repeated over the sequence.
            np.testing.assert_array_equal(stored.numpy()[row, 0], stored.numpy()[row, -1])
        # The recorded policy_info of that step is the same state.
        for recorded, expected in zip(tf.nest.flatten(rows[step].policy_info),
                                      tf.nest.flatten(acted_from[step])):
            np.testing.assert_allclose(recorded.numpy()[env], expected.numpy()[env], atol=1e-5)


def test_sampled_windows_are_the_collected_steps(setup):
    _, buffer, rows, _ = setup
    collected = _stacked(rows)
    experience, info = buffer.sample(32, LENGTH)
    for row, key in enumerate(info.keys.numpy()):
        step, env = divmod(int(key), NUM_ENVS)
        np.testing.assert_array_equal(experience.observation.numpy()[row],
                                      collected.observation[step:step + LENGTH, env])


def test_mask_never_crosses_an_episode_start():
    step_type = tf.constant([[0, 1, 1, 2, 0, 1, 1],
                             [1, 1, 2, 0, 1, 2, 0],
                             [1, 1, 1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(recurrent.sequence_mask(step_type).numpy(),
                                  [[1, 1, 1, 0, 0, 0, 0],
                                   [1, 1, 0, 0, 0, 0, 0],
                                   [1, 1, 1, 1, 1, 1, 1]])


def test_mask_zeroes_the_loss_of_steps_of_the_next_episode(setup):
    """Rewards after an episode's end change neither the loss nor the priorities."""
    agent, buffer, _, _ = setup
    experience, _ = buffer.sample(32, LENGTH)
    mask = recurrent.sequence_mask(experience.step_type).numpy()
    crossing = mask[:, BURN_IN:BURN_IN + TRACE].min(axis=1) == 0
    assert crossing.any() and (~crossing).any()
    # Steps after the episode's end, and its LAST boundary row, get absurd rewards.
    noisy = experience._replace(reward=tf.where(tf.constant(mask == 0), 100.0,
                                                experience.reward))
    clean_loss = agent._loss(experience)
    noisy_loss = agent._loss(noisy)
    np.testing.assert_allclose(clean_loss.loss.numpy(), noisy_loss.loss.numpy(), rtol=1e-6)
    np.testing.assert_allclose(clean_loss.extra.priorities.numpy(),
                               noisy_loss.extra.priorities.numpy(), rtol=1e-6)


def test_burn_in_steps_carry_no_gradient(setup):
    agent, buffer, _, _ = setup
    experience, _ = buffer.sample(8, LENGTH)
    observation = tf.Variable(experience.observation)
    with tf.GradientTape() as tape:
        loss = agent._loss(experience._replace(observation=observation.read_value())).loss
    gradient = tape.gradient(loss, observation).numpy()
    assert np.all(gradient[:, :BURN_IN] == 0)
    assert np.any(gradient[:, BURN_IN:] != 0)


def test_priorities_follow_the_eta_rule(setup):
    agent, buffer, _, _ = setup
    experience, info = buffer.sample(16, LENGTH)
    loss_info = agent._loss(experience)
    td = np.abs(loss_info.extra.td_error.numpy())  # masked: 0 outside the trace's episode
    mask = recurrent.sequence_mask(experience.step_type).numpy()[:, BURN_IN:BURN_IN + TRACE]
    count = np.maximum(mask.sum(axis=1), 1)
    eta = agent._eta
    expected = eta * td.max(axis=1) + (1 - eta) * td.sum(axis=1) / count
    np.testing.assert_allclose(agent.sample_priorities(loss_info).numpy(), expected, rtol=1e-5)
    # Routed back to the sequences' own leaves.
    buffer.update_priorities(info.keys, agent.sample_priorities(loss_info))
    stored = buffer.priorities(info.keys).numpy()
    unique = {int(k): i for i, k in enumerate(info.keys.numpy())}
    for key, i in unique.items():
        assert stored[i] == pytest.approx((expected[i] + 1e-6) ** 0.6, rel=1e-5)


def test_update_of_a_row_that_starts_no_sequence_is_ignored(setup):
    _, buffer, _, _ = setup
    leaves = buffer._tree.numpy()[buffer._num_leaves:]
    non_entry = int(np.flatnonzero(leaves[:buffer._capacity] == 0)[0])
    step, env = divmod(non_entry, NUM_ENVS)
    key = tf.constant([step * NUM_ENVS + env], tf.int64)
    buffer.update_priorities(key, tf.constant([5.0]))
    assert buffer.priorities(key).numpy()[0] == 0


def test_n_step_targets_stop_at_episode_end():
    rewards = tf.constant([[1.0, 2.0, 4.0, 8.0, 16.0]])
    discounts = tf.constant([[1.0, 1.0, 0.0, 1.0, 1.0]])  # step 2 terminates the episode
    step_type = tf.constant([[1, 1, 1, 2, 0]])
    returns, scale, index = r2d2.n_step_targets(rewards, discounts, step_type, 0.5, 2, 3)
    # Step 0: 1 + 0.5 * 2, bootstrap from step 2 with 0.25. Step 1: 2 + 0.5 * 4, then
    # terminal (discount 0). Step 2: 4, then the LAST row 3 stops the sum, scale 0.
    np.testing.assert_allclose(returns.numpy(), [[2.0, 4.0, 4.0]])
    np.testing.assert_allclose(scale.numpy(), [[0.25, 0.0, 0.0]])
    np.testing.assert_array_equal(index.numpy(), [[2, 3, 3]])


def test_value_rescaling_inverts():
    x = tf.constant([-300.0, -1.0, 0.0, 0.5, 42.0, 1e4])
    np.testing.assert_allclose(r2d2.unrescale(r2d2.rescale(x)).numpy(), x.numpy(), rtol=1e-4)


def test_uniform_sequence_replay_draws_every_start_equally():
    spec = trajectory_lib.Trajectory(
        step_type=tf.TensorSpec([], tf.int32), observation=tf.TensorSpec([], tf.float32),
        action=tf.TensorSpec([], tf.int64), policy_info=[tf.TensorSpec([2], tf.float32)],
        next_step_type=tf.TensorSpec([], tf.int32), reward=tf.TensorSpec([], tf.float32),
        discount=tf.TensorSpec([], tf.float32))
    buffer = SequenceReplay(spec, capacity=40, period=3, num_steps=4, batch_size=4, seed=1)
    step_types = [0, 1, 1, 1, 1, 1, 1, 2] * 5
    for t, step_type in enumerate(step_types):
        buffer.add(trajectory_lib.Trajectory(
            step_type=tf.constant([step_type]), observation=tf.constant([float(t)]),
            action=tf.constant([0], tf.int64), policy_info=[tf.fill([1, 2], float(t))],
            next_step_type=tf.constant([1]), reward=tf.constant([0.0]),
            discount=tf.constant([1.0])))
    # Entries: episode starts 0, 8, ... and 3, 6 after each; valid starts end at 36.
    entries = {t for t in range(37) if t % 8 in (0, 3, 6)}
    counts = dict.fromkeys(entries, 0)
    for _ in range(300):
        experience, info = buffer.sample(4, 4)
        for row, key in enumerate(info.keys.numpy()):
            counts[int(key)] += 1
            start_state = experience.policy_info[0].numpy()[row, 0]
            expected = 0.0 if key % 8 == 0 else float(key)  # zero at an episode's start
            np.testing.assert_array_equal(start_state, [expected, expected])
        np.testing.assert_allclose(info.probabilities.numpy(), 1 / len(entries), rtol=1e-6)
    assert set(counts) == entries and min(counts.values()) > 0.5 * 1200 / len(entries)


def test_collection_keeps_the_state_after_a_chunk(setup):
    agent, _, rows, collection = setup
    network = agent._q_network
    last = rows[-1]
    state = tf.nest.pack_sequence_as(network.state_spec, tf.nest.flatten(last.policy_info))
    _, expected = network(last.observation, step_type=last.step_type, network_state=state)
    for kept, value in zip(tf.nest.flatten(collection._policy_state),
                           tf.nest.flatten(expected)):
        np.testing.assert_allclose(kept.numpy(), value.numpy(), atol=1e-5)


def test_greedy_evaluation_steps_with_state_and_rows(setup):
    agent, _, _, _ = setup
    env = make_env('CartPole-v1', num_envs=3, hidden_observations=(1, 3), seed=11,
                   max_episode_steps=30)
    act = greedy_actor(agent.policy)
    assert act.takes_rows
    first = play_episodes(env, act, seed=11)
    second = play_episodes(env, greedy_actor(agent.policy), seed=11)
    np.testing.assert_array_equal(first[0], second[0])


def test_sequence_replay_needs_a_recurrent_collect_policy():
    spec = trajectory_lib.Trajectory(
        step_type=tf.TensorSpec([], tf.int32), observation=tf.TensorSpec([], tf.float32),
        action=tf.TensorSpec([], tf.int64), policy_info=(),
        next_step_type=tf.TensorSpec([], tf.int32), reward=tf.TensorSpec([], tf.float32),
        discount=tf.TensorSpec([], tf.float32))
    with pytest.raises(UserError, match='recurrent agent'):
        SequenceReplay(spec, capacity=40, period=3, num_steps=4)


def test_exported_policy_plays_as_in_training_under_tf_agents_saved_model_loader(setup,
                                                                                  tmp_path):
    """TF-Agents' own SavedModelPyTFEagerPolicy steps the export on a plain Gymnasium env,
    carrying the state, and picks the actions the in-process greedy policy picks."""
    import gymnasium
    from tf_agents.policies import py_tf_eager_policy

    from core.export import export_policy
    from envs.partial import HiddenObservations

    agent, _, _, _ = setup
    directory = str(tmp_path / 'policy')
    export_policy(agent.policy, directory, agent.train_step_counter)
    loaded = py_tf_eager_policy.SavedModelPyTFEagerPolicy(directory, load_specs_from_pbtxt=True)
    env = HiddenObservations(gymnasium.make('CartPole-v1', max_episode_steps=40), (1, 3))
    observation, _ = env.reset(seed=5)
    state = loaded.get_initial_state(batch_size=1)
    in_process_state = agent.policy.get_initial_state(1)
    step_type, steps = ts.StepType.FIRST, 0
    while True:
        time_step = ts.TimeStep(step_type=np.array(step_type, np.int32),
                                reward=np.array(0.0, np.float32),
                                discount=np.array(1.0, np.float32),
                                observation=np.asarray(observation, np.float32))
        action_step = loaded.action(time_step, state)
        state = action_step.state
        batched = tf.nest.map_structure(lambda x: tf.constant(np.asarray(x)[None]), time_step)
        expected = agent.policy.action(batched, in_process_state)
        in_process_state = expected.state
        assert int(action_step.action) == int(expected.action.numpy()[0]), steps
        for carried, reference in zip(tf.nest.flatten(state), tf.nest.flatten(expected.state)):
            np.testing.assert_allclose(np.asarray(carried), reference.numpy(), atol=1e-5)
        observation, _, terminated, truncated, _ = env.step(int(action_step.action))
        steps, step_type = steps + 1, ts.StepType.MID
        if terminated or truncated:
            break
    assert steps >= 8 and np.abs(tf.nest.flatten(state)[0]).sum() > 0


@pytest.fixture(scope='module')
def sac_setup():
    """A tiny recurrent SAC agent on Pendulum without its angular velocity, 120 steps in
    sequence replay."""
    from agents import sac

    py_env = make_env('Pendulum-v1', num_envs=2, hidden_observations=(2,), seed=5,
                      max_episode_steps=40)
    tf_env = tf_py_environment.TFPyEnvironment(py_env)
    agent = sac.make_agent(tf_env.time_step_spec(), tf_env.action_spec(),
                           tf.Variable(0, dtype=tf.int64), actor_fc_layer_params=(8, 8),
                           critic_joint_fc_layer_params=(8, 8), lstm_size=(6,),
                           burn_in_steps=BURN_IN, trace_length=TRACE, sequence_period=PERIOD)
    buffer = SequenceReplay(agent.collect_data_spec, capacity=400, period=PERIOD, num_envs=2,
                            batch_size=8, num_steps=agent.train_sequence_length, seed=2)
    collection = Collection(tf_env=tf_env, collect_policy=agent.collect_policy,
                            observers=[buffer.add], env_steps=tf.Variable(0, dtype=tf.int64))
    collection.run_policy(collection.collect_policy, 120)
    return agent, buffer


def test_recurrent_sac_trains_every_network_but_not_on_burn_in(sac_setup):
    agent, buffer = sac_setup
    assert agent.train_sequence_length == BURN_IN + TRACE + 1
    experience, _ = buffer.sample(8, agent.train_sequence_length)
    before = [v.numpy().copy() for v in agent.trainable_variables]
    loss_info = agent.train(experience, weights=tf.ones([8]))
    assert np.isfinite(loss_info.loss.numpy())
    changed = [not np.array_equal(a, v.numpy()) for a, v in zip(before, agent.trainable_variables)]
    assert all(changed[:2]) and sum(changed) >= len(changed) // 2
    # The actor's loss: no gradient reaches the burn-in observations.
    observation = tf.Variable(experience.observation)
    with tf.GradientTape() as tape:
        inputs = recurrent.after_burn_in(
            experience._replace(observation=observation.read_value()), BURN_IN)
        [state] = recurrent.burn_in(
            [agent._actor_network], experience._replace(observation=observation.read_value()),
            recurrent.start_state(experience, agent._actor_network, 'stored'), BURN_IN)
        _, log_pi = agent._actions_and_log_probs(inputs, state)
        loss = tf.reduce_sum(log_pi)
    gradient = tape.gradient(loss, observation).numpy()
    assert np.all(gradient[:, :BURN_IN] == 0) and np.any(gradient[:, BURN_IN:] != 0)


def test_recurrent_sac_priorities_follow_the_eta_rule(sac_setup):
    agent, buffer = sac_setup
    experience, _ = buffer.sample(8, agent.train_sequence_length)
    priorities = agent.sample_priorities(agent.train(experience)).numpy()
    assert priorities.shape == (8,) and np.all(priorities >= 0)
    mask = recurrent.sequence_mask(experience.step_type).numpy()[:, BURN_IN:BURN_IN + TRACE]
    assert np.all(priorities[mask.sum(axis=1) == 0] == 0)


def test_recurrent_settings_without_lstm_are_refused():
    from agents import sac

    env = tf_py_environment.TFPyEnvironment(make_env('Pendulum-v1'))
    with pytest.raises(UserError, match='only apply to a recurrent agent'):
        sac.make_agent(env.time_step_spec(), env.action_spec(), tf.Variable(0, dtype=tf.int64),
                       burn_in_steps=4)
    cartpole = tf_py_environment.TFPyEnvironment(make_env('CartPole-v1'))
    with pytest.raises(UserError, match='only apply to a recurrent agent'):
        dqn.make_agent(cartpole.time_step_spec(), cartpole.action_spec(),
                       tf.Variable(0, dtype=tf.int64), initial_state='zero')
