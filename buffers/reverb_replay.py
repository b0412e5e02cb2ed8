"""Replay backends on a Reverb table: uniform and prioritized.

Why Reverb when `UniformReplay`/`PrioritizedReplay` are faster in one process:
the same table serves distributed actors and learners (many writers, one
server), and its checkpoints are Reverb's own. These backends keep the one
`ReplayBackend` contract so a run switches to them with one Gin binding.

Items. The table holds `num_steps`-step windows of ONE env copy: once a copy
has `num_steps` steps, every new step creates one item covering its last
`num_steps` steps. Capacity counts items, i.e. transitions (one window per
step); the Fifo remover evicts the oldest window first, so a full table keeps
each copy's last `capacity / num_envs` windows, which reach `num_steps - 1`
steps further back than a row buffer's. The window length is fixed when the
backend is built, so `sample` serves only `num_steps`-step windows. Windows
may cross an episode boundary (LAST -> FIRST) exactly as in `UniformReplay`;
agents mask them. Each item also stores the id of its first step,
`step * num_envs + env` (`UniformReplay`'s key), because Reverb's own keys are
random and `ages` needs to know when a sampled window was written.

Columns. Small leaves of a copy's step (everything but e.g. an image
observation) and the first-step id are packed as raw bytes into one uint8
column and bit-cast back after sampling (`_Layout`): Reverb's writer and
sampler cost grows with columns per item, so a CartPole-like step writes 1
column instead of 7, an Atari-like one 2 -- about 3x the vector insert and
sample rates.

One writer, its own columns per env copy. Every copy's columns belong to a
single `TrajectoryWriter`, and an item references only its own copy's
columns, so a window can never mix copies. Why not one writer per copy:
each writer is its own stream, and items reach the server in stream order,
not creation order -- measured, the Fifo remover then evicted all of one copy's
windows before any of the other's. One stream keeps insertion order = creation
order (and costs one background thread, not one per copy).

Server. By default an in-process `reverb.Server` on a free port (Reverb 0.14
always listens on all interfaces, `[::]:port`; it offers no way to bind
127.0.0.1 only, so do not run it on an untrusted network). Its rate limiter is
`MinSize(1)`: in one process nothing must throttle inserts against samples, and
unlike `SampleToInsertRatio` it can never block sampling after a restore. With
`server_address='host:port'` a running server is used instead; it must host a
table named `table_name` (default `reverb_uniform_replay` or
`reverb_prioritized_replay`) with this backend's signature, selector and a Fifo
remover. The distributed replay role hosts exactly such a table: it builds this
backend with `port=`, `rate_limiter=` and `extra_tables=`, so the table's
layout is written in one place.

Checkpoints. `checkpoint_items()` holds a `PythonState` that, when a
`tf.train.Checkpoint` is saved, makes Reverb write its own checkpoint and
records that checkpoint's path; restoring restarts the in-process server from
exactly that checkpoint and recreates the writer, datasets and clients, so
`tf.function`s that sample must be traced after the restore (the trainer
restores before it builds the loop). Layout under `checkpoint_dir` (one backend each):

    <checkpoint_dir>/server/       the Reverb checkpointer's root; kept empty
    <checkpoint_dir>/ckpt-000007/  one saved Reverb checkpoint (the last
                                   `keep_checkpoints`, default 2, are kept)

Reverb itself keeps only its newest checkpoint and loads the newest one in its
root, so each save is moved out of `server/` at once: older training
checkpoints keep their replay, and a restore loads exactly the recorded one.
Without `checkpoint_dir` a temporary directory is used and removed by `close()`
(and at exit): enough within a process, but a resumable run must pass a
persistent directory, e.g. `<root_dir>/checkpoints/replay`. With a server run
elsewhere, a save checkpoints that server (its owner restores it) and a restore
brings back only this side's counters.
"""

import json
import math
import os
import re
import shutil
import tempfile
import threading
import weakref

import gin
import numpy as np
import reverb
import tensorflow as tf

from buffers.base import Capabilities, SampleInfo, check_priority_settings, validate_capacity
from core.checks import check
from core.errors import UserError

_CHECKPOINT_PATTERN = re.compile(r'^ckpt-(\d+)$')
_SIGNATURE_TIMEOUT_S = 30
_FLUSH_TIMEOUT_MS = 60_000  # a writer waiting this long on the server means it is gone
_RECENT = 16384  # sampled windows remembered for `ages` and `histograms`
_OWN_COLUMN_BYTES = 256  # leaves this large keep a column; smaller ones share the packed one


