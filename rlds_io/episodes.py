"""Turns a stream of batched transitions into whole RLDS episodes.

RLDS (https://github.com/google-research/rlds) stores an episode as a list of
steps; step t holds the observation o_t, the action a_t taken there, and the
reward and discount that followed that action. The last step (`is_last`) holds
the final observation; `is_terminal` says the episode ended in a terminal
state (Gymnasium's `terminated`) rather than by a time limit (`truncated`).

Our collection loops produce TF-Agents `Trajectory`s from batched
auto-resetting envs: row t of env copy i is (step_type_t, o_t, a_t,
next_step_type, r_{t+1}, discount_{t+1}), and the LAST row of an episode is the
LAST -> FIRST boundary. That maps one-to-one onto RLDS steps, which is why
export and import (TF-Agents' `rlds_to_reverb.convert_rlds_to_trajectories`)
round-trip exactly: the one exception is the discount stored on a terminal
episode's final (boundary) row, which the importer sets to 0; that row is
never a training transition (the loop gives it weight 0).
"""

import numpy as np
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

STEP_FIELDS = ('observation', 'action', 'reward', 'discount', 'is_first', 'is_last',
               'is_terminal')


class EpisodeRecorder:
    """Collects batched numpy transitions; hands out every episode once it is complete.

    Steps before an env copy's first FIRST step are dropped (an episode
    already under way when recording started has no beginning), and so is
    whatever is in flight when recording stops: datasets hold whole episodes.
    """

    def __init__(self, num_envs):
        self._open = [None] * num_envs
        self._complete = []

    def add(self, trajectory):
        """Adds one batched step (a `Trajectory` of numpy arrays with leading dim N)."""
        step_type = np.asarray(trajectory.step_type)
        for i in range(step_type.shape[0]):
            if step_type[i] == ts.StepType.FIRST:
                self._open[i] = []
            steps = self._open[i]
            if steps is None:
                continue
            row = tf.nest.map_structure(lambda x, i=i: np.asarray(x)[i], trajectory)
            steps.append(row)
            if step_type[i] == ts.StepType.LAST:
                self._complete.append(_to_rlds_episode(steps))
                self._open[i] = None

    def pop_complete(self):
        """Returns the episodes completed since the last call, oldest first."""
        episodes, self._complete = self._complete, []
        return episodes


def _to_rlds_episode(rows):
    """RLDS steps of one episode from its trajectory rows (FIRST ... LAST)."""
    terminal = len(rows) > 1 and float(rows[-2].discount) == 0.0
    last = len(rows) - 1
    steps = {
        'observation': tf.nest.map_structure(lambda *x: np.stack(x),
                                             *[r.observation for r in rows]),
        'action': tf.nest.map_structure(lambda *x: np.stack(x), *[r.action for r in rows]),
        'reward': np.array([r.reward for r in rows], np.float32),
        'discount': np.array([r.discount for r in rows], np.float32),
        'is_first': np.arange(len(rows)) == 0,
        'is_last': np.arange(len(rows)) == last,
        'is_terminal': (np.arange(len(rows)) == last) & terminal,
    }
    return steps


def episode_return(episode):
    """Undiscounted return: every reward but the final step's (no action follows it)."""
    return float(np.sum(episode['reward'][:-1]))


def episode_transitions(episode):
    """RLDS steps in an episode; each becomes one stored trajectory row."""
    return int(episode['reward'].shape[0])
