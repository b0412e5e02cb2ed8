"""Partially observed tasks: an observation wrapper that hides chosen entries.

Why: a feed-forward agent solves CartPole or Pendulum because their
observation holds the whole state. Hiding the velocities (CartPole's entries
1 and 3, Pendulum's entry 2) leaves a task only an agent with memory can solve,
the standard benchmark for recurrent agents (TF-Agents' MaskedCartPole, the
R2D2 paper's flickering tasks). It works on any registered id whose
observation is a flat Box, including ids registered by an importable package
(`module:EnvId`, as `gymnasium.make` accepts them).
"""

import gymnasium
import numpy as np

from core.errors import UserError


class HiddenObservations(gymnasium.ObservationWrapper):
    """Drops the observation entries at `hidden` (indices into a flat Box)."""

    def __init__(self, env, hidden):
        super().__init__(env)
        space = env.observation_space
        env_id = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
        if not isinstance(space, gymnasium.spaces.Box) or len(space.shape) != 1:
            raise UserError(f"make_env.hidden_observations needs a flat Box observation, but "
                            f"{env_id} observes {space}: remove the binding for this env.")
        size = space.shape[0]
        indices = sorted(set(hidden))
        if not indices or any(isinstance(i, bool) or not isinstance(i, int) for i in indices):
            raise UserError(f"make_env.hidden_observations must list entry indices (whole "
                            f"numbers), got {tuple(hidden)!r}.")
        bad = [i for i in indices if not 0 <= i < size]
        if bad or len(indices) == size:
            raise UserError(f"make_env.hidden_observations={tuple(hidden)!r} does not fit "
                            f"{env_id}'s {size} observation entries: hide some of 0..{size - 1}, "
                            "not all.")
        self._kept = np.array([i for i in range(size) if i not in indices])
        self.observation_space = gymnasium.spaces.Box(
            space.low[self._kept], space.high[self._kept], dtype=space.dtype)

    def observation(self, observation):
        return np.asarray(observation)[self._kept]