class _Layout:
    """How one env copy's step maps onto Reverb columns, and back after sampling.

    Why pack: the writer's and the sampler's cost grows with the number of
    columns per item (every column is its own chunk stream, compressed, sent
    and unpacked per sample), far more than with bytes for small leaves. A
    `Trajectory` has 6 leaves plus our first-step id, 7 columns per env copy.
    `packed` keeps each leaf of at least `_OWN_COLUMN_BYTES` (an image
    observation) in a column of its own -- slicing it out of a byte column
    after sampling would copy it once more -- and writes every smaller leaf
    and the id as raw bytes into one uint8 column, bit-cast back after
    sampling. A CartPole-like step is then 1 column, an Atari-like one 2. String
    leaves (compressed frames) always keep their own column.
    """

    def __init__(self, data_spec, num_steps):
        self._data_spec = data_spec
        self._num_steps = num_steps
        # The first-step id, `step * num_envs + env`, is stored as one more leaf.
        self._specs = [*tf.nest.flatten(data_spec), tf.TensorSpec([], tf.int64)]
        # Strings (compressed frames, buffers/frames.py) vary in length: a column of their own.
        sizes = [math.inf if spec.dtype == tf.string else
                 spec.shape.num_elements() * spec.dtype.size for spec in self._specs]
        self._own = [i for i, size in enumerate(sizes[:-1]) if size >= _OWN_COLUMN_BYTES]
        self._small = [i for i in range(len(self._specs)) if i not in self._own]
        offsets = np.cumsum([0] + [sizes[i] for i in self._small])
        self._slices = dict(zip(self._small, zip(offsets[:-1], offsets[1:])))
        self.packed_bytes = int(offsets[-1])
        self.num_columns = len(self._own) + 1
        self.signature = tuple(
            [tf.TensorSpec([num_steps, *self._specs[i].shape], self._specs[i].dtype)
             for i in self._own] + [tf.TensorSpec([num_steps, self.packed_bytes], tf.uint8)])

    def encode(self, leaves, ids):
        """Batched numpy leaves `[N, ...]` and ids `[N]` -> per copy, its columns' values."""
        num_envs = len(ids)
        leaves = [*leaves, ids]
        packed = np.concatenate(
            [np.ascontiguousarray(leaves[i]).reshape(num_envs, -1).view(np.uint8)
             for i in self._small], axis=1)
        own = [leaves[i] for i in self._own]
        return [[*(leaf[env] for leaf in own), packed[env]] for env in range(num_envs)]

    def item(self, columns, num_steps):
        """The trajectory of one item: the last `num_steps` steps of one copy's columns."""
        window = slice(-num_steps, None)
        return tuple(column[window] for column in columns)

    def decode(self, data):
        """Sampled columns `[B, T, ...]` -> (the data spec's nest `[B, T, ...]`, ids `[B]`)."""
        columns = list(data)
        packed = columns[-1]
        outer = packed.shape[:2].as_list()  # static [B, T] when batched with drop_remainder
        if None in outer:
            outer = tf.unstack(tf.shape(packed)[:2])
        flat = [None] * len(self._specs)
        for i, column in zip(self._own, columns[:-1]):
            flat[i] = column
        for i in self._small:
            spec = self._specs[i]
            begin, end = self._slices[i]
            raw = packed[:, :, begin:end]
            if spec.dtype == tf.bool:
                value = tf.not_equal(raw, 0)
            elif spec.dtype.size == 1:
                value = raw if spec.dtype == tf.uint8 else tf.bitcast(raw, spec.dtype)
            else:
                raw = tf.reshape(raw, [*outer, -1, spec.dtype.size])
                value = tf.bitcast(raw, spec.dtype)
            flat[i] = tf.reshape(value, [*outer, *spec.shape.as_list()])
        ids = flat.pop()[:, 0]
        return tf.nest.pack_sequence_as(self._data_spec, flat), ids


def latest_checkpoint(checkpoint_dir):
    """The newest complete Reverb checkpoint a backend kept in `checkpoint_dir`, or None."""
    if not os.path.isdir(checkpoint_dir):
        return None
    kept = sorted(name for name in os.listdir(checkpoint_dir) if _CHECKPOINT_PATTERN.match(name)
                  and os.path.isfile(os.path.join(checkpoint_dir, name, 'DONE')))
    return os.path.join(checkpoint_dir, kept[-1]) if kept else None


