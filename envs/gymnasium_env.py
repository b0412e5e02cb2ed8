"""Adapter that lets TF-Agents drive a Gymnasium environment.

TF-Agents 0.19 only wraps the legacy `gym` package, whose step API (a single
`done` flag) cannot tell a real terminal state from a time limit. Gymnasium
reports the two separately, and this adapter keeps that distinction in the
discount of the LAST time step, which is what value targets read.
"""

import numpy as np
from gymnasium import spaces
from tf_agents.environments import py_environment
from tf_agents.specs import array_spec
from tf_agents.trajectories import time_step as ts

from core.errors import UserError

_FLOAT32_INFO = np.finfo(np.float32)

# An `info` key: True on a step that ends value targets (discount 0) without ending the
# episode, e.g. a lost life in Atari's terminal-on-life-loss protocol (envs/atari.py).
MID_EPISODE_TERMINAL = 'mid_episode_terminal'


def space_to_spec(space, name, float32=True):
    """Converts a Gymnasium space into the equivalent TF-Agents array spec.

    Specs are what TF-Agents networks, policies and replay buffers are built
    from, so every space an environment exposes must map onto one.

    Args:
      space: A `gymnasium.spaces.Space`. Box, Discrete, MultiDiscrete,
        MultiBinary, and Dict/Tuple nests of those are supported.
      name: Name of the spec; nested specs get `name/key` or `name/index`.
      float32: Whether float64 Boxes become float32 specs. TF-Agents networks
        compute in float32, so keeping float64 would only force casts later.

    Returns:
      A `BoundedArraySpec`, or a dict/tuple of specs mirroring the space.

    Raises:
      UserError: If the space (or a space nested in it) is not supported.
    """
    for space_type, converter in _SPEC_CONVERTERS:
        if isinstance(space, space_type):
            return converter(space, name, float32)
    raise UserError(
        f'Unsupported Gymnasium space {type(space).__name__} for {name!r}; '
        'use Box, Discrete, MultiDiscrete, MultiBinary, Dict or Tuple spaces '
        '(e.g. wrap the environment with a gymnasium.wrappers observation '
        'wrapper).')


def _box_spec(space, name, float32):
    """Keeps the Box's shape and bounds, narrowing float64 when asked."""
    dtype = np.dtype(space.dtype)
    low, high = space.low, space.high
    if float32 and dtype == np.float64:
        dtype = np.dtype(np.float32)
        # float64 bounds may lie outside float32's range (e.g. float64 max);
        # BoundedArraySpec rejects those, so clamp them to float32's extremes,
        # which is also how it stores infinite bounds.
        low = np.clip(low, _FLOAT32_INFO.min, _FLOAT32_INFO.max)
        high = np.clip(high, _FLOAT32_INFO.min, _FLOAT32_INFO.max)
    return array_spec.BoundedArraySpec(space.shape, dtype, low, high, name)


def _discrete_spec(space, name, float32):
    """A Discrete(n, start) is the scalar integer range [start, start+n-1]."""
    del float32  # Integer spaces are never narrowed.
    start = int(space.start)
    return array_spec.BoundedArraySpec(
        (), np.int64, start, start + int(space.n) - 1, name)


def _multi_discrete_spec(space, name, float32):
    """Each MultiDiscrete entry i is the range [start_i, start_i+nvec_i-1]."""
    del float32  # Integer spaces are never narrowed.
    nvec = np.asarray(space.nvec, dtype=np.int64)
    start = getattr(space, 'start', None)
    minimum = np.broadcast_to(
        np.asarray(0 if start is None else start, dtype=np.int64), nvec.shape)
    return array_spec.BoundedArraySpec(
        nvec.shape, np.int64, minimum, minimum + nvec - 1, name)


def _multi_binary_spec(space, name, float32):
    """MultiBinary holds 0/1 flags; int8 matches Gymnasium's own dtype."""
    del float32  # Integer spaces are never narrowed.
    return array_spec.BoundedArraySpec(space.shape, np.int8, 0, 1, name)


def _dict_spec(space, name, float32):
    """Dict spaces become dicts of specs with the same keys."""
    return {
        key: space_to_spec(subspace, f'{name}/{key}', float32)
        for key, subspace in space.spaces.items()
    }


def _tuple_spec(space, name, float32):
    """Tuple spaces become tuples of specs in the same order."""
    return tuple(
        space_to_spec(subspace, f'{name}/{index}', float32)
        for index, subspace in enumerate(space.spaces))


_SPEC_CONVERTERS = (
    (spaces.Box, _box_spec),
    (spaces.Discrete, _discrete_spec),
    (spaces.MultiDiscrete, _multi_discrete_spec),
    (spaces.MultiBinary, _multi_binary_spec),
    (spaces.Dict, _dict_spec),
    (spaces.Tuple, _tuple_spec),
)


def _match_spec(spec, value):
    """Casts a (nested) Gymnasium value to the dtypes of a (nested) spec.

    TF-Agents checks values against specs by dtype, and Gymnasium freely
    returns float64 arrays or Python ints, so every leaf is converted.
    """
    if isinstance(spec, dict):
        return {key: _match_spec(sub, value[key]) for key, sub in spec.items()}
    if isinstance(spec, tuple):
        return tuple(_match_spec(sub, item) for sub, item in zip(spec, value))
    return np.asarray(value, dtype=spec.dtype)


