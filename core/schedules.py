"""Schedules evaluated inside compiled functions (epsilon, importance-sampling beta)."""

import tensorflow as tf


def linear_schedule(counter, start, end, steps):
    """Returns a callable: `start` -> `end` linearly over `steps` counts, then flat.

    The callable reads `counter` (a TF variable) each time it is called, so it
    can be handed to policies or loops traced once into a `tf.function`.
    """
    def value():
        fraction = tf.minimum(tf.cast(counter, tf.float32) / float(max(steps, 1)), 1.0)
        return start + fraction * (end - start)
    return value
