"""What the two Reverb backends share: the table, its server, writer, reader and checkpoints.

`buffers/reverb_replay.py` describes the backends (items, columns, servers,
checkpoints); this module joins the parts of buffers/reverb/ into one
`ReplayBackend`, and `ReverbUniformReplay` / `ReverbPrioritizedReplay` only add
their sampler and priorities.
"""

import json
import math
import shutil
import tempfile
import threading
import weakref

import reverb
import tensorflow as tf

from buffers.base import Capabilities, validate_capacity
from buffers.reverb.layout import Layout
from buffers.reverb.reader import SIGNATURE_TIMEOUT_S, WindowReader
from buffers.reverb.server import ReplayServer
from buffers.reverb.writer import FLUSH_TIMEOUT_MS, WindowWriter
from core.checks import check
from core.errors import UserError

# Writers to servers that died, never closed: closing one waits for its server (see `retarget`).
_LEFT_BEHIND = []


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


class ReverbBackend:
    """Shared machinery of the Reverb backends (buffers/reverb_replay.py describes them)."""

    # The wiring passes `checkpoint_dir` (inside the run directory) to backends
    # that write their own checkpoints, so a resumed run finds them.
    capabilities = Capabilities(own_checkpoints=True, server=True)
    default_table_name = None

    def __init__(self, data_spec, *, capacity, num_envs=1, batch_size=1, num_steps=2, seed=0,
                 server_address=None, server=None, table_name=None, checkpoint_dir=None,
                 max_in_flight_samples_per_worker=None, num_workers_per_iterator=2,
                 flush_every=256, rate_limiter_timeout_ms=10_000, keep_checkpoints=2,
                 chunk_length=None, read_only=False, flush_timeout_ms=FLUSH_TIMEOUT_MS):
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
          server: a `ReplayServer` the caller owns (and checkpoints and stops), to be
            started with this backend's table.
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
          read_only: open no writer (a remote learner only samples): no stream to
            the server that could break when it goes away; `add` is refused, and
            sampling ends (an error) at the first timeout instead of reconnecting.
          flush_timeout_ms: how long a write may wait for the server to take its items
            before it fails (the rate limiter holding inserts counts as waiting).

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
        if chunk_length is not None and not (isinstance(chunk_length, int)
                                             and 1 <= chunk_length <= num_steps):
            raise UserError(
                f"{scope}.chunk_length must be None or a whole number in [1, num_steps="
                f"{num_steps}], got {chunk_length!r}: fix the binding.")
        del seed
        self._data_spec = data_spec
        self._num_envs, self._num_steps = num_envs, num_steps
        self._capacity = rows_per_env * num_envs
        self._table_name = table_name or self.default_table_name
        self._layout = self._make_layout(data_spec, num_steps)
        self._writer_options = dict(table_name=self._table_name, num_envs=num_envs,
                                    num_steps=num_steps, flush_every=flush_every,
                                    chunk_length=chunk_length,
                                    flush_timeout_ms=flush_timeout_ms)
        self._reader = WindowReader(
            self._layout, table_name=self._table_name, num_steps=num_steps,
            max_in_flight=max_in_flight_samples_per_worker, num_workers=num_workers_per_iterator,
            timeout_ms=rate_limiter_timeout_ms, repeat=not read_only)
        self._read_only = read_only
        self._lock = threading.Lock()
        self._inserted = 0  # transitions passed to `add`, over all copies
        self._items_created = 0  # windows handed to the writer
        self._closed = False
        self._writer = None  # opened by `_connect`; `close` may come before it
        self._temp_dir_cleanup = None
        self._checkpoint_state = _ReverbCheckpoint(self)
        # The server this backend hosts (and so checkpoints and stops), if any.
        self._own_server = None
        if server is not None:
            server.host(self.make_table)
            self._address = server.address
        elif server_address is None:
            if checkpoint_dir is None:  # only a server hosted here writes checkpoints here
                checkpoint_dir = tempfile.mkdtemp(prefix='reverb_replay_')
                self._temp_dir_cleanup = weakref.finalize(
                    self, shutil.rmtree, checkpoint_dir, ignore_errors=True)
            self._own_server = ReplayServer(checkpoint_dir=checkpoint_dir,
                                            keep_checkpoints=keep_checkpoints)
            self._own_server.host(self.make_table)
            self._address = self._own_server.address
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
    def signature(self):
        """The table's column signature (what one stored window holds, encoded)."""
        return self._layout.signature

    # -- The table and connections ----------------------------------------------------------------

    def _sampler(self):
        return reverb.selectors.Uniform()

    def _make_layout(self, data_spec, num_steps):
        """How a step maps onto the table's columns (sequence tables add a state column)."""
        return Layout(data_spec, num_steps)

    def _make_writer(self):
        """The writer that creates this table's items (one window per step and copy here)."""
        return WindowWriter(self._client, self._layout, **self._writer_options)

    def _max_items(self):
        """Items the table keeps: one window per stored transition."""
        return self._capacity

    def _capacity_of(self, max_items):
        """The capacity in transitions of a table keeping `max_items` items."""
        return max_items

    def make_table(self, rate_limiter=None):
        """The `reverb.Table` this backend writes to (for servers run elsewhere too)."""
        return reverb.Table(
            name=self._table_name,
            sampler=self._sampler(),
            remover=reverb.selectors.Fifo(),
            max_size=self._max_items(),
            rate_limiter=rate_limiter or reverb.rate_limiters.MinSize(1),
            signature=self._layout.signature)

    def _check_external_table(self):
        info = reverb.Client(self._address).server_info(SIGNATURE_TIMEOUT_S)
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
        self._capacity = self._capacity_of(int(table.max_size))

    def _connect(self):
        """Opens the client and writer; the reader opens its datasets on first use."""
        self._client = reverb.Client(self._address)
        self._writer = None if self._read_only else self._make_writer()
        self._reader.connect(self._address)
        self._tf_client = None

    def retarget(self, server_address, *, old_server_alive=True):
        """Writes from now on to the same table on the server at `server_address`.

        A collector of a sharded run moves between replay shards this way: pending items
        are flushed to the old server, and the new writer is primed with the last
        `num_steps - 1` steps, so the windows spanning the move are not lost (they are
        written on the new server; those steps are stored on both). When the old server
        is gone (`old_server_alive=False`), its writer is neither flushed nor closed
        (either could wait for it) but left behind: its pending items are lost with it.

        Raises:
          UserError: the new server lacks a matching table.
        """
        with self._lock:
            if self._own_server is not None or self._writer is None:
                raise RuntimeError(f"{type(self).__name__}.retarget needs a writer at a server "
                                   "run elsewhere (server_address=).")
            recent = self._writer.recent_steps()
            if old_server_alive:
                self._writer.flush()
            else:
                _LEFT_BEHIND.append(self._writer)
                self._writer = None
            self._disconnect()
            self._address = server_address
            self._check_external_table()
            self._connect()
            self._writer.prime(recent)

    def _disconnect(self):
        self._reader.close()
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
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{type(self).__name__}.add called after close().")
            if self._writer is None:
                raise RuntimeError(f"{type(self).__name__} was opened read_only: it cannot add.")
            self._items_created += self._writer.write_step(priority, leaves, self._inserted)
            self._inserted += self._num_envs

    def flush(self):
        """Sends every pending item and waits until the server has it."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{type(self).__name__} used after close().")
            if self._writer is not None:
                self._writer.flush()

    def pending_items(self):
        """Items created but not yet confirmed by the server (a measurement hook)."""
        info = self.table_info()
        return self._items_created - int(info.rate_limiter_info.insert_stats.completed)

    # -- Read path --------------------------------------------------------------------------------

    def decode_window(self, data):
        """A raw sample's `data`, `[B, T, ...]` columns, -> (data spec's nest, first-step ids).

        For readers of the table other than `sample` (their own Reverb dataset).
        """
        return self._layout.decode(data)

    def _check_not_empty(self):
        self.flush()
        if self.table_info().current_size == 0:
            raise UserError(
                f"Cannot sample from the empty Reverb table '{self._table_name}': "
                f"add at least {self._num_steps} steps before sampling.")

    def sample(self, batch_size, num_steps):
        """Draws `batch_size` windows; callable inside `tf.function` (not XLA).

        The dataset streams samples ahead of use (`max_in_flight_samples_per_worker`),
        so a batch may be drawn from a table snapshot a few hundred items old.

        Returns:
          `(window, SampleInfo)`: the nest `[batch_size, num_steps, ...]`, the
          item keys (uint64 bit-cast to int64) and the float32 probability each
          window had when it was drawn.
        """
        self._reader.check_num_steps(num_steps, type(self).__name__)
        return self._reader.sample(batch_size, self._check_not_empty)

    def as_dataset(self, batch_size, num_steps):
        """An endless dataset of `(window, SampleInfo)` batches (for remote learners).

        It ends only if the table stays empty for `rate_limiter_timeout_ms`.
        """
        self._reader.check_num_steps(num_steps, type(self).__name__)
        self.flush()
        return self._reader.windows(batch_size)

    def raw_samples(self, batch_size, num_steps):
        """Reverb's unbatched `ReplaySample`s of this table (a sharded reader mixes several)."""
        self._reader.check_num_steps(num_steps, type(self).__name__)
        self.flush()
        return self._reader.samples(batch_size)

    def update_priorities(self, keys, priorities):
        """Uniform tables have no priorities; accepting the call keeps loops backend-agnostic."""
        del keys, priorities

    # -- Metrics, checkpoints, close --------------------------------------------------------------

    def ages(self, keys):
        """Transitions inserted since each key's first step was written.

        Reverb keys are random, so the age comes from the first-step id stored
        with each window, remembered for the last sampled windows; keys not among
        them (not sampled recently) get NaN.
        """
        return self._inserted - self._reader.first_ids(keys)

    def histograms(self):
        """Priorities of the recently sampled windows; none on a uniform table."""
        return {}

    def table_info(self, timeout_s=SIGNATURE_TIMEOUT_S):
        """Reverb's `TableInfo` of this backend's table (size, rate limiter counters)."""
        return self._client.server_info(max(1, int(math.ceil(timeout_s))))[self._table_name]

    def metrics(self):
        """Table size and counters; flushes first so the size counts every `add`.

        `size` counts transitions, as in every backend: the steps the stored
        windows cover. A copy's windows are consecutive, so they cover
        `num_steps - 1` steps more than there are windows; at most `capacity`.
        `windows` is the table's own item count.
        """
        self.flush()
        info = self.table_info()
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
            'sampled': float(self._reader.num_sampled.numpy()),
            # Server-side counts: items written, and samples drawn including
            # those the dataset streamed ahead and not yet handed out.
            'items_inserted': float(stats.insert_stats.completed),
            'items_sampled': float(stats.sample_stats.completed),
        }

    def checkpoint_items(self):
        return {'reverb': self._checkpoint_state, 'num_sampled': self._reader.num_sampled}

    def _save_reverb_checkpoint(self):
        """Writes a Reverb checkpoint, keeps the last few; returns what to record."""
        self.flush()
        path = self._client.checkpoint()
        if self._own_server is not None:
            path = self._own_server.keep(path)
        return {'checkpoint': path, 'inserted': self._inserted, 'items': self._items_created,
                'table': self._table_name, 'in_process': self._own_server is not None}

    def _restore_reverb_checkpoint(self, state):
        """Restarts the hosted server from the recorded Reverb checkpoint."""
        if state.get('table') != self._table_name:
            raise UserError(
                f"The checkpoint holds Reverb table '{state.get('table')}', but this backend "
                f"uses '{self._table_name}': restore with the same replay backend.")
        if self._own_server is not None:
            path = self._own_server.resolve(state['checkpoint'])
            with self._lock:
                self._disconnect()
                self._own_server.restart(path)
                self._address = self._own_server.address
                self._connect()
        # With a server run elsewhere, its owner restores the table (from the
        # recorded server-side path); only this side's counters come back here.
        self._inserted = int(state['inserted'])
        self._items_created = int(state['items'])

    def close(self):
        """Closes the writer and datasets and stops the server if it hosts one; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._disconnect()
            if self._own_server is not None:
                self._own_server.stop()
        if self._temp_dir_cleanup is not None:
            self._temp_dir_cleanup()
