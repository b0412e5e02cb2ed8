"""Running mean and variance per feature, merged batch by batch (float64).

Chan et al.'s parallel update: a batch's own mean and variance are merged into
the running ones, so a batch from N env copies counts as N samples and the
result equals numpy's mean/var over everything seen (up to float64 rounding),
whatever the batch sizes were.

Collection adds a batch every env step; merging each one would put the whole
update into the per-step loop. `accumulate` only adds the batch to pending
shifted sums (a few ops), and `merge_pending` folds them into the running
statistics once per collect chunk. The sums are taken around the running mean
of the last merge (the shift), so the variance stays exact in float64 even when
a feature's mean is far larger than its spread (only the very first chunk is
summed around 0: for a mean 10^k times the spread it loses ~2k of float64's 16
digits there).
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
        # Samples accumulated since the last merge, as sums around `shift` (checkpointed too,
        # so a checkpoint between a chunk's steps and its merge loses nothing).
        self.pending_count = tf.Variable(tf.zeros([], tf.float64), trainable=False,
                                         name='pending_count')
        self.pending_sum = tf.Variable(tf.zeros(shape, tf.float64), trainable=False,
                                       name='pending_sum')
        self.pending_squares = tf.Variable(tf.zeros(shape, tf.float64), trainable=False,
                                           name='pending_squares')
        self.shift = tf.Variable(tf.zeros(shape, tf.float64), trainable=False, name='shift')

    def accumulate(self, samples, mask=None):
        """Adds `samples` ([N, *shape]; rows where `mask` is False left out) to the pending sums."""
        # Sums around the running mean of the last merge: small values, an exact variance.
        centered = tf.cast(samples, tf.float64) - self.shift
        if mask is None:
            count = tf.cast(tf.shape(centered)[0], tf.float64)
        else:
            weights = tf.cast(mask, tf.float64)
            count = tf.reduce_sum(weights)
            if centered.shape.rank > 1:
                weights = tf.reshape(weights, [-1] + [1] * (centered.shape.rank - 1))
            centered *= weights
        self.pending_count.assign_add(count)
        self.pending_sum.assign_add(tf.reduce_sum(centered, axis=0))
        self.pending_squares.assign_add(tf.reduce_sum(tf.square(centered), axis=0))

    def merge_pending(self):
        """Folds the pending samples into the running statistics (Chan et al.)."""
        batch_count = self.pending_count.read_value()
        safe_count = tf.maximum(batch_count, 1.0)
        centered_mean = self.pending_sum / safe_count
        batch_var = tf.maximum(self.pending_squares / safe_count - tf.square(centered_mean), 0.0)
        offset = self.shift + centered_mean - self.mean  # the batch mean minus the running mean
        count = self.count.read_value()
        total = count + batch_count
        safe_total = tf.maximum(total, 1.0)
        new_mean = self.mean + offset * batch_count / safe_total
        # For a first batch (count 0) this is exactly the batch's own mean and variance.
        new_var = (self.var * count + batch_var * batch_count
                   + tf.square(offset) * count * batch_count / safe_total) / safe_total
        has_data = batch_count > 0
        self.mean.assign(tf.where(has_data, new_mean, self.mean))
        self.var.assign(tf.where(has_data, new_var, self.var))
        self.count.assign(total)
        self.shift.assign(self.mean)
        self.discard_pending()

    def discard_pending(self):
        self.pending_count.assign(tf.zeros_like(self.pending_count))
        self.pending_sum.assign(tf.zeros_like(self.pending_sum))
        self.pending_squares.assign(tf.zeros_like(self.pending_squares))

    def update(self, samples, mask=None):
        """Merges `samples` at once (accumulate, then merge)."""
        self.accumulate(samples, mask)
        self.merge_pending()

    @property
    def std(self):
        return tf.sqrt(self.var)
