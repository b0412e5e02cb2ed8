"""DQN's epsilon-greedy collect policy: TF-Agents' distribution of actions, and no
forward pass of the greedy policy when every env copy explores."""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.environments import tf_py_environment
from tf_agents.policies import tf_policy
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import policy_step
from tf_agents.trajectories import time_step as ts

from agents import dqn
from agents.epsilon_greedy import EpsilonGreedyPolicy
from envs.suite import make_env
from experiment.loop import Collection

ACTIONS = 6


class _CountingGreedy(tf_policy.TFPolicy):
    """Picks one action (2) and counts its calls (in a variable, so traced calls count too)."""

    def __init__(self, time_step_spec, action_spec, action=2):
        super().__init__(time_step_spec, action_spec)
        self.calls = tf.Variable(0, dtype=tf.int64)
        self._picked = action

    def _action(self, time_step, policy_state, seed):
        self.calls.assign_add(1)
        action = tf.fill(tf.shape(time_step.step_type), tf.constant(self._picked, tf.int64))
        return policy_step.PolicyStep(action, (), ())

    def _distribution(self, time_step, policy_state):
        raise NotImplementedError


def _actions(epsilon, copies, steps):
    spec = tensor_spec.BoundedTensorSpec([], tf.int64, 0, ACTIONS - 1)
    greedy = _CountingGreedy(ts.time_step_spec(tf.TensorSpec([1], tf.float32)), spec)
    policy = EpsilonGreedyPolicy(greedy, epsilon)
    time_step = ts.restart(tf.zeros([copies, 1]), batch_size=copies)
    act = tf.function(lambda: policy.action(time_step).action)
    actions = np.array([act().numpy() for _ in range(steps)])
    return actions, int(greedy.calls.numpy())


def test_exploring_copies_never_run_the_greedy_policy():
    tf.random.set_seed(0)
    actions, calls = _actions(1.0, copies=3, steps=600)
    assert calls == 0
    counts = np.bincount(actions.ravel(), minlength=ACTIONS)
    assert counts.min() > 0.7 * actions.size / ACTIONS  # uniform over all six actions


def test_actions_follow_epsilon_greedy_and_the_network_runs_only_for_greedy_steps():
    tf.random.set_seed(1)
    actions, calls = _actions(0.0, copies=2, steps=50)
    assert np.all(actions == 2) and calls == 50
    tf.random.set_seed(2)
    epsilon, steps = 0.3, 3000
    actions, calls = _actions(epsilon, copies=1, steps=steps)
    # Greedy with probability 1 - epsilon, plus the random draws that land on action 2.
    assert np.mean(actions == 2) == pytest.approx(1 - epsilon + epsilon / ACTIONS, abs=0.03)
    assert calls == pytest.approx((1 - epsilon) * steps, rel=0.06)


def test_dqn_collects_with_it_and_keeps_its_variables_and_data_spec():
    env = make_env('CartPole-v1', num_envs=2, seed=0)
    tf_env = tf_py_environment.TFPyEnvironment(env)
    step = tf.Variable(0, dtype=tf.int64)
    agent = dqn.make_agent(tf_env.time_step_spec(), tf_env.action_spec(), step,
                           fc_layer_params=(8,), epsilon_start=0.0, epsilon_end=0.0)
    assert isinstance(agent.collect_policy, EpsilonGreedyPolicy)
    assert [id(v) for v in agent.collect_policy.variables()] == \
        [id(v) for v in agent.policy.variables()]  # weight transfer unchanged
    assert agent.collect_policy.trajectory_spec == agent.collect_data_spec
    time_step = tf_env.reset()
    np.testing.assert_array_equal(agent.collect_policy.action(time_step).action,
                                  agent.policy.action(time_step).action)  # epsilon 0: greedy
    env.close()


def test_a_compiled_collection_that_only_explores_steps_the_env_in_order():
    # With every copy exploring, the action reads nothing of the time step. Without an
    # explicit dependency a distributed collector's env steps overlapped and TFPyEnvironment
    # refused them (tests/distributed/test_shared_statistics.py caught it); here, the
    # single-process collection loop.
    env = make_env('CartPole-v1', num_envs=2, seed=0)
    tf_env = tf_py_environment.TFPyEnvironment(env)
    agent = dqn.make_agent(tf_env.time_step_spec(), tf_env.action_spec(),
                           tf.Variable(0, dtype=tf.int64), fc_layer_params=(8,),
                           epsilon_start=1.0, epsilon_end=1.0)
    env_steps = tf.Variable(0, dtype=tf.int64)
    rewards = tf.Variable(0.0)
    collection = Collection(tf_env=tf_env, collect_policy=agent.collect_policy,
                            observers=[lambda t: rewards.assign_add(tf.reduce_sum(t.reward))],
                            env_steps=env_steps)
    for _ in range(5):
        collection.collect_with_agent(200)
    assert env_steps.numpy() == 5 * 200 * 2
    assert rewards.numpy() > 1000  # CartPole pays 1 a step (0 on restarts)
    env.close()


def test_its_distribution_is_the_epsilon_greedy_mixture():
    spec = tensor_spec.BoundedTensorSpec([], tf.int64, 3, 3 + ACTIONS - 1)  # actions 3..8
    greedy = _CountingGreedy(ts.time_step_spec(tf.TensorSpec([1], tf.float32)), spec, action=5)
    policy = EpsilonGreedyPolicy(greedy, 0.3)
    time_step = ts.restart(tf.zeros([2, 1]), batch_size=2)
    distribution = policy.distribution(time_step).action
    probs = np.stack([distribution.prob(tf.fill([2], tf.constant(a, tf.int64))).numpy()
                      for a in range(3, 3 + ACTIONS)], axis=1)
    expected = np.full(ACTIONS, 0.3 / ACTIONS)
    expected[5 - 3] += 0.7
    np.testing.assert_allclose(probs, np.tile(expected, (2, 1)), rtol=1e-5)
