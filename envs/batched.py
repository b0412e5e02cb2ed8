"""N Gymnasium envs stepped in-process as one batched PyEnvironment, fast.

TF-Agents' `BatchedPyEnvironment` builds a `TimeStep` per copy and then
stacks them leaf by leaf; for CartPole that costs ~50 us per copy and step,
seven times the env's own step. Here each copy's results are written straight
into preallocated arrays, and the auto-reset (the step after a LAST step
starts a new episode and ignores the action) is done per copy in the same
loop. Semantics match `GymnasiumEnvironment` exactly: terminated -> LAST
with discount 0, truncated -> LAST with the env's discount (bootstrap).
"""

import numpy as np
import tensorflow as tf
from tf_agents.environments import py_environment
from tf_agents.trajectories import time_step as ts

from envs.gymnasium_env import _match_spec

_FIRST, _MID, _LAST = (np.int32(t) for t in (ts.StepType.FIRST, ts.StepType.MID,
                                             ts.StepType.LAST))


class BatchedGymnasiumEnvironment(py_environment.PyEnvironment):
    """Steps `GymnasiumEnvironment` copies in turn, writing into batched arrays."""

    def __init__(self, envs):
        """Takes ownership of `envs`, a list of `GymnasiumEnvironment` with equal specs."""
        super().__init__(handle_auto_reset=False)
        self._envs = list(envs)
        self._num = len(self._envs)
        self._observation_spec = self._envs[0].observation_spec()
        self._action_spec = self._envs[0].action_spec()
        self._flat_observation = not tf.nest.is_nested(self._observation_spec)
        self._flat_action = not tf.nest.is_nested(self._action_spec)
        self._step_type = np.full(self._num, _LAST, np.int32)
        self._reward = np.zeros(self._num, np.float32)
        self._discount = np.ones(self._num, np.float32)
        self._observations = [None] * self._num
        if self._flat_observation:
            spec = self._observation_spec
            self._observation = np.zeros((self._num, *spec.shape), spec.dtype)

    @property
    def batched(self):
        return True

    @property
    def batch_size(self):
        return self._num

    @property
    def envs(self):
        return self._envs

    def observation_spec(self):
        return self._observation_spec

    def action_spec(self):
        return self._action_spec

    def _reset(self):
        for index in range(self._num):
            self._restart(index)
        return self._time_step()

    def _step(self, action):
        for index in range(self._num):
            self._step_copy(index, action[index] if self._flat_action
                            else tf.nest.map_structure(lambda a, i=index: a[i], action))
        return self._time_step()

    def step_copies(self, rows, action):
        """Steps only the copies listed in `rows` (`action` holds one row per listed copy).

        The other copies are left alone and keep their last time step. Evaluation plays one
        episode per copy and uses this once a copy's episode has ended: a stalled Atari game
        then costs one copy per step, not the whole batch, until the 108k-frame cap.
        """
        for position, index in enumerate(rows):
            self._step_copy(index, action[position] if self._flat_action
                            else tf.nest.map_structure(lambda a, p=position: a[p], action))
        self._current_time_step = self._time_step()
        return self._current_time_step

    def _step_copy(self, index, action):
        if self._step_type[index] == _LAST:
            self._restart(index)  # auto-reset: this copy's action is ignored
            return
        observation, reward, terminated, truncated, discount = self._envs[index].step_gym(action)
        self._reward[index] = reward
        if terminated:
            self._step_type[index], self._discount[index] = _LAST, 0.0
        elif truncated:
            self._step_type[index], self._discount[index] = _LAST, discount
        else:
            self._step_type[index], self._discount[index] = _MID, discount
        self._set_observation(index, observation)

    def _restart(self, index):
        self._set_observation(index, self._envs[index].reset_gym())
        self._step_type[index], self._reward[index], self._discount[index] = _FIRST, 0.0, 1.0

    def _set_observation(self, index, observation):
        if self._flat_observation:
            self._observation[index] = observation  # casts, e.g. float64 -> float32
        else:
            self._observations[index] = _match_spec(self._observation_spec, observation)

    def _time_step(self):
        if self._flat_observation:
            observation = self._observation.copy()
        else:
            observation = tf.nest.map_structure(lambda *leaves: np.stack(leaves),
                                                *self._observations)
        return ts.TimeStep(self._step_type.copy(), self._reward.copy(), self._discount.copy(),
                           observation)

    def render(self, mode='rgb_array'):
        return np.stack([env.render(mode) for env in self._envs])

    def close(self):
        for env in self._envs:
            env.close()
