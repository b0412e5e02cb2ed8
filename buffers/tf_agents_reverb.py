"""TF-Agents' Reverb replay buffer and trajectory observer, ours: same constructors, same
behaviour, and a faster table layout when the table asks for it. This module holds the table
(`table`, its packed signature and the layout checks) and the reading side,
`ReverbReplayBuffer`; the writing side, `ReverbAddTrajectoryObserver`, is in
buffers/tf_agents_reverb_observer.py (it imports the layout checks from here).

A TF-Agents script that writes with `reverb_utils.ReverbAddTrajectoryObserver` and reads with
`reverb_replay_buffer.ReverbReplayBuffer` swaps in our `ReverbAddTrajectoryObserver` and
`ReverbReplayBuffer` (both also in buffers/tf_agents_api.py) and changes nothing else: on
the tables it already builds (signature `tensor_spec.add_outer_dim(data_spec)`, one column
per leaf, or no signature at all) they write and read exactly what TF-Agents' classes do --
TF-Agents' own test files pass against them (tests/unit/test_tf_agents_rlds_suite.py).

The speed comes from the table. Build it with `table(name, data_spec, sequence_length, ...)`
instead of `reverb.Table(..., signature=add_outer_dim(data_spec))`, pass `data_spec=` to the
observer, and both classes switch to our packed layout (buffers/reverb/layout.py): every
small leaf of a step goes as raw bytes into one uint8 column, so a CartPole-like step is one
column instead of six (Reverb's cost per insert and per sample grows with the number of
columns; docs/benchmarks.md "Replay buffers"). The layout is declared by the table -- the
packed signature names its columns -- and read from the server's table info, never guessed
from data. `get_table_signature()` still returns the logical `add_outer_dim(data_spec)`, so
`rlds_to_reverb.push_rlds_to_reverb` works on either table, and the buffer's
`as_dataset` decodes the columns back into `data_spec`'s nest (a `Trajectory`), with
TF-Agents' `(data, reverb.SampleInfo)` elements.

Reading decodes with `Layout` (buffers/reverb/layout.py) but opens its own Reverb streams
rather than `WindowReader`'s: TF-Agents' elements carry `reverb.SampleInfo` repeated over
time, come from its interleaved streams (`max_cycle_length`, `max_samples_per_stream`), and
need no ring of recently sampled keys (`WindowReader` keeps one for our metrics).

What differs from TF-Agents, on purpose: `get_next` works (TF-Agents' raises
`NotImplementedError`): it draws from a cached `as_dataset` iterator per argument set.
A packed table has a fixed sequence length (the observer's, declared in the signature);
`sequence_length=None` reads it from the table and another value is refused.
"""

import reverb
import tensorflow as tf
from tf_agents.replay_buffers import replay_buffer

from buffers.reverb.layout import Layout
from core.errors import UserError

__all__ = ['ReverbReplayBuffer', 'ReverbTableError', 'is_packed', 'packed_layout',
           'packed_signature', 'table']

# A packed table's last column has this name; its own-column leaves are named `LEAF_PREFIX<i>`.
PACKED_COLUMN = 'tf_agents_reverb.packed_steps'
LEAF_PREFIX = 'tf_agents_reverb.leaf'


class ReverbTableError(UserError, ValueError):
    """A table that does not fit the observer or buffer given it (a `ValueError`, as TF-Agents
    raises for its own argument checks)."""


def packed_signature(data_spec, sequence_length):
    """The signature of a packed table storing `sequence_length`-step items of `data_spec`.

    `Layout`'s columns (the leaves of at least 256 bytes and strings in columns of their own,
    every smaller leaf packed into one uint8 column) with names that declare the layout.
    """
    layout = Layout(data_spec, int(sequence_length))
    *own, packed = layout.signature
    return (*(tf.TensorSpec(spec.shape, spec.dtype, name=f'{LEAF_PREFIX}{k}')
              for k, spec in enumerate(own)),
            tf.TensorSpec(packed.shape, packed.dtype, name=PACKED_COLUMN))


