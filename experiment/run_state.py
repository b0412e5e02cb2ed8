"""Run-level results that must survive a resume (kept in the checkpoint).

Without this, a resumed run would report only what its last process saw:
the best eval return, the env step at which the target was first reached,
and the wall time would all start over.
"""

import math

import tensorflow as tf


class RunState(tf.Module):
    """Eval results and accumulated wall time, as checkpointed variables."""

    def __init__(self):
        super().__init__(name='run_state')
        self._best = tf.Variable(-math.inf, dtype=tf.float64, trainable=False)
        self._last = tf.Variable(math.nan, dtype=tf.float64, trainable=False)
        self._last_step = tf.Variable(-1, dtype=tf.int64, trainable=False)
        self._steps_to_target = tf.Variable(-1, dtype=tf.int64, trainable=False)
        self._wall_time = tf.Variable(0.0, dtype=tf.float64, trainable=False)

    def record_eval(self, step, average_return, target_return):
        self._last.assign(average_return)
        self._last_step.assign(step)
        self._best.assign(max(float(self._best.numpy()), average_return))
        if (target_return is not None and self.steps_to_target is None
                and average_return >= target_return):
            self._steps_to_target.assign(step)

    def add_wall_time(self, seconds):
        self._wall_time.assign_add(seconds)

    @property
    def best_eval_return(self):
        best = float(self._best.numpy())
        return None if math.isinf(best) else best

    @property
    def last_eval_return(self):
        last = float(self._last.numpy())
        return None if math.isnan(last) else last

    @property
    def last_eval_step(self):
        step = int(self._last_step.numpy())
        return None if step < 0 else step

    @property
    def steps_to_target(self):
        step = int(self._steps_to_target.numpy())
        return None if step < 0 else step

    @property
    def wall_time_s(self):
        return float(self._wall_time.numpy())
