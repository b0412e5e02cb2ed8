"""Temporally correlated exploration: colored noise (SAC) and epsilon-z-greedy (DQN)."""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.environments import tf_py_environment
from tf_agents.policies import tf_policy
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import policy_step
from tf_agents.trajectories import time_step as ts

from agents import dqn, sac
from agents.exploration import TemporallyExtendedEpsilonGreedyPolicy, colored_noise
from core.errors import UserError
from envs.suite import make_env


def _lag1_autocorrelation(sequences):
    centered = sequences - sequences.mean(axis=-1, keepdims=True)
    return float(np.mean(np.sum(centered[..., 1:] * centered[..., :-1], axis=-1)
                         / np.sum(centered ** 2, axis=-1)))


@pytest.mark.parametrize('beta, low, high', [(0.0, -0.05, 0.05), (1.0, 0.5, 0.95),
                                             (2.0, 0.97, 1.0)])
def test_noise_has_unit_variance_and_the_color_sets_its_correlation(beta, low, high):
    tf.random.set_seed(0)
    noise = colored_noise([64, 2], 1000, beta).numpy()
    assert noise.shape == (64, 2, 1000)
    # Pink and red noise put much of their variance into slow components: one sequence's own
    # std varies, the variance over many sequences is 1.
    assert np.var(noise) == pytest.approx(1.0, rel=0.25)
    assert low < _lag1_autocorrelation(noise) < high


def test_sac_collects_with_correlated_actions_and_redraws_at_episode_starts():
    tf.random.set_seed(1)
    env = tf_py_environment.TFPyEnvironment(make_env('Pendulum-v1', num_envs=3))
    agent = sac.make_agent(env.time_step_spec(), env.action_spec(),
                           tf.Variable(0, dtype=tf.int64), actor_fc_layer_params=(8,),
                           critic_joint_fc_layer_params=(8,), exploration_noise_beta=2.0)
    policy = agent.collect_policy
    assert len(policy.variables()) == len(agent._collect_policy.variables())
    time_step = env.reset()
    mid = time_step._replace(step_type=tf.ones_like(time_step.step_type))
    actions = [policy.action(time_step).action.numpy()]
    actions += [policy.action(mid).action.numpy() for _ in range(199)]
    actions = np.stack(actions)[..., 0].T  # [copy, step]
    assert np.all(np.abs(actions) <= 2.0)
    assert _lag1_autocorrelation(actions) > 0.9  # red noise: consecutive actions move together
    assert not np.allclose(actions[0], actions[1])  # each copy has its own sequence
    assert list(policy._state.t.numpy()) == [200] * 3
    before = policy._state.noise.numpy()
    policy.action(time_step)  # FIRST steps: every copy draws a new sequence, from its start
    assert list(policy._state.t.numpy()) == [1] * 3
    assert not np.allclose(before, policy._state.noise.numpy())
    white = sac.make_agent(env.time_step_spec(), env.action_spec(),
                           tf.Variable(0, dtype=tf.int64), actor_fc_layer_params=(8,),
                           critic_joint_fc_layer_params=(8,))
    assert white.collect_policy is white._collect_policy


class _ConstantGreedy(tf_policy.TFPolicy):
    """A 'greedy' policy that always picks action 0, so every other action is exploration."""

    def _action(self, time_step, policy_state, seed):
        return policy_step.PolicyStep(tf.zeros_like(time_step.step_type, tf.int64), (), ())

    def _distribution(self, time_step, policy_state):
        raise NotImplementedError


def _run_lengths(actions):
    lengths, run = [], 1
    for previous, current in zip(actions[:-1], actions[1:]):
        if current == previous:
            run += 1
        else:
            lengths.append(run)
            run = 1
    return lengths


def _epsilon_z_actions(mu, steps=3000, copies=4, first_every=None, epsilon=1.0):
    spec = tensor_spec.BoundedTensorSpec([], tf.int64, 0, 5)
    time_step_spec = ts.time_step_spec(tf.TensorSpec([1], tf.float32))
    policy = TemporallyExtendedEpsilonGreedyPolicy(
        _ConstantGreedy(time_step_spec, spec), epsilon, mu=mu, max_repeat=100)
    act = tf.function(lambda step_type: policy.action(ts.TimeStep(
        step_type=step_type, reward=tf.zeros([copies]), discount=tf.ones([copies]),
        observation=tf.zeros([copies, 1]))).action)
    actions = []
    for t in range(steps):
        first = t == 0 or (first_every is not None and t % first_every == 0)
        actions.append(act(tf.fill([copies], 0 if first else 1)).numpy())
    return np.array(actions)


def test_epsilon_z_greedy_repeats_exploratory_actions_with_zeta_durations():
    tf.random.set_seed(0)
    repeated = [n for copy in _epsilon_z_actions(2.0).T for n in _run_lengths(copy)]
    tf.random.set_seed(0)
    dithering = [n for copy in _epsilon_z_actions(60.0).T for n in _run_lengths(copy)]
    # Six actions drawn every step repeat by chance only: runs average 6/5 steps. Durations
    # with P(n) ~ n^-2 (capped at 100) average ~3; consecutive draws of one action join runs.
    assert np.mean(dithering) == pytest.approx(1.2, abs=0.1)
    assert np.mean(repeated) > 2.5 and max(repeated) >= 30


def test_epsilon_z_greedy_never_repeats_across_an_episode_start_and_acts_greedily_otherwise():
    tf.random.set_seed(1)
    # Episodes of 5 steps and long repeats (mu ~ 1): within an episode the next action is
    # mostly the same one; at an episode start it is a fresh draw (equal by chance: 1/6).
    actions = _epsilon_z_actions(1.01, steps=2000, first_every=5)
    same = actions[1:] == actions[:-1]
    starts = (np.arange(1, 2000) % 5 == 0)
    assert same[~starts].mean() > 0.6
    assert same[starts].mean() < 0.3
    assert not np.all(actions == 0)
    tf.random.set_seed(1)
    assert np.all(_epsilon_z_actions(2.0, steps=200, epsilon=0.0) == 0)  # greedy at epsilon 0


def test_dqn_collects_epsilon_z_greedy_and_keeps_its_variables_and_greedy_policy():
    env = make_env('MountainCar-v0', num_envs=2, seed=0)
    tf_env = tf_py_environment.TFPyEnvironment(env)
    agent = dqn.make_agent(tf_env.time_step_spec(), tf_env.action_spec(),
                           tf.Variable(0, dtype=tf.int64), fc_layer_params=(8,),
                           exploration_repeat_mu=2.0)
    assert isinstance(agent.collect_policy, TemporallyExtendedEpsilonGreedyPolicy)
    assert [id(v) for v in agent.collect_policy.variables()] == \
        [id(v) for v in agent.policy.variables()]  # weight transfer unchanged
    assert agent.collect_policy.trajectory_spec == agent.collect_data_spec
    assert agent.collect_policy.action(tf_env.reset()).action.shape == (2,)
    with pytest.raises(UserError, match='exploration_repeat_mu'):
        dqn.make_agent(tf_env.time_step_spec(), tf_env.action_spec(),
                       tf.Variable(0, dtype=tf.int64), exploration_repeat_mu=-1.0)
    env.close()