def table(name, data_spec, sequence_length, *, max_size, sampler=None, remover=None,
          rate_limiter=None, max_times_sampled=0):
    """A `reverb.Table` in our packed layout for `ReverbAddTrajectoryObserver(...,
    data_spec=data_spec)` and `ReverbReplayBuffer`.

    Defaults: `Uniform` sampler, `Fifo` remover, `MinSize(1)` rate limiter.

    The packed column also holds `Layout`'s int64 first-step id (8 bytes a step; the observer
    writes its own step count there). We keep it rather than a layout without it because the
    table is then column-for-column the one our Reverb backends use (buffers/reverb/backend.py,
    same `Layout`): a `ReverbUniformReplay(..., server_address=...)` can sample it too, and
    one layout class serves both.
    """
    return reverb.Table(
        name=name,
        sampler=sampler or reverb.selectors.Uniform(),
        remover=remover or reverb.selectors.Fifo(),
        max_size=int(max_size),
        rate_limiter=rate_limiter or reverb.rate_limiters.MinSize(1),
        max_times_sampled=max_times_sampled,
        signature=packed_signature(data_spec, sequence_length))


def is_packed(signature):
    """Whether a table's signature declares our packed layout."""
    return (isinstance(signature, tuple) and len(signature) > 0
            and isinstance(signature[-1], tf.TensorSpec) and signature[-1].name == PACKED_COLUMN)


def packed_layout(signature, data_spec, table_name, sequence_length=None):
    """The `Layout` of a packed table, checked against `data_spec` (and `sequence_length`)."""
    length = signature[-1].shape[0]
    if sequence_length is not None and sequence_length != length:
        raise ReverbTableError(
            f"Reverb table '{table_name}' stores packed {length}-step items: use "
            f"sequence_length={length} (or None), not {sequence_length}.")
    if packed_signature(data_spec, length) != signature:
        raise ReverbTableError(
            f"Reverb table '{table_name}' was built for another data spec: build it with "
            "tf_agents_reverb.table(name, data_spec, sequence_length) from this data_spec.")
    return Layout(data_spec, length)


# -- Reading ---------------------------------------------------------------------------------------

def _broadcast_info(info, time):
    """`reverb.SampleInfo` of one sample `[]` or a batch `[B]` -> repeated over time, as
    TF-Agents gives it (`[T]` or `[B, T]`)."""
    return tf.nest.map_structure(
        lambda x: tf.repeat(tf.expand_dims(x, -1), time, axis=-1), info)


def _split_rows(sample, num_steps):
    """A sequence `[T, ...]` -> `[T // num_steps, num_steps, ...]`, the tail cut off (the
    rows TF-Agents splits a longer sequence into)."""
    first = tf.nest.flatten(sample)[0]
    time = first.shape[0] if first.shape[0] is not None else tf.shape(first)[0]
    rows = time // num_steps

    def split(x):
        kept = x[:rows * num_steps]
        value = tf.reshape(kept, tf.concat([[rows, num_steps], tf.shape(x)[1:]], 0))
        value.set_shape([rows if isinstance(rows, int) else None, num_steps, *x.shape[1:]])
        return value

    return tf.nest.map_structure(split, sample)