class _ReverbCheckpoint(tf.train.experimental.PythonState):
    """Bridges `tf.train.Checkpoint` to Reverb's own checkpointer.

    `serialize` runs once per training-checkpoint save, which is exactly when
    the table must be written too; the training checkpoint then stores only the
    small JSON record that says where Reverb put it.
    """

    def __init__(self, backend):
        self._backend = weakref.proxy(backend)

    def serialize(self):
        return json.dumps(self._backend._save_reverb_checkpoint())

    def deserialize(self, string_value):
        self._backend._restore_reverb_checkpoint(json.loads(string_value))


class _ReverbReplay:
    """Shared machinery of the Reverb backends (see the module docstring)."""

    # The wiring passes `checkpoint_dir` (inside the run directory) to backends
    # that write their own checkpoints, so a resumed run finds them.
    capabilities = Capabilities(own_checkpoints=True, server=True)
    default_table_name = None

    def __init__(self, data_spec, *, capacity, num_envs=1, batch_size=1, num_steps=2, seed=0,
                 server_address=None, table_name=None, checkpoint_dir=None,
                 max_in_flight_samples_per_worker=None, num_workers_per_iterator=2,
                 flush_every=256, rate_limiter_timeout_ms=10_000, keep_checkpoints=2,
                 chunk_length=None, port=None, rate_limiter=None, extra_tables=(),
                 initial_checkpoint=None, read_only=False):
        """Starts (or connects to) the server and opens the writer.

        Args:
          data_spec: nest of `tf.TensorSpec`, normally `agent.collect_data_spec`.
          capacity: transitions (= windows) kept, summed over env copies.
          num_envs: batch size of every `add` call.
          batch_size: the learner's batch size (validated against capacity).
          num_steps: the window length of every item; `sample` serves only it.
          seed: accepted for interface parity; Reverb's server-side samplers
            cannot be seeded, so sampling is not reproducible.
          server_address: 'host:port' of a running server to use instead of
            starting one in this process.
          table_name: the table's name (defaults per class, see module doc).
          checkpoint_dir: where Reverb checkpoints go (default: a temporary
            directory removed by `close()`, not usable to resume a run).
          max_in_flight_samples_per_worker: samples each dataset worker keeps
            requested; None means twice the sampled batch size (Reverb's rule of
            thumb: more is faster but draws more samples from one snapshot).
          num_workers_per_iterator: sampling streams per dataset iterator; 2
            sampled fastest on a 2-core machine (1 and Reverb's auto were slower).
          flush_every: every `flush_every` new items (over all copies) the
            writer blocks until at most `flush_every` items are unconfirmed by
            the server: a bound on pending items (TF-Agents' observer never
            flushes, and its pending items pile up to gigabytes).
          rate_limiter_timeout_ms: how long sampling waits on an empty table
            before failing; finite so that nothing can wait forever.
          keep_checkpoints: Reverb checkpoints kept in `checkpoint_dir`; match
            the training checkpoints kept (the Checkpointer keeps 2).
          chunk_length: steps per Reverb chunk in every column, 1 to
            `num_steps`; None lets Reverb tune it. `num_steps` sampled images
            ~15% faster (fewer chunks to unpack per sample, measured with
            `bench/buffer_systems.py`), but a chunk is sent only when full or
            flushed, so each copy's newest window then reaches the table one
            step late; the auto-tuned length sends every window at once.
          port: the in-process server's port (None: a free one).
          rate_limiter: the table's rate limiter (None: `MinSize(1)`, which never
            throttles inserts against samples; the distributed replay role
            passes a `SampleToInsertRatio`).
          extra_tables: more `reverb.Table`s on the in-process server (the
            distributed run's weights table).
          initial_checkpoint: a saved Reverb checkpoint (`save_checkpoint`'s
            path) the in-process server starts from.
          read_only: open no writer (a remote learner only samples): no stream to
            the server that could break when it goes away; `add` is refused, and
            sampling ends (an error) at the first timeout instead of reconnecting.

        Raises:
          UserError: on an impossible capacity, or a `server_address` whose
            server lacks a matching table.
        """
        rows_per_env = validate_capacity(
            capacity, batch_size=batch_size, num_envs=num_envs, num_steps=num_steps)
        scope = type(self).__name__
        check(scope, locals(), positive=('flush_every', 'keep_checkpoints'),
              optional_positive=('max_in_flight_samples_per_worker',),
              numbers={'rate_limiter_timeout_ms': (0, math.inf, 'closed')},
              flags=('read_only',))
        if num_workers_per_iterator != -1:
            check(scope, locals(), positive=('num_workers_per_iterator',))
        del seed
        self._data_spec = data_spec
        self._num_envs = num_envs
        self._num_steps = num_steps
        self._capacity = rows_per_env * num_envs
        self._table_name = table_name or self.default_table_name
        if chunk_length is not None and not (isinstance(chunk_length, int)
                                             and 1 <= chunk_length <= num_steps):
            raise UserError(
                f"{scope}.chunk_length must be None or a whole number in [1, num_steps="
                f"{num_steps}], got {chunk_length!r}: fix the binding.")
        # Every item also stores the id of its window's first step, `step * num_envs
        # + env` as in `UniformReplay`'s keys: `ages` needs it, Reverb keys are random.
        self._layout = _Layout(data_spec, num_steps)
        self._chunk_length = chunk_length
        self._max_in_flight = max_in_flight_samples_per_worker
        self._num_workers = num_workers_per_iterator
        self._flush_every = flush_every
        self._timeout_ms = int(rate_limiter_timeout_ms)
        self._keep_checkpoints = keep_checkpoints
        self._lock = threading.Lock()
        self._num_sampled = tf.Variable(0, dtype=tf.int64, trainable=False, name='num_sampled')
        # The last `_RECENT` sampled windows' keys, first-step ids and priorities,
        # for `ages` and `histograms` (not checkpointed: they describe samples).
        self._recent = {
            'keys': tf.Variable(tf.fill([_RECENT], tf.constant(-1, tf.int64)), trainable=False),
            'ids': tf.Variable(tf.zeros([_RECENT], tf.int64), trainable=False),
            'priorities': tf.Variable(tf.zeros([_RECENT], tf.float64), trainable=False),
        }
        self._recent_count = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._inserted = 0  # transitions passed to `add`, over all copies
        self._items_created = 0  # windows handed to the writer
        self._closed = False
        self._server = None
        self._writer = None  # opened by `_connect`; `close` may come before it
        self._temp_dir_cleanup = None
        if checkpoint_dir is None:
            checkpoint_dir = tempfile.mkdtemp(prefix='reverb_replay_')
            self._temp_dir_cleanup = weakref.finalize(
                self, shutil.rmtree, checkpoint_dir, ignore_errors=True)
        self._checkpoint_dir = os.path.abspath(checkpoint_dir)
        self._checkpoint_state = _ReverbCheckpoint(self)
        self._port = port
        self._read_only = read_only
        self._rate_limiter = rate_limiter
        self._extra_tables = list(extra_tables)
        if server_address is None:
            self._start_server(checkpoint=initial_checkpoint)
        else:
            self._address = server_address
            self._check_external_table()
        self._connect()

    # -- Properties -------------------------------------------------------------------------------

    @property
    def capacity(self):
        return self._capacity

    @property
    def data_spec(self):
        return self._data_spec

    @property
    def server_address(self):
        return self._address

    @property
    def table_name(self):
        return self._table_name

    @property
    def checkpoint_dir(self):
        return self._checkpoint_dir

    # -- Server and connections -------------------------------------------------------------------

    def _sampler(self):
        return reverb.selectors.Uniform()

    def make_table(self):
        """The `reverb.Table` this backend writes to (for servers run elsewhere too)."""
        return reverb.Table(
            name=self._table_name,
            sampler=self._sampler(),
            remover=reverb.selectors.Fifo(),
            max_size=self._capacity,
            rate_limiter=self._rate_limiter or reverb.rate_limiters.MinSize(1),
            signature=self._layout.signature)

    def _start_server(self, checkpoint=None):
        """Starts the in-process server, empty or loaded from `checkpoint`."""
        root = os.path.join(self._checkpoint_dir, 'server')
        # Reverb loads the newest checkpoint in its root before the fallback; an
        # interrupted save may have left one there, and it must not win.
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        checkpointer = reverb.checkpointers.DefaultCheckpointer(
            path=root, fallback_checkpoint_path=checkpoint)
        try:
            self._server = reverb.Server([self.make_table(), *self._extra_tables],
                                         port=self._port, checkpointer=checkpointer)
        except RuntimeError as error:
            raise UserError(
                f"Reverb could not load the replay checkpoint {checkpoint}: "
                f"{str(error).strip().splitlines()[0][:200]}. Did replay_capacity, num_steps or "
                "the agent's data spec change since it was written? Restore with the same "
                "settings, or start a new --root_dir.") from None
        self._address = f'localhost:{self._server.port}'

    def _check_external_table(self):
        info = reverb.Client(self._address).server_info(_SIGNATURE_TIMEOUT_S)
        table = info.get(self._table_name)
        if table is None:
            raise UserError(
                f"The Reverb server at {self._address} has no table '{self._table_name}' "
                f"(it has: {', '.join(sorted(info)) or 'none'}): create it with "
                f"{type(self).__name__}.make_table(), or bind table_name.")
        found = [(s.shape, s.dtype) for s in tf.nest.flatten(table.signature)]
        expected = [(s.shape, s.dtype) for s in tf.nest.flatten(self._layout.signature)]
        if expected != found:
            raise UserError(
                f"Table '{self._table_name}' at {self._address} stores {found}, but this agent "
                f"writes {expected}: the table was made for another agent or num_steps.")
        # The server's owner sized the table (its env copies may round differently).
        self._capacity = int(table.max_size)

    def _connect(self):
        """Opens the writer and client; datasets are opened on first use."""
        self._client = reverb.Client(self._address)
        self._writer = None
        if not self._read_only:
            self._writer = self._client.trajectory_writer(num_keep_alive_refs=self._num_steps)
        if self._writer is not None and self._chunk_length is not None:
            # Configured before the first append: columns are created with it.
            for env in range(self._num_envs):
                for column in range(self._layout.num_columns):
                    self._writer.configure((env, column), num_keep_alive_refs=self._num_steps,
                                           max_chunk_length=self._chunk_length)
        self._histories = None  # the writer's column histories, fetched once
        self._steps = 0  # steps written since the writer was opened
        self._unflushed = 0  # items created since the last flush
        self._iterators = {}
        self._tf_client = None

    def _disconnect(self):
        self._iterators = {}
        self._tf_client = None
        if self._writer is not None:
            self._writer.close()
        self._writer = None

    # -- Write path -------------------------------------------------------------------------------

    def _new_item_priority(self):
        """The priority of new items, as a tensor read at every `add`."""
        return tf.constant(1.0, tf.float64)

    def add(self, trajectory):
        """Writes one batched step `[num_envs, ...]`; callable inside `tf.function`.

        The step crosses to Python once per call (not once per copy) through
        `tf.numpy_function`, which is stateful, so a traced collect loop keeps
        the writes in step order.
        """
        tf.nest.assert_same_structure(self._data_spec, trajectory, check_types=False)
        leaves = [tf.convert_to_tensor(leaf) for leaf in tf.nest.flatten(trajectory)]
        tf.numpy_function(self._write_step, [self._new_item_priority(), *leaves], Tout=[],
                          name='reverb_add')

    def _write_step(self, priority, *leaves):
        """Appends every copy's step (its own columns) and creates the new windows."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{type(self).__name__}.add called after close().")
            if self._writer is None:
                raise RuntimeError(f"{type(self).__name__} was opened read_only: it cannot add.")
            for leaf in leaves:
                if leaf.shape[:1] != (self._num_envs,):
                    raise ValueError(f"{type(self).__name__} expects batches of "
                                     f"{self._num_envs} env copies, got shape {leaf.shape}.")
            step_id = self._inserted  # this step's id for copy 0, `step * num_envs`
            ids = np.arange(step_id, step_id + self._num_envs, dtype=np.int64)
            self._writer.append(self._layout.encode(leaves, ids))
            if self._histories is None:
                # The column histories are live objects: fetching them once saves
                # rebuilding the structure for every item.
                self._histories = self._writer.history
            self._steps += 1
            self._inserted += self._num_envs
            if self._steps < self._num_steps:
                return
            self._items_created += self._num_envs
            priority = float(priority)
            for columns in self._histories:  # one env copy's columns: windows never mix copies
                self._writer.create_item(self._table_name, priority,
                                         self._layout.item(columns, self._num_steps))
            self._unflushed += self._num_envs
            if self._unflushed >= self._flush_every:
                self._writer.flush(block_until_num_items=self._flush_every,
                                   timeout_ms=_FLUSH_TIMEOUT_MS)
                self._unflushed = 0

    def _flush(self):
        """Sends every pending item and waits until the server has it."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{type(self).__name__} used after close().")
            if self._writer is not None:
                self._writer.flush(timeout_ms=_FLUSH_TIMEOUT_MS)
            self._unflushed = 0

    def pending_items(self):
        """Items created but not yet confirmed by the server (a measurement hook)."""
        info = self._table_info()
        return self._items_created - int(info.rate_limiter_info.insert_stats.completed)

    # -- Read path --------------------------------------------------------------------------------

    def _check_num_steps(self, num_steps):
        if num_steps != self._num_steps:
            raise UserError(
                f"{type(self).__name__} stores fixed {self._num_steps}-step windows (chosen when "
                f"it was built) and cannot serve {num_steps}-step samples: build it with "
                f"num_steps={num_steps}.")

    def _dataset(self, batch_size):
        """Reverb's own dataset, repeated so a timed-out stream is reopened, batched."""
        dataset = reverb.TrajectoryDataset.from_table_signature(
            server_address=self._address,
            table=self._table_name,
            max_in_flight_samples_per_worker=self._max_in_flight or 2 * batch_size,
            num_workers_per_iterator=self._num_workers,
            rate_limiter_timeout_ms=self._timeout_ms,
            get_signature_timeout_secs=_SIGNATURE_TIMEOUT_S)
        if self._read_only:
            # A remote learner reopens the backend itself after a timeout or an outage;
            # repeat() would keep reconnecting to a dead server in the background.
            return dataset.batch(batch_size, drop_remainder=True)
        # repeat() reopens a stream that ended on a timeout, but ends the dataset
        # when a whole pass timed out without data: only an empty table stops it.
        return dataset.repeat().batch(batch_size, drop_remainder=True)

    def decode_window(self, data):
        """A raw sample's `data`, `[B, T, ...]` columns, -> (data spec's nest, first-step ids).

        For readers of the table other than `sample` (their own Reverb dataset).
        """
        return self._layout.decode(data)

    def _decode(self, sample):
        """Reverb's `ReplaySample` -> `(nest [B, T, ...], SampleInfo, first-step ids)`."""
        # The layout repacks into the data spec's own structure, so agents receive
        # their Trajectory type (not the signature's look-alike namedtuples).
        window, ids = self._layout.decode(sample.data)
        info = SampleInfo(keys=tf.bitcast(sample.info.key, tf.int64),
                          probabilities=tf.cast(sample.info.probability, tf.float32))
        return window, info, ids

    def _to_window(self, sample):
        """Reverb's `ReplaySample` -> `(nest [B, T, ...], SampleInfo)`."""
        return self._decode(sample)[:2]

    def _remember(self, sample, keys, ids):
        """Records sampled keys, first-step ids and priorities in the recent ring."""
        batch_size = tf.shape(keys, out_type=tf.int64)[0]
        slots = (self._recent_count + tf.range(batch_size)) % _RECENT
        slots = slots[-_RECENT:, None]  # a batch larger than the ring keeps its tail
        for name, values in (('keys', keys), ('ids', ids),
                             ('priorities', sample.info.priority)):
            self._recent[name].scatter_nd_update(slots, values[-_RECENT:])
        self._recent_count.assign_add(batch_size)

    def _iterator(self, batch_size):
        """The cached iterator for `batch_size`, created eagerly on first use."""
        iterator = self._iterators.get(batch_size)
        if iterator is None:
            with tf.init_scope():
                self._flush()
                if self._table_info().current_size == 0:
                    raise UserError(
                        f"Cannot sample from the empty Reverb table '{self._table_name}': "
                        f"add at least {self._num_steps} steps before sampling.")
                iterator = iter(self._dataset(batch_size))
            self._iterators[batch_size] = iterator
        return iterator

    def sample(self, batch_size, num_steps):
        """Draws `batch_size` windows; callable inside `tf.function` (not XLA).

        The dataset streams samples ahead of use (`max_in_flight_samples_per_worker`),
        so a batch may be drawn from a table snapshot a few hundred items old.

        Returns:
          `(window, SampleInfo)`: the nest `[batch_size, num_steps, ...]`, the
          item keys (uint64 bit-cast to int64) and the float32 probability each
          window had when it was drawn.
        """
        self._check_num_steps(num_steps)
        element = self._iterator(batch_size).get_next_as_optional()
        has_value = tf.debugging.Assert(element.has_value(), [
            f"Reverb table '{self._table_name}' at {self._address} gave no sample within "
            f"rate_limiter_timeout_ms={self._timeout_ms}: it is empty or its server stopped."])
        with tf.control_dependencies([has_value]):
            sample = element.get_value()
        window, info, ids = self._decode(sample)
        self._remember(sample, info.keys, ids)
        self._num_sampled.assign_add(batch_size)
        return window, info

    def as_dataset(self, batch_size, num_steps):
        """An endless dataset of `(window, SampleInfo)` batches (for remote learners).

        It ends only if the table stays empty for `rate_limiter_timeout_ms`.
        """
        self._check_num_steps(num_steps)
        self._flush()
        return self._dataset(batch_size).map(self._to_window)

    def update_priorities(self, keys, priorities):
        """Uniform tables have no priorities; accepting the call keeps loops backend-agnostic."""
        del keys, priorities

    # -- Metrics, checkpoints, close --------------------------------------------------------------

    def ages(self, keys):
        """Transitions inserted since each key's first step was written.

        Reverb keys are random, so the age comes from the first-step id stored
        with each window, remembered for the last `_RECENT` sampled windows;
        keys not among them (not sampled recently) get NaN.
        """
        known = dict(zip(self._recent['keys'].numpy().tolist(),
                         self._recent['ids'].numpy().tolist()))
        known.pop(-1, None)  # ring slots never written
        ids = np.array([known.get(key, np.nan) for key in np.asarray(keys).tolist()], np.float64)
        return self._inserted - ids

    def histograms(self):
        """Priorities of the recently sampled windows; none on a uniform table."""
        return {}

    def _table_info(self):
        return self._client.server_info(_SIGNATURE_TIMEOUT_S)[self._table_name]

    def metrics(self):
        """Table size and counters; flushes first so the size counts every `add`.

        `size` counts transitions, as in every backend: the steps the stored
        windows cover. A copy's windows are consecutive, so they cover
        `num_steps - 1` steps more than there are windows; at most `capacity`.
        `windows` is the table's own item count.
        """
        self._flush()
        info = self._table_info()
        windows = int(info.current_size)
        size = float(min(windows + (self._num_steps - 1) * self._num_envs, self._capacity)
                     if windows else 0)
        stats = info.rate_limiter_info
        return {
            'size': size,
            'capacity': float(self._capacity),
            'fill_ratio': size / self._capacity,
            'windows': float(windows),
            'inserted': float(self._inserted),
            'sampled': float(self._num_sampled.numpy()),
            # Server-side counts: items written, and samples drawn including
            # those the dataset streamed ahead and not yet handed out.
            'items_inserted': float(stats.insert_stats.completed),
            'items_sampled': float(stats.sample_stats.completed),
        }

    def checkpoint_items(self):
        return {'reverb': self._checkpoint_state, 'num_sampled': self._num_sampled}

    def _save_reverb_checkpoint(self):
        """Writes a Reverb checkpoint, keeps the last few; returns what to record."""
        self._flush()
        path = self._client.checkpoint()
        if self._server is not None:
            path = self._keep_checkpoint(path)
        return {'checkpoint': path, 'inserted': self._inserted, 'items': self._items_created,
                'table': self._table_name, 'in_process': self._server is not None}

    def save_checkpoint(self):
        """Writes a Reverb checkpoint of the server now; returns its kept path.

        For a server this backend hosts (the distributed replay role's), the last
        `keep_checkpoints` are kept as `<checkpoint_dir>/ckpt-NNNNNN/`; pass
        `latest_checkpoint(checkpoint_dir)` as `initial_checkpoint` to restart from it.
        """
        return self._save_reverb_checkpoint()['checkpoint']

    def _keep_checkpoint(self, path):
        """Moves a fresh Reverb checkpoint out of the server root and prunes old ones."""
        numbers = sorted(int(m.group(1)) for m in map(_CHECKPOINT_PATTERN.match,
                                                      os.listdir(self._checkpoint_dir)) if m)
        number = (numbers[-1] if numbers else 0) + 1
        kept = os.path.join(self._checkpoint_dir, f'ckpt-{number:06d}')
        os.replace(path, kept)
        for old in [*numbers, number][:-self._keep_checkpoints]:
            shutil.rmtree(os.path.join(self._checkpoint_dir, f'ckpt-{old:06d}'),
                          ignore_errors=True)
        return kept

    def _restore_reverb_checkpoint(self, state):
        """Restarts the in-process server from the recorded Reverb checkpoint."""
        if state.get('table') != self._table_name:
            raise UserError(
                f"The checkpoint holds Reverb table '{state.get('table')}', but this backend "
                f"uses '{self._table_name}': restore with the same replay backend.")
        if self._server is not None:
            path = self._resolve_checkpoint(state['checkpoint'])
            with self._lock:
                self._disconnect()
                self._server.stop()
                self._server = None
                self._start_server(checkpoint=path)
                self._connect()
        # With a server run elsewhere, its owner restores the table (from the
        # recorded server-side path); only this side's counters come back here.
        self._inserted = int(state['inserted'])
        self._items_created = int(state['items'])

    def _resolve_checkpoint(self, path):
        """The recorded path, or its namesake here if the run directory moved."""
        for candidate in (path, os.path.join(self._checkpoint_dir, os.path.basename(path))):
            if os.path.isfile(os.path.join(candidate, 'DONE')):
                return candidate
        raise UserError(
            f"its Reverb checkpoint is missing: {path} (nor in {self._checkpoint_dir}); was "
            "the replay checkpoint_dir a temporary one? Restore another checkpoint, or start "
            "a new --root_dir.")

    def close(self):
        """Closes the writer and datasets and stops the server if we started it; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._disconnect()
            if self._server is not None:
                self._server.stop()
                self._server = None
        if self._temp_dir_cleanup is not None:
            self._temp_dir_cleanup()


@gin.configurable
class ReverbUniformReplay(_ReverbReplay):
    """Uniform replay of `num_steps` windows from a Reverb table.

    Every stored window is drawn with probability `1 / size`; `update_priorities`
    is accepted and ignored.
    """

    default_table_name = 'reverb_uniform_replay'


@gin.configurable
class ReverbPrioritizedReplay(_ReverbReplay):
    """Proportional prioritized replay (Schaul et al., 2016) on a Reverb table.

    A window is drawn with probability `q_i ** alpha / sum_j q_j ** alpha`, where
    `q = p + priority_epsilon` for the last priority `p` given to its key (the
    table's `priority_exponent` is `alpha`). New windows get the largest `q`
    seen so far (1.0 at first), so each is likely replayed once before its TD
    error is known. That maximum is checkpointed with the buffer.
    """

    capabilities = Capabilities(own_checkpoints=True, server=True, priorities=True)
    default_table_name = 'reverb_prioritized_replay'

    def __init__(self, data_spec, *, capacity, num_envs=1, batch_size=1, num_steps=2, seed=0,
                 alpha=0.6, priority_epsilon=1e-6, **kwargs):
        """Like `ReverbUniformReplay`, plus the prioritization settings.

        Args:
          data_spec: nest of `tf.TensorSpec`, normally `agent.collect_data_spec`.
          capacity: transitions (= windows) kept, summed over env copies.
          num_envs: batch size of every `add` call.
          batch_size: the learner's batch size (validated against capacity).
          num_steps: the window length of every item.
          seed: accepted for interface parity (Reverb cannot seed its sampler).
          alpha: how strongly priorities skew sampling; 0 is uniform.
          priority_epsilon: added to every priority so that a zero TD error
            still leaves its window a chance to be replayed.
          **kwargs: the Reverb options of `ReverbUniformReplay`.

        Raises:
          UserError: on a negative `alpha` or `priority_epsilon`.
        """
        check_priority_settings(type(self).__name__, alpha, priority_epsilon)
        self._alpha = float(alpha)
        self._epsilon = float(priority_epsilon)
        self._max_priority = tf.Variable(1.0, dtype=tf.float64, trainable=False,
                                         name='max_priority')
        super().__init__(data_spec, capacity=capacity, num_envs=num_envs, batch_size=batch_size,
                         num_steps=num_steps, seed=seed, **kwargs)

    @property
    def alpha(self):
        return self._alpha

    def _sampler(self):
        return reverb.selectors.Prioritized(priority_exponent=self._alpha)

    def _new_item_priority(self):
        return self._max_priority.read_value()

    def update_priorities(self, keys, priorities):
        """Sets the priorities of sampled windows; callable inside `tf.function`.

        Keys of windows evicted since they were sampled are ignored by Reverb.
        """
        priorities = tf.cast(tf.reshape(priorities, [-1]), tf.float64) + self._epsilon
        self._max_priority.assign(tf.maximum(self._max_priority, tf.reduce_max(priorities)))
        keys = tf.bitcast(tf.cast(tf.reshape(keys, [-1]), tf.int64), tf.uint64)
        self._client_op().update_priorities(self._table_name, keys, priorities)

    def _client_op(self):
        if self._tf_client is None:
            with tf.init_scope():
                self._tf_client = reverb.TFClient(self._address)
        return self._tf_client

    def histograms(self):
        """The stored priorities (p + priority_epsilon) of the last sampled windows.

        Reverb cannot list a table's priorities cheaply, so this shows what the
        learner drew (skewed towards high priorities, by design of the sampler).
        """
        count = min(int(self._recent_count.numpy()), _RECENT)
        return {'sampled_priority': self._recent['priorities'].numpy()[:count]}

    def checkpoint_items(self):
        return {**super().checkpoint_items(), 'max_priority': self._max_priority}
