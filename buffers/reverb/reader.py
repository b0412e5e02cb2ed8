"""The read side of a Reverb replay table: Reverb's own datasets, decoded, with a memory.

Sampling streams through `reverb.TrajectoryDataset` (samples are requested ahead
of use, `max_in_flight_samples_per_worker`), decoded from the table's columns
back into the agent's `Trajectory`. The last `RECENT` sampled windows' keys,
first-step ids and priorities are remembered: Reverb keys are random and a
table's priorities cannot be listed cheaply, so `ages` and the priority
histogram come from there.
"""

import numpy as np
import reverb
import tensorflow as tf

from buffers.base import SampleInfo
from core.errors import UserError

SIGNATURE_TIMEOUT_S = 30
RECENT = 16384  # sampled windows remembered for `ages` and `histograms`


class WindowReader:
    """Batches of `(window, SampleInfo)` from one table, for `sample` and `as_dataset`."""

    def __init__(self, layout, *, table_name, num_steps, max_in_flight, num_workers, timeout_ms,
                 repeat):
        """Sets up the reader; `connect` points it at a server.

        Args:
          layout: the table's `Layout`.
          table_name: the table to sample.
          num_steps: the table's window length (the only one it serves).
          max_in_flight: samples each dataset worker keeps requested (None: twice the
            batch size).
          num_workers: sampling streams per dataset iterator (-1: Reverb's own choice).
          timeout_ms: how long sampling waits on an empty table before failing.
          repeat: reopen a stream that ended on a timeout (in-process use); a remote
            learner reopens the backend itself instead.
        """
        self._layout = layout
        self._table_name = table_name
        self._num_steps = num_steps
        self._max_in_flight = max_in_flight
        self._num_workers = num_workers
        self.timeout_ms = int(timeout_ms)
        self._repeat = repeat
        self.num_sampled = tf.Variable(0, dtype=tf.int64, trainable=False, name='num_sampled')
        # Not checkpointed: they describe recent samples.
        self._recent = {
            'keys': tf.Variable(tf.fill([RECENT], tf.constant(-1, tf.int64)), trainable=False),
            'ids': tf.Variable(tf.zeros([RECENT], tf.int64), trainable=False),
            'priorities': tf.Variable(tf.zeros([RECENT], tf.float64), trainable=False),
        }
        self._recent_count = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.address = None
        self._iterators = {}

    def connect(self, address):
        """Reads from the server at `address`; iterators are opened on first use."""
        self.address = address
        self._iterators = {}

    def check_num_steps(self, num_steps, owner):
        if num_steps != self._num_steps:
            raise UserError(
                f"{owner} stores fixed {self._num_steps}-step windows (chosen when it was "
                f"built) and cannot serve {num_steps}-step samples: build it with "
                f"num_steps={num_steps}.")

    def samples(self, batch_size):
        """Reverb's own dataset of raw samples, one `ReplaySample` per element."""
        dataset = reverb.TrajectoryDataset.from_table_signature(
            server_address=self.address,
            table=self._table_name,
            max_in_flight_samples_per_worker=self._max_in_flight or 2 * batch_size,
            num_workers_per_iterator=self._num_workers,
            rate_limiter_timeout_ms=self.timeout_ms,
            get_signature_timeout_secs=SIGNATURE_TIMEOUT_S)
        if self._repeat:
            # repeat() reopens a stream that ended on a timeout, but ends the dataset
            # when a whole pass timed out without data: only an empty table stops it.
            dataset = dataset.repeat()
        return dataset

    def dataset(self, batch_size):
        """Reverb's own dataset of raw samples, batched."""
        return self.samples(batch_size).batch(batch_size, drop_remainder=True)

    def decode(self, sample):
        """Reverb's `ReplaySample` -> `(nest [B, T, ...], SampleInfo, first-step ids)`."""
        # The layout repacks into the data spec's own structure, so agents receive
        # their Trajectory type (not the signature's look-alike namedtuples).
        window, ids = self._layout.decode(sample.data)
        info = SampleInfo(keys=tf.bitcast(sample.info.key, tf.int64),
                          probabilities=tf.cast(sample.info.probability, tf.float32))
        return window, info, ids

    def windows(self, batch_size):
        """An endless dataset of `(window, SampleInfo)` batches."""
        # Decoded on tf.data's threads, ahead of use: off the learner's critical path.
        return self.dataset(batch_size).map(lambda sample: self.decode(sample)[:2],
                                            num_parallel_calls=tf.data.AUTOTUNE)

    def sample(self, batch_size, prepare):
        """One batch `(window, SampleInfo)` from a cached iterator; callable in tf.function.

        `prepare()` runs eagerly before an iterator is first opened (a flush, and the
        check that the table is not empty).
        """
        element = self._iterator(batch_size, prepare).get_next_as_optional()
        has_value = tf.debugging.Assert(element.has_value(), [
            f"Reverb table '{self._table_name}' at {self.address} gave no sample within "
            f"rate_limiter_timeout_ms={self.timeout_ms}: it is empty or its server stopped."])
        with tf.control_dependencies([has_value]):
            sample = element.get_value()
        window, info, ids = self.decode(sample)
        self._remember(sample, info.keys, ids)
        self.num_sampled.assign_add(batch_size)
        return window, info

    def _iterator(self, batch_size, prepare):
        iterator = self._iterators.get(batch_size)
        if iterator is None:
            with tf.init_scope():
                prepare()
                iterator = iter(self.dataset(batch_size))
            self._iterators[batch_size] = iterator
        return iterator

    def _remember(self, sample, keys, ids):
        """Records sampled keys, first-step ids and priorities in the recent ring."""
        batch_size = tf.shape(keys, out_type=tf.int64)[0]
        slots = (self._recent_count + tf.range(batch_size)) % RECENT
        slots = slots[-RECENT:, None]  # a batch larger than the ring keeps its tail
        for name, values in (('keys', keys), ('ids', ids),
                             ('priorities', sample.info.priority)):
            self._recent[name].scatter_nd_update(slots, values[-RECENT:])
        self._recent_count.assign_add(batch_size)

    def first_ids(self, keys):
        """The first-step id of each recently sampled key (NaN for keys not among them)."""
        known = dict(zip(self._recent['keys'].numpy().tolist(),
                         self._recent['ids'].numpy().tolist()))
        known.pop(-1, None)  # ring slots never written
        return np.array([known.get(key, np.nan) for key in np.asarray(keys).tolist()],
                        np.float64)

    def recent_priorities(self):
        """The stored priorities of the last sampled windows (at most `RECENT`)."""
        count = min(int(self._recent_count.numpy()), RECENT)
        return self._recent['priorities'].numpy()[:count]

    def close(self):
        self._iterators = {}