def _to_gym_action(space, action):
    """Converts a TF-Agents action into the form the Gymnasium space expects.

    Gymnasium environments index with Discrete actions (so they want a plain
    int, not a 0-d array) and compare Box/MultiDiscrete actions against the
    space's dtype (which may be float64 even when our spec is float32).
    """
    if isinstance(space, spaces.Discrete):
        return int(action)
    if isinstance(space, spaces.Dict):
        return {
            key: _to_gym_action(sub, action[key])
            for key, sub in space.spaces.items()
        }
    if isinstance(space, spaces.Tuple):
        return tuple(
            _to_gym_action(sub, item)
            for sub, item in zip(space.spaces, action))
    return np.asarray(action, dtype=space.dtype)


class GymnasiumEnvironment(py_environment.PyEnvironment):
    """A TF-Agents `PyEnvironment` backed by a Gymnasium environment.

    The base class handles auto-reset: stepping after a LAST time step starts
    a new episode, which batched environments rely on because their copies
    finish episodes at different times.
    """

    def __init__(self, gym_env, *, float32_observations=True, discount=1.0,
                 seed=None):
        """Wraps `gym_env`, taking ownership of it (see `close`).

        Args:
          gym_env: A `gymnasium.Env`, typically from `gymnasium.make`.
          float32_observations: Whether float64 observations are narrowed to
            float32 (see `space_to_spec`).
          discount: Discount of non-terminal steps, including time-limit
            truncations; must lie in [0, 1].
          seed: If given, seeds the first episode (see `seed`).

        Raises:
          UserError: If a space is unsupported or `discount` is out of range.
        """
        super().__init__(handle_auto_reset=True)
        if not 0.0 <= discount <= 1.0:
            raise UserError(
                f'discount must be within [0, 1], got {discount!r}; '
                'pass a value such as 1.0.')
        self._gym_env = gym_env
        self._discount = np.float32(discount)
        self._observation_spec = space_to_spec(
            gym_env.observation_space, 'observation', float32_observations)
        # Actions always use float32 specs: TF-Agents policies emit float32,
        # and `_to_gym_action` restores the space's dtype for the env.
        self._action_spec = space_to_spec(
            gym_env.action_space, 'action', float32=True)
        self._pending_seed = None
        if seed is not None:
            self.seed(seed)

    @property
    def gym_env(self):
        """The wrapped Gymnasium environment."""
        return self._gym_env

    def observation_spec(self):
        return self._observation_spec

    def action_spec(self):
        return self._action_spec

    def seed(self, seed):
        """Seeds the next reset and the action space.

        Gymnasium seeds through `reset(seed=...)`; seeding every reset would
        replay the same episode forever, so only the first reset after this
        call gets the seed and later episodes continue the env's RNG. That
        makes a given seed reproduce the same sequence of episodes.

        Args:
          seed: A non-negative integer.
        """
        self._pending_seed = int(seed)
        self._gym_env.action_space.seed(self._pending_seed)

    def reset_gym(self):
        """Resets the Gymnasium env (seeded if a seed is pending); returns its raw observation."""
        seed, self._pending_seed = self._pending_seed, None
        observation, _ = self._gym_env.reset(seed=seed)
        return observation

    def step_gym(self, action):
        """Steps the Gymnasium env with a TF-Agents action.

        Returns:
          (observation, reward, terminated, truncated, discount), where discount is that of
          a non-terminal step: the env's, or 0 where the env marks the step
          `MID_EPISODE_TERMINAL`.
        """
        observation, reward, terminated, truncated, info = self._gym_env.step(
            _to_gym_action(self._gym_env.action_space, action))
        discount = np.float32(0.0) if info.get(MID_EPISODE_TERMINAL) else self._discount
        return observation, reward, terminated, truncated, discount

    @property
    def discount(self):
        """Discount of non-terminal steps (time-limit truncations included)."""
        return self._discount

    def _reset(self):
        return ts.restart(_match_spec(self._observation_spec, self.reset_gym()))

    def _step(self, action):
        observation, reward, terminated, truncated, discount = self.step_gym(action)
        observation = _match_spec(self._observation_spec, observation)
        reward = np.asarray(reward, dtype=np.float32)
        if terminated:
            # A true terminal state has no future: discount 0 stops value
            # targets from bootstrapping past it.
            return ts.termination(observation, reward)
        if truncated:
            # A time limit ends the episode but not the task: the state still
            # has value, so keep the normal discount and let targets
            # bootstrap from it. Treating it as terminal would teach the
            # agent that states near the limit are worthless.
            return ts.truncation(observation, reward, discount)
        return ts.transition(observation, reward, discount)

    def render(self, mode='rgb_array'):
        """Delegates to the Gymnasium env.

        Gymnasium fixes the render mode when the env is made (`render_mode`),
        so `mode` is accepted only for TF-Agents API compatibility.
        """
        del mode
        return self._gym_env.render()

    def close(self):
        """Closes the Gymnasium env, which this adapter owns."""
        self._gym_env.close()
