"""Atari through ale-py (envs/atari.py): frames, life loss as a target-only terminal, errors."""

import gin
import numpy as np
import pytest
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

from core.errors import UserError
from envs.suite import make_env
from preprocessing.transforms import RewardClipping


def _play(env, steps, seed=0):
    rng = np.random.default_rng(seed)
    time_step = env.reset()
    history = [time_step]
    for _ in range(steps):
        time_step = env.step(rng.integers(0, 4, size=env.batch_size))
        history.append(time_step)
    return history


def test_one_84x84_uint8_frame_per_step():
    env = make_env('ALE/Breakout-v5', num_envs=2, seed=0)
    try:
        spec = env.observation_spec()
        assert spec.shape == (84, 84) and spec.dtype == np.uint8
        assert int(env.action_spec().maximum) == 3
        history = _play(env, 10)
        assert history[-1].observation.shape == (2, 84, 84)
        assert history[-1].observation.max() > 0  # a real screen, not zeros
    finally:
        env.close()


@pytest.mark.parametrize('life_loss', [True, False])
def test_a_lost_life_stops_targets_but_not_the_game(life_loss):
    with gin.unlock_config():
        gin.bind_parameter('atari_env.terminal_on_life_loss', life_loss)
    try:
        env = make_env('ALE/Breakout-v5', num_envs=1, seed=1)
        history = _play(env, 400)
        env.close()
    finally:
        gin.clear_config()
    mid_terminals = [i for i, step in enumerate(history)
                     if step.step_type[0] == ts.StepType.MID and step.discount[0] == 0.0]
    if not life_loss:
        assert not mid_terminals
        return
    # Breakout has 5 lives: random play loses several in 400 steps, each one a MID step
    # with discount 0, and the game goes on (no FIRST right after it).
    assert len(mid_terminals) >= 2
    for i in mid_terminals:
        assert history[i + 1].step_type[0] != ts.StepType.FIRST


def test_max_episode_steps_is_refused_for_atari():
    with pytest.raises(UserError, match='max_episode_frames'):
        make_env('ALE/Pong-v5', max_episode_steps=100)


def test_reward_clipping_clips_only_what_targets_see():
    clipping = RewardClipping()
    np.testing.assert_array_equal(clipping.reward(tf.constant([-7.0, 0.5, 0.0, 100.0])).numpy(),
                                  [-1.0, 0.5, 0.0, 1.0])
    with pytest.raises(UserError, match='low < high'):
        RewardClipping(low=1.0, high=-1.0)
