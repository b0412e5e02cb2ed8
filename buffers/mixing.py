"""Mixing two replay sources at a fixed ratio (e.g. 25% logged, 75% online).

Mixing is a combinator over sources, not a backend: every batch is split
into a fixed number of rows from each source, so the ratio holds exactly in
every batch (no drift from random per-element choice), and prioritized
feedback goes back to the source each row came from.
"""

import numpy as np
import tensorflow as tf

from buffers.base import SampleInfo
from core.errors import UserError


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
        # XLA only if both sources compile; priorities go back to whichever source has them.
        self.xla = first.capabilities.xla and second.capabilities.xla

    @property
    def fraction(self):
        return self._fraction

    def sample(self, batch_size, num_steps):
        """One mixed batch; callable inside tf.function (and XLA if both sources are)."""
        window, info, _ = self.sample_counted(batch_size, num_steps)
        return window, info

    def sample_counted(self, batch_size, num_steps):
        """One mixed batch and the rows each source really returned, `[first, second]`.

        The counts come from the sampled parts themselves, not from the fraction: what
        `buffer/logged_fraction_sampled` reports is what the learner was given.
        """
        n_first, n_second = split_batch(batch_size, self._fraction)
        parts, rows = [], []
        for source, n in ((self._first, n_first), (self._second, n_second)):
            if n:
                parts.append(source.sample(n, num_steps))
                rows.append(tf.shape(parts[-1][1].keys, out_type=tf.int64)[0])
            else:
                rows.append(tf.constant(0, tf.int64))
        window, info = _concat(parts)
        return window, info, rows

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
    """One batch from per-source parts.

    Probabilities are made relative within each part (divided by the part's
    smallest): the share of each source is fixed by design, not drawn, so
    importance weights must correct only for prioritisation inside a source.
    Uniform rows thus get weight 1 whichever source they came from.
    """
    parts = [(w, SampleInfo(i.keys, i.probabilities / tf.reduce_min(i.probabilities)))
             for w, i in parts]
    if len(parts) == 1:
        return parts[0]
    windows = tf.nest.map_structure(lambda *leaves: tf.concat(leaves, 0), *[w for w, _ in parts])
    info = SampleInfo(keys=tf.concat([i.keys for _, i in parts], 0),
                      probabilities=tf.concat([i.probabilities for _, i in parts], 0))
    return windows, info


class MixedReplay:
    """A replay backend for offline-to-online: writes go online, reads mix in logged data.

    Every batch holds `logged_fraction` rows from the logged dataset (loaded
    once, never written) and the rest from the online backend. Counters of
    the rows actually drawn from each source feed `buffer/logged_fraction_sampled`
    in TensorBoard. Only the online backend is checkpointed: the logged data
    is reloaded from its dataset on resume.
    """

    def __init__(self, online, logged, *, logged_fraction, batch_size):
        self.online, self.logged = online, logged
        self._mixed = MixedSource(online, logged, fraction=logged_fraction)
        self._batch_size = batch_size
        # The online backend's: writes and checkpoints go there; no concurrent writes (the
        # mixing counters), no bulk steps (nothing imports into a mixed buffer).
        self.capabilities = online.capabilities.narrowed(
            xla=self._mixed.xla, concurrent_writes=False, bulk_steps=False)
        self._sampled_logged = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._sampled_online = tf.Variable(0, dtype=tf.int64, trainable=False)

    def add(self, trajectory):
        self.online.add(trajectory)

    def sample(self, batch_size, num_steps):
        windows, info, (rows_online, rows_logged) = self._mixed.sample_counted(batch_size,
                                                                              num_steps)
        self._sampled_online.assign_add(rows_online)
        self._sampled_logged.assign_add(rows_logged)
        return windows, info

    def as_dataset(self, batch_size, num_steps):
        return self._mixed.as_dataset(batch_size, num_steps)

    def update_priorities(self, keys, priorities):
        self._mixed.update_priorities(keys, priorities)

    def metrics(self):
        values = dict(self.online.metrics())
        logged, online = float(self._sampled_logged.numpy()), float(self._sampled_online.numpy())
        values['logged_size'] = float(self.logged.metrics()['size'])
        values['logged_sampled'] = logged
        values['logged_fraction_sampled'] = logged / max(logged + online, 1.0)
        return values

    def histograms(self):
        return self.online.histograms()

    def ages(self, keys):
        """Ages of the online rows only (logged rows have no insertion time in this run)."""
        rows_online, _ = split_batch(self._batch_size, self._mixed.fraction)
        keys = np.asarray(keys).reshape(-1, self._batch_size)[:, :rows_online]
        return self.online.ages(keys.reshape(-1))

    def checkpoint_items(self):
        items = dict(self.online.checkpoint_items())
        items['mixing_counters'] = tf.train.Checkpoint(
            logged=self._sampled_logged, online=self._sampled_online)
        return items

    def close(self):
        self.online.close()
        self.logged.close()
