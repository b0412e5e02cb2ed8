"""Greedy evaluation over N episodes run side by side.

Each of the N batched eval env copies plays exactly one episode per
evaluation, so one evaluation is a handful of batched policy calls rather than
N * episode_length Python-level steps.
"""

import numpy as np
import tensorflow as tf
from tf_agents.specs import tensor_spec


class Evaluator:
    """Plays one episode in each copy of a batched py environment."""

    def __init__(self, py_env, policy):
        self._env = py_env
        batched_spec = tensor_spec.add_outer_dims_nest(policy.time_step_spec, (None,))
        self._action = tf.function(
            lambda time_step: policy.action(time_step).action,
            input_signature=[batched_spec])

    def __call__(self):
        """Returns (average return, average episode length) over the copies."""
        time_step = self._env.reset()
        num = self._env.batch_size
        returns = np.zeros(num, np.float64)
        lengths = np.zeros(num, np.int64)
        done = np.zeros(num, bool)
        while not done.all():
            action = self._action(tf.nest.map_structure(tf.convert_to_tensor, time_step))
            time_step = self._env.step(action.numpy())
            active = ~done
            returns += np.where(active, time_step.reward, 0.0)
            lengths += active
            done |= time_step.is_last()
        return float(returns.mean()), float(lengths.mean())
