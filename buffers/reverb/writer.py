"""The write side of a Reverb replay table: one trajectory writer for every env copy.

One writer, its own columns per env copy. Every copy's columns belong to a
single `TrajectoryWriter`, and an item references only its own copy's columns,
so a window can never mix copies. Why not one writer per copy: each writer is
its own stream, and items reach the server in stream order, not creation order
-- measured, the Fifo remover then evicted all of one copy's windows before any
of the other's. One stream keeps insertion order = creation order (and costs
one background thread, not one per copy).

Once a copy has `num_steps` steps, every new step creates one item covering its
last `num_steps` steps. Each item also stores the id of its first step,
`step * num_envs + env` (`UniformReplay`'s key), because Reverb's own keys are
random and `ages` needs to know when a sampled window was written.
"""

import collections

import numpy as np

FLUSH_TIMEOUT_MS = 60_000  # a writer waiting this long on the server means it is gone


class WindowWriter:
    """Appends batched steps and creates one `num_steps` window per env copy and step."""

    def __init__(self, client, layout, *, table_name, num_envs, num_steps, flush_every,
                 chunk_length=None, flush_timeout_ms=FLUSH_TIMEOUT_MS):
        """Opens a trajectory writer on `client`.

        Args:
          client: a `reverb.Client` of the server holding the table.
          layout: the table's `Layout` (columns per copy).
          table_name: the table items are created in.
          num_envs: env copies per appended step.
          num_steps: window length of every item.
          flush_every: every `flush_every` new items the writer blocks until at most
            that many are unconfirmed by the server (a bound on pending items).
          chunk_length: steps per Reverb chunk in every column (None: Reverb tunes it).
          flush_timeout_ms: how long a flush may wait for the server before it fails.
        """
        self._layout = layout
        self._table_name = table_name
        self._num_envs, self._num_steps = num_envs, num_steps
        self._flush_every = flush_every
        self._flush_timeout_ms = int(flush_timeout_ms)
        self._writer = client.trajectory_writer(num_keep_alive_refs=num_steps)
        if chunk_length is not None:
            # Configured before the first append: columns are created with it.
            for env in range(num_envs):
                for column in range(layout.num_columns):
                    self._writer.configure((env, column), num_keep_alive_refs=num_steps,
                                           max_chunk_length=chunk_length)
        self._histories = None  # the writer's column histories, fetched once
        self._steps = 0  # steps written since the writer was opened
        self._unflushed = 0  # items created since the last flush
        # The last num_steps - 1 encoded steps: what a writer opened on another server
        # needs to continue every copy's windows (`prime`).
        self._recent = collections.deque(maxlen=num_steps - 1)

    def write_step(self, priority, leaves, first_id):
        """Appends every copy's step (its own columns); creates the new windows.

        Args:
          priority: the new items' priority.
          leaves: the step's flattened numpy leaves, `[num_envs, ...]` each.
          first_id: this step's id for copy 0 (`step * num_envs`).

        Returns:
          The number of items created (0 until a copy has `num_steps` steps).
        """
        for leaf in leaves:
            if leaf.shape[:1] != (self._num_envs,):
                raise ValueError(f"this Reverb table expects batches of {self._num_envs} env "
                                 f"copies, got shape {leaf.shape}.")
        ids = np.arange(first_id, first_id + self._num_envs, dtype=np.int64)
        step = self._layout.encode(leaves, ids)
        self._writer.append(step)
        self._recent.append(step)
        if self._histories is None:
            # The column histories are live objects: fetching them once saves
            # rebuilding the structure for every item.
            self._histories = self._writer.history
        self._steps += 1
        if self._steps < self._num_steps:
            return 0
        for columns in self._histories:  # one env copy's columns: windows never mix copies
            self._writer.create_item(self._table_name, float(priority),
                                     self._layout.item(columns, self._num_steps))
        return self._created(self._num_envs)

    def _created(self, count):
        """Counts `count` new items; every `flush_every` of them, waits for the server to
        confirm all but that many. Returns `count`."""
        self._unflushed += count
        if self._unflushed >= self._flush_every:
            self._writer.flush(block_until_num_items=self._flush_every,
                               timeout_ms=self._flush_timeout_ms)
            self._unflushed = 0
        return count

    def recent_steps(self):
        """The last `num_steps - 1` steps written, encoded (for `prime`)."""
        return list(self._recent)

    def prime(self, steps):
        """Appends steps another writer already wrote, as history only (no items).

        A writer that continues another one's stream on a different server (a collector
        moving to another replay shard) primes itself with that writer's `recent_steps`,
        so the windows spanning the move are written too, on the new server.
        """
        for step in steps[-(self._num_steps - 1):] if self._num_steps > 1 else []:
            self._writer.append(step)
            self._recent.append(step)
            if self._histories is None:
                self._histories = self._writer.history
            self._steps += 1

    def flush(self):
        """Sends every pending item and waits until the server has it."""
        self._writer.flush(timeout_ms=self._flush_timeout_ms)
        self._unflushed = 0

    def close(self):
        self._writer.close()


class SequenceWriter(WindowWriter):
    """Appends batched steps and creates one item per sequence start (buffers/sequence.py's
    rule: each episode's first step and every `period` steps after it, never a LAST row).

    Every step's columns are appended; the start-state column only at sequence starts. The
    item of a start is created once its `num_steps` steps are written, and references them
    and that start's state cell.
    """

    def __init__(self, client, layout, *, period, **options):
        super().__init__(client, layout, **options)
        self._period = period
        self._since_start = np.zeros(self._num_envs, np.int64)
        # Per step of the last num_steps: which copies' steps start a sequence.
        self._starts = collections.deque(maxlen=self._num_steps)

    def write_step(self, priority, leaves, first_id):
        row_leaves, state_leaves = self._layout.split(leaves)
        step_type = np.asarray(row_leaves[0])
        first = step_type == 0
        since_start = np.where(first, 0, self._since_start)
        starts = (since_start % self._period == 0) & (step_type != 2)
        self._since_start = since_start + 1
        ids = np.arange(first_id, first_id + self._num_envs, dtype=np.int64)
        columns = self._layout.encode(row_leaves, ids)
        states = self._layout.encode_states(state_leaves)
        step = [[*copy_columns, states[env] if starts[env] else None]
                for env, copy_columns in enumerate(columns)]
        self._writer.append(step)
        self._starts.append(starts)
        if self._histories is None:
            self._histories = self._writer.history
        self._steps += 1
        if self._steps < self._num_steps:
            return 0
        created = 0
        for env, columns_of_copy in enumerate(self._histories):
            if self._starts[0][env]:
                self._writer.create_item(self._table_name, float(priority),
                                         self._layout.item(columns_of_copy, self._num_steps))
                created += 1
        return self._created(created)

    def recent_steps(self):
        # Unreachable from the app: sequence replay with replay shards is refused up front
        # (experiment.distributed.config.for_agent), so a sequence writer never moves.
        raise RuntimeError("a sequence table's writer cannot move to another shard")

    def prime(self, steps):
        raise RuntimeError("a sequence table's writer cannot move to another shard")
