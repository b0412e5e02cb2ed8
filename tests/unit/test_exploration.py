"""Colored exploration noise: its statistics, and SAC's collect policy sampled with it."""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.environments import tf_py_environment

from agents import sac
from agents.exploration import colored_noise
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
