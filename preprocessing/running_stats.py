"""Running mean and variance per feature, merged batch by batch (float64).

Chan et al.'s parallel update: a batch's own mean and variance are merged into
the running ones, so a batch from N env copies counts as N samples and the
result equals numpy's mean/var over everything seen (up to float64 rounding),
whatever the batch sizes were.
"""

import tensorflow as tf


class RunningMeanStd(tf.Module):
    """Count, mean and (population) variance of a stream of `shape`-shaped samples."""

    def __init__(self, shape, name='running_mean_std'):
        super().__init__(name=name)
        shape = tf.TensorShape(shape)
        self.count = tf.Variable(tf.zeros([], tf.float64), trainable=False, name='count')
        self.mean = tf.Variable(tf.zeros(shape, tf.float64), trainable=False, name='mean')
        # Variance 1 until data arrives: an unused statistic is the identity transform.
        self.var = tf.Variable(tf.ones(shape, tf.float64), trainable=False, name='var')

    def update(self, samples, mask=None):
        """Merges `samples` ([N, *shape]; rows where `mask` is False are left out)."""
        samples = tf.cast(samples, tf.float64)
        if mask is None:
            weights = tf.ones(tf.shape(samples)[:1], tf.float64)
        else:
            weights = tf.cast(mask, tf.float64)
        weights = tf.reshape(weights, [-1] + [1] * (samples.shape.rank - 1))
        batch_count = tf.reduce_sum(weights)
        safe_count = tf.maximum(batch_count, 1.0)
        batch_mean = tf.reduce_sum(samples * weights, axis=0) / safe_count
        batch_var = tf.reduce_sum(tf.square(samples - batch_mean) * weights, axis=0) / safe_count
        count = self.count.read_value()
        total = count + batch_count
        safe_total = tf.maximum(total, 1.0)
        delta = batch_mean - self.mean
        new_mean = self.mean + delta * batch_count / safe_total
        # For a first batch (count 0) this is exactly the batch's own mean and variance.
        new_var = (self.var * count + batch_var * batch_count
                   + tf.square(delta) * count * batch_count / safe_total) / safe_total
        has_data = batch_count > 0
        self.mean.assign(tf.where(has_data, new_mean, self.mean))
        self.var.assign(tf.where(has_data, new_var, self.var))
        self.count.assign(total)

    @property
    def std(self):
        return tf.sqrt(self.var)
