"""evaluate.py plays every policy on the same seeded episodes."""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.environments import tf_py_environment
from tf_agents.policies import fixed_policy, policy_saver

from app import cli
from core.errors import UserError
from envs.suite import make_env


def test_missing_policy_is_a_one_line_error(tmp_path):
    with pytest.raises(UserError, match='No saved policy at'):
        cli.evaluate_main(['--env_id=Pendulum-v1', '--episodes=2', str(tmp_path / 'nope')])


def test_the_same_policy_scores_the_same_on_the_same_episodes(tmp_path):
    env = tf_py_environment.TFPyEnvironment(make_env('Pendulum-v1'))
    constant = fixed_policy.FixedPolicy(tf.constant([0.5]), env.time_step_spec(),
                                        env.action_spec())
    path = str(tmp_path / 'policy')
    policy_saver.PolicySaver(constant, batch_size=None).save(path)
    result = cli.evaluate_main(['--env_id=Pendulum-v1', '--episodes=3', path, path])
    first, second = result['policies']
    assert first['returns'] == second['returns'] and -1700 < first['mean'] < 0
    assert first['std'] > 0 and first['ci95'][0] < first['mean'] < first['ci95'][1]
    (difference,) = result['differences']
    assert difference['mean'] == 0 and difference['ci95'] == [0.0, 0.0]


def test_a_policy_outside_a_run_needs_an_env_id(tmp_path):
    (tmp_path / 'policy').mkdir()
    with pytest.raises(UserError, match='pass --env_id'):
        cli.evaluate_main([str(tmp_path / 'policy')])


def test_evaluation_epsilon_takes_random_actions_at_that_rate():
    from tf_agents.specs import array_spec
    from tf_agents.trajectories import time_step as ts

    from experiment.evaluation import epsilon_actor

    spec = array_spec.BoundedArraySpec((), np.int64, 0, 5)
    greedy = lambda time_step: np.zeros(1000, np.int64)  # noqa: E731
    assert epsilon_actor(greedy, 0.0, spec) is greedy
    first = ts.TimeStep(np.zeros(1000, np.int32), None, None, None)
    mid = first._replace(step_type=np.ones(1000, np.int32))
    act = epsilon_actor(greedy, 0.1, spec, seed=1)
    actions = np.concatenate([act(first)] + [act(mid) for _ in range(9)])
    explored = np.mean(actions != 0) * 6 / 5  # a random action is 0 one time in six
    assert 0.08 < explored < 0.12 and actions.max() <= 5
    # Every play starts from the same random stream: the same episodes, the same draws.
    np.testing.assert_array_equal(act(first), actions[:1000])
    with pytest.raises(UserError, match='discrete'):
        epsilon_actor(greedy, 0.1, array_spec.BoundedArraySpec((1,), np.float32, -1, 1))


def test_copies_whose_episode_ended_are_no_longer_played_and_nothing_else_changes():
    """A slow tail (one long episode among many) costs one copy per step, same results."""
    from experiment.evaluation import epsilon_actor, play_episodes

    acted_rows = []

    def scripted(time_step, rows=None):  # stateless: leans the way the pole falls
        observation = np.asarray(time_step.observation)
        acted_rows.append(len(observation))
        return (observation[:, 2] + 0.3 * observation[:, 3] > 0).astype(np.int64)

    scripted.takes_rows = True
    env = make_env('CartPole-v1', num_envs=6, seed=0)
    spec = env.action_spec()
    subset_returns, subset_lengths = play_episodes(
        env, epsilon_actor(scripted, 0.2, spec, seed=3), seed=7)
    subset_acted, acted_rows[:] = sum(acted_rows), []
    full_returns, full_lengths = play_episodes(
        env, epsilon_actor(lambda time_step: scripted(time_step), 0.2, spec, seed=3), seed=7)
    np.testing.assert_array_equal(subset_returns, full_returns)
    np.testing.assert_array_equal(subset_lengths, full_lengths)
    assert len(set(full_lengths)) > 1  # the episodes did end at different steps
    assert subset_acted == full_lengths.sum() < sum(acted_rows) == 6 * full_lengths.max()
