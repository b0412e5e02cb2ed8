"""n-step targets stop at episode ends: truncation bootstraps, termination does not."""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory

from agents.nstep import stop_windows_at_episode_end

GAMMA = 0.9
FIRST, MID, LAST = ts.StepType.FIRST, ts.StepType.MID, ts.StepType.LAST


def _window(step_types, rewards, discounts):
    """A [1, T] trajectory whose observation at step t is t."""
    t = len(step_types)
    return trajectory.Trajectory(
        step_type=tf.constant([step_types], tf.int32),
        observation=tf.constant([np.arange(t, dtype=np.float32)]),
        action=tf.zeros([1, t], tf.int64),
        policy_info=(),
        next_step_type=tf.constant([step_types[1:] + [MID]], tf.int32),
        reward=tf.constant([rewards], tf.float32),
        discount=tf.constant([discounts], tf.float32))


def _target_parts(window):
    """(n-step reward, bootstrap discount incl. the agent's gamma, bootstrap obs)."""
    transition = trajectory.to_n_step_transition(
        stop_windows_at_episode_end(window, GAMMA), GAMMA)
    next_step = transition.next_time_step
    return (float(next_step.reward[0]), GAMMA * float(next_step.discount[0]),
            float(next_step.observation[0]))


def test_window_inside_one_episode_is_unchanged():
    window = _window([MID, MID, MID, MID], [1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0])
    reward, discount, obs = _target_parts(window)
    assert reward == pytest.approx(1 + GAMMA * 2 + GAMMA**2 * 3)
    assert discount == pytest.approx(GAMMA**3)
    assert obs == 3


def test_truncation_bootstraps_from_the_last_step():
    # Step 1 is a time-limit LAST (discount 1 on the way in); steps 2.. are the next episode.
    window = _window([MID, LAST, FIRST, MID], [1.0, 0.0, 5.0, 7.0], [1.0, 1.0, 1.0, 1.0])
    reward, discount, obs = _target_parts(window)
    assert reward == pytest.approx(1.0)  # no reward leaks in from the next episode
    assert discount == pytest.approx(GAMMA)  # one step, then bootstrap
    assert obs == 1  # from the truncated episode's last observation


def test_termination_does_not_bootstrap():
    window = _window([MID, MID, LAST, FIRST], [1.0, 2.0, 0.0, 5.0], [1.0, 0.0, 1.0, 1.0])
    reward, discount, obs = _target_parts(window)
    assert reward == pytest.approx(1 + GAMMA * 2)
    assert discount == 0.0
    assert obs == 2


def test_uncorrected_tf_agents_target_leaks_across_truncation():
    """Documents the TF-Agents behaviour (tensorflow/agents#939) the fix exists for."""
    window = _window([MID, LAST, FIRST, MID], [1.0, 0.0, 5.0, 7.0], [1.0, 1.0, 1.0, 1.0])
    leaked = trajectory.to_n_step_transition(window, GAMMA).next_time_step
    assert float(leaked.reward[0]) == pytest.approx(1 + GAMMA**2 * 5)
    assert float(leaked.observation[0]) == 3


def test_one_step_windows_pass_through():
    window = _window([MID, LAST], [1.0, 0.0], [0.0, 1.0])
    assert stop_windows_at_episode_end(window, GAMMA) is window
