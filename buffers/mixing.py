"""Mixing two replay sources at a fixed ratio (e.g. 25% logged, 75% online).

Mixing is a combinator over sources, not a backend: every batch is split
into a fixed number of rows from each source, so the ratio holds exactly in
every batch (no drift from random per-element choice), and prioritized
feedback goes back to the source each row came from.
"""

import tensorflow as tf

from buffers.base import SampleInfo
from experiment.errors import UserError


def split_batch(batch_size, fraction):
    """Rows drawn from (first, second) source when `fraction` comes from the second."""
    if not 0.0 <= fraction <= 1.0:
        raise UserError(f"A mixing fraction must lie in [0, 1], got {fraction}.")
    second = int(round(batch_size * fraction))
    return batch_size - second, second


class MixedSource:
    """Samples `1 - fraction` of each batch from `first` and `fraction` from `second`.

    Both sources follow the `ReplayBackend` read side (`sample`, `as_dataset`,
    `update_priorities`). Rows [0, n_first) of a batch come from `first`.
    """

    def __init__(self, first, second, *, fraction):
        self._first, self._second = first, second
        self._fraction = fraction
        self.supports_xla = bool(getattr(first, 'supports_xla', False)
                                 and getattr(second, 'supports_xla', False))

    @property
    def fraction(self):
        return self._fraction

    def sample(self, batch_size, num_steps):
        """One mixed batch; callable inside tf.function (and XLA if both sources are)."""
        n_first, n_second = split_batch(batch_size, self._fraction)
        parts = [source.sample(n, num_steps)
                 for source, n in ((self._first, n_first), (self._second, n_second)) if n]
        return _concat(parts)

    def as_dataset(self, batch_size, num_steps):
        n_first, n_second = split_batch(batch_size, self._fraction)
        datasets = [source.as_dataset(n, num_steps)
                    for source, n in ((self._first, n_first), (self._second, n_second)) if n]
        if len(datasets) == 1:
            return datasets[0]
        return tf.data.Dataset.zip(tuple(datasets)).map(lambda *parts: _concat(parts))

    def update_priorities(self, keys, priorities):
        n_first, _ = split_batch(int(keys.shape[0]), self._fraction)
        self._first.update_priorities(keys[:n_first], priorities[:n_first])
        self._second.update_priorities(keys[n_first:], priorities[n_first:])

    @staticmethod
    def source_of_rows(batch_size, fraction):
        """0/1 per row: which source it came from (1 = second); for ratio summaries."""
        n_first, n_second = split_batch(batch_size, fraction)
        return tf.concat([tf.zeros([n_first], tf.int32), tf.ones([n_second], tf.int32)], 0)


def _concat(parts):
    if len(parts) == 1:
        return parts[0]
    windows = tf.nest.map_structure(lambda *leaves: tf.concat(leaves, 0), *[w for w, _ in parts])
    info = SampleInfo(keys=tf.concat([i.keys for _, i in parts], 0),
                      probabilities=tf.concat([i.probabilities for _, i in parts], 0))
    return windows, info