class ReverbReplayBuffer(replay_buffer.ReplayBuffer):
    """TF-Agents' `ReverbReplayBuffer`: same constructor, methods and `as_dataset` elements,
    faster on a packed table (`table`).

    Each sampled item is one stored sequence: on a packed table decoded from its columns into
    `data_spec`'s nest, on any other table read leaf by leaf as TF-Agents does (any
    `sequence_length`, `None` for variable-length items). `as_dataset` gives
    `(data, reverb.SampleInfo)` with the info repeated over time, splits longer sequences
    into `num_steps` rows (and shuffles them) exactly like TF-Agents, and
    `single_deterministic_pass=True` needs a deterministic sampler and remover. Batches of
    whole items are decoded after batching, one op per leaf per batch.
    """

    def __init__(self, data_spec, table_name, sequence_length, server_address=None,
                 local_server=None, dataset_buffer_size=None, max_cycle_length=32,
                 num_workers_per_iterator=-1, max_samples_per_stream=-1,
                 rate_limiter_timeout_ms=-1):
        """Connects to the table; its signature decides the layout read.

        Args: as TF-Agents' `ReverbReplayBuffer` (exactly one of `server_address` and
        `local_server`; `sequence_length` may be None). On a packed table
        `sequence_length` must be None or the table's.
        """
        if (server_address is None) == (local_server is None):
            raise ValueError('Exactly one of the server_address or local_server must be '
                             'provided.')
        self._table_name = table_name
        self._local_server = local_server
        self._server_address = (f'localhost:{local_server.port}' if local_server is not None
                                else server_address)
        self._dataset_buffer_size = dataset_buffer_size
        self._max_cycle_length = max_cycle_length
        self._num_workers_per_iterator = num_workers_per_iterator
        self._max_samples_per_stream = max_samples_per_stream
        self._rate_limiter_timeout_ms = rate_limiter_timeout_ms
        self._py_client = reverb.Client(self._server_address)
        self._tf_client = reverb.TFClient(self._server_address, 'rb_tf_client')
        self._table_info = self.get_table_info()
        signature = self._table_info.signature
        if is_packed(signature):
            self._layout = packed_layout(signature, data_spec, table_name, sequence_length)
            sequence_length = int(signature[-1].shape[0])
            columns = self._layout.signature
            self._dtypes = tuple(spec.dtype for spec in columns)
            self._shapes = tuple(spec.shape for spec in columns)
        else:
            self._layout = None
            self._dtypes = tf.nest.map_structure(lambda s: tf.as_dtype(s.dtype), data_spec)
            self._shapes = tf.nest.map_structure(
                lambda s: tf.TensorShape([sequence_length, *s.shape]), data_spec)
        self._sequence_length = sequence_length
        self._deterministic_table = (self._table_info.sampler_options.is_deterministic
                                     and self._table_info.remover_options.is_deterministic)
        self._iterators = {}
        super().__init__(data_spec=data_spec, capacity=self._table_info.max_size,
                         stateful_dataset=True)

    @property
    def py_client(self):
        return self._py_client

    @property
    def local_server(self):
        return self._local_server

    @property
    def tf_client(self):
        return self._tf_client

    @property
    def packed(self):
        """Whether the table is in our packed layout."""
        return self._layout is not None

    def get_table_info(self):
        return self._py_client.server_info()[self._table_name]

    def _num_frames(self):
        """The items in the table now (racy with concurrent writes, as TF-Agents')."""
        return self.get_table_info().current_size

    def add_batch(self, items):
        raise NotImplementedError(
            'ReverbReplayBuffer does not support `add_batch`: write with '
            'ReverbAddTrajectoryObserver (buffers.tf_agents_reverb_observer).')

    def _add_batch(self, items):
        raise NotImplementedError

    def gather_all(self):
        raise NotImplementedError('ReverbReplayBuffer does not support `gather_all`.')

    def _gather_all(self):
        raise NotImplementedError

    def _clear(self):
        self._py_client.reset(self._table_name)

    def update_priorities(self, keys, priorities):
        """Sets the priorities of sampled items (`SampleInfo.key`)."""
        self._tf_client.update_priorities(self._table_name, keys, priorities)

    def _get_next(self, sample_batch_size=None, num_steps=None, time_stacked=True):
        """The next element of a cached `as_dataset(sample_batch_size, num_steps)` iterator."""
        key = (sample_batch_size, num_steps)
        if key not in self._iterators:
            with tf.init_scope():
                self._iterators[key] = iter(self.as_dataset(sample_batch_size, num_steps))
        data, info = next(self._iterators[key])
        if num_steps is not None and not time_stacked:
            axis = 0 if sample_batch_size is None else 1
            data = tuple(tf.nest.map_structure(lambda x, t=t: tf.gather(x, t, axis=axis), data)
                         for t in range(num_steps))
        return data, info

    def _verify_num_steps(self, num_steps):
        if num_steps and self._sequence_length:
            if num_steps > self._sequence_length:
                raise ValueError(
                    'Can not guarantee sequential data for num_steps as sequence length of the '
                    'data is smaller.  This is not supported.  num_steps > sequence_length '
                    f'({num_steps} vs. {self._sequence_length})')
            if self._sequence_length % num_steps != 0:
                raise ValueError(
                    'Can not guarantee sequential data since sequence_length is not a multiple '
                    f'of num_steps ({num_steps} vs. {self._sequence_length})')

    def _as_dataset(self, sample_batch_size=None, num_steps=None, sequence_preprocess_fn=None,
                    num_parallel_calls=None):
        """Endless `(data, SampleInfo)` draws; TF-Agents' streams, buffers and shuffling."""
        self._verify_num_steps(num_steps)
        if num_parallel_calls and sample_batch_size and num_parallel_calls > sample_batch_size:
            raise ValueError('num_parallel_calls cannot be bigger than sample_batch_size '
                             f'{num_parallel_calls} > {sample_batch_size}')
        total = sample_batch_size or 1
        cycle_length = min(total, self._max_cycle_length)
        per_stream = total // cycle_length
        # TF-Agents' shuffle buffer for rows split out of longer sequences.
        shuffle = ((self._sequence_length // num_steps if self._sequence_length else 100)
                   * per_stream if num_steps else None)
        return self._dataset(
            sample_batch_size, num_steps, sequence_preprocess_fn,
            cycle_length=cycle_length,
            num_parallel_calls=num_parallel_calls or tf.data.AUTOTUNE,
            max_in_flight=self._dataset_buffer_size or 3 * per_stream,
            num_workers=min(self._num_workers_per_iterator, per_stream),
            shuffle=shuffle)

    def _single_deterministic_pass_dataset(self, sample_batch_size=None, num_steps=None,
                                           sequence_preprocess_fn=None,
                                           num_parallel_calls=None):
        """The table's items in its sampler's order (one stream, one sample in flight)."""
        del num_parallel_calls  # one stream, in order
        if not self._deterministic_table:
            raise ValueError(
                'Unable to perform a single deterministic pass over the dataset, since either '
                'the sampler or the remover is not deterministic (FIFO or Heap).  Table '
                f'info:\n{self._table_info}')
        self._verify_num_steps(num_steps)
        return self._dataset(sample_batch_size, num_steps, sequence_preprocess_fn,
                             cycle_length=1, num_parallel_calls=1, max_in_flight=1,
                             num_workers=1, shuffle=None)

    # -- The pipeline ------------------------------------------------------------------------------

    def _stream(self, max_in_flight, num_workers):
        """One Reverb stream of raw samples (`ReplaySample`, data in the table's columns)."""
        return reverb.TrajectoryDataset(
            self._server_address, self._table_name, self._dtypes, self._shapes,
            max_in_flight_samples_per_worker=max_in_flight,
            num_workers_per_iterator=num_workers,
            max_samples_per_stream=self._max_samples_per_stream,
            rate_limiter_timeout_ms=self._rate_limiter_timeout_ms)

    def _decode(self, data, batched):
        """The table's columns `[T, ...]` (or `[B, T, ...]`) -> `data_spec`'s nest."""
        if self._layout is None:
            return data
        if batched:
            return self._layout.decode(data)[0]
        window = self._layout.decode(tf.nest.map_structure(lambda x: x[None], data))[0]
        return tf.nest.map_structure(lambda x: x[0], window)

    def _dataset(self, sample_batch_size, num_steps, preprocess, *, cycle_length,
                 num_parallel_calls, max_in_flight, num_workers, shuffle):
        split = bool(num_steps) and num_steps != self._sequence_length
        # Whole items, batched: decode and repeat the info once per batch, after batching.
        per_sample = split or preprocess is not None or not sample_batch_size

        def sequences(_):
            dataset = self._stream(max_in_flight, num_workers)
            if not per_sample:
                return dataset

            def sequence(sample):
                data = self._decode(sample.data, batched=False)
                info = _broadcast_info(sample.info, tf.shape(tf.nest.flatten(data)[0])[0])
                return (preprocess(data) if preprocess else data), info

            dataset = dataset.map(sequence)
            if split:
                dataset = dataset.map(lambda *s: _split_rows(s, num_steps)).unbatch()
                if shuffle:
                    dataset = dataset.shuffle(shuffle)
            return dataset

        if cycle_length == 1:
            dataset = sequences(0)
        else:
            dataset = tf.data.Dataset.range(cycle_length).interleave(
                sequences, cycle_length=cycle_length, num_parallel_calls=num_parallel_calls)
        options = tf.data.Options()
        options.deterministic = False  # as TF-Agents: take from whichever stream is ready
        dataset = dataset.with_options(options)
        if sample_batch_size:
            dataset = dataset.batch(sample_batch_size, drop_remainder=True)
        if not per_sample:
            def whole_items(sample):
                data = self._decode(sample.data, batched=True)
                return data, _broadcast_info(sample.info,
                                             tf.shape(tf.nest.flatten(data)[0])[1])

            dataset = dataset.map(whole_items, num_parallel_calls=num_parallel_calls)
        return dataset
