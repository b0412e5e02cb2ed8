"""Atari 2600 games through ale-py, preprocessed as DQN's papers do, one frame per step.

`make_env(env_id='ALE/Pong-v5')` comes here. The standard preprocessing
(Mnih et al. 2015, Machado et al. 2018), each value a Gin option of
`atari_env` (scope `eval/atari_env` for evaluation's copies):

- up to `noop_max` no-op actions at the start of an episode (random number; the
  Nature paper's 30 by default, 0 in the Dopamine-style configs, which rely on
  sticky actions instead);
- `frame_skip` emulator frames per agent step, the last two max-pooled (the
  Atari draws some sprites only every other frame);
- 84x84 grayscale uint8 frames (`screen_size`), resized with area averaging;
- sticky actions (`sticky_actions`; v5's 0.25, 0 for the Atari-100k protocol);
- an episode cap of `max_episode_frames` emulator frames (108k = 30 minutes);
- `terminal_on_life_loss`: a lost life ends the *value target* (discount 0 on
  that step) but not the episode, so the game goes on, returns and
  TensorBoard report whole-game scores, and evaluation (which does not set it)
  plays the same games.

Reward clipping is not done here: replay keeps the game's rewards, and the
agent's targets clip them (`preprocess.RewardClipping`), so every score the
application reports is the raw game score.

Frames are not stacked here: the environment yields one frame per step, replay
stores each frame once, and stacks are built where they are used (the collect
policy's ring, evaluation, sampled windows; see buffers/frames.py).
"""

import atexit
import weakref

import gin
import gymnasium

from envs.gymnasium_env import MID_EPISODE_TERMINAL

# Emulators still referenced at exit (e.g. by a traced collect loop's py_function) would make
# ale-py's bindings print a wall of "leaked instance" lines: release them first.
_EMULATORS = weakref.WeakSet()


@atexit.register
def _release_emulators():
    for env in list(_EMULATORS):
        env.__dict__.pop('ale', None)


def is_atari(env_id):
    return str(env_id).startswith('ALE/')


class LifeLossTerminal(gymnasium.Wrapper):
    """Marks the step that loses a life as terminal for value targets, not for the episode."""

    def __init__(self, env):
        super().__init__(env)
        self._lives = 0

    def reset(self, **kwargs):
        observation, info = self.env.reset(**kwargs)
        self._lives = self.env.unwrapped.ale.lives()
        return observation, info

    def step(self, action):
        observation, reward, terminated, truncated, info = self.env.step(action)
        lives = self.env.unwrapped.ale.lives()
        if lives < self._lives and not (terminated or truncated):
            info = {**info, MID_EPISODE_TERMINAL: True}
        self._lives = lives
        return observation, reward, terminated, truncated, info


@gin.configurable
def atari_env(env_id, *, noop_max=30, frame_skip=4, screen_size=84, sticky_actions=0.25,
              max_episode_frames=108_000, terminal_on_life_loss=False, env_kwargs=None):
    """One preprocessed Atari game (a `gymnasium.Env` of [84, 84] uint8 frames).

    Args:
      env_id: an ALE id such as 'ALE/Pong-v5' (ROMs ship with ale-py).
      noop_max: most no-op actions at an episode's start.
      frame_skip: emulator frames per agent step (max over the last two).
      screen_size: side of the square grayscale frame.
      sticky_actions: probability that the emulator repeats the previous action.
      max_episode_frames: episode cap in emulator frames (a truncation: bootstraps).
      terminal_on_life_loss: whether a lost life stops value targets (training only).
      env_kwargs: extra arguments for `gymnasium.make` (e.g. render_mode).
    """
    import ale_py  # imported here: only Atari runs pay for it
    from gymnasium.wrappers import AtariPreprocessing

    gymnasium.register_envs(ale_py)
    env = gymnasium.make(env_id, frameskip=1, repeat_action_probability=sticky_actions,
                         max_num_frames_per_episode=max_episode_frames, **(env_kwargs or {}))
    _EMULATORS.add(env.unwrapped)
    env = AtariPreprocessing(env, noop_max=noop_max, frame_skip=frame_skip,
                             screen_size=screen_size, terminal_on_life_loss=False,
                             grayscale_obs=True, scale_obs=False)
    return LifeLossTerminal(env) if terminal_on_life_loss else env
