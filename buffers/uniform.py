"""Uniform replay as a ring buffer of plain TF variables.

Why not `TFUniformReplayBuffer`: it guards its storage with a CriticalSection,
which XLA cannot compile, so a fused collect-and-train loop around it cannot be
jit-compiled. Here storage is one flat variable per data leaf, indexed
`row = slot * num_envs + env`, and sampling is a `tf.gather` -- every op has an
XLA kernel.

Each row stores one time step of one env copy (a `Trajectory` step), so an
observation is stored once, not twice as (obs, next_obs) pairs would be.
"""

import gin
import tensorflow as tf

from buffers.base import Capabilities, SampleInfo, validate_capacity
from core.errors import UserError

XLA_MAX_ROW_BYTES = 4096


def _largest_row_bytes(data_spec):
    return max(spec.shape.num_elements() * spec.dtype.size
               for spec in tf.nest.flatten(data_spec))


@gin.configurable
class UniformReplay(tf.Module):
    """In-process uniform replay over `num_envs` batched env copies.

    Sampled windows are `num_steps` consecutive steps of one env copy; they may
    cross an episode boundary (LAST -> FIRST) exactly as TF-Agents' buffers do,
    and agents mask those boundary transitions.
    """

    capabilities = Capabilities(xla=True, concurrent_writes=True, bulk_steps=True)

    def __init__(self, data_spec, *, capacity, num_envs=1, batch_size=1, num_steps=2, seed=0,
                 name='uniform_replay'):
        """Allocates storage for `capacity` transitions.

        Args:
          data_spec: nest of `tf.TensorSpec`, normally `agent.collect_data_spec`.
          capacity: transitions kept, summed over env copies.
          num_envs: batch size of every `add` call.
          batch_size: the learner's batch size (validated against capacity).
          num_steps: the learner's window length (validated against capacity).
          seed: seeds the sampling RNG, which is checkpointed with the buffer.
          name: module name.
        """
        super().__init__(name=name)
        self._rows_per_env = validate_capacity(
            capacity, batch_size=batch_size, num_envs=num_envs, num_steps=num_steps)
        self._data_spec = data_spec
        self._num_envs = num_envs
        self._capacity = self._rows_per_env * num_envs
        total_rows = self._capacity
        self._storage = tf.nest.map_structure(
            lambda spec: tf.Variable(
                tf.zeros([total_rows, *spec.shape], spec.dtype), trainable=False),
            data_spec)
        self._num_adds = tf.Variable(0, dtype=tf.int64, trainable=False, name='num_adds')
        self._num_sampled = tf.Variable(0, dtype=tf.int64, trainable=False, name='num_sampled')
        self._rng = tf.random.Generator.from_seed(seed)
        self._closed = False
        self._write_guard = 0
        # XLA's CPU gather is ~1.7x slower than TF's own for large rows (28 KB image rows,
        # measured by `make bench`), so only buffers of small rows ask the loop to compile.
        # Bulk writes (`add_steps`) fill one env copy's ring in order.
        self.capabilities = type(self).capabilities.narrowed(
            xla=_largest_row_bytes(data_spec) <= XLA_MAX_ROW_BYTES, bulk_steps=num_envs == 1)

    @property
    def capacity(self):
        return self._capacity

    @property
    def data_spec(self):
        return self._data_spec

    def add(self, trajectory):
        """Writes one batched step `[num_envs, ...]` at the ring's write slot.

        The count moves only after the rows are written, so a sampler on another
        thread (run.overlap_collection) never reads a row that is not there yet.
        """
        slot = self._num_adds % self._rows_per_env
        rows = slot * self._num_envs + tf.range(self._num_envs, dtype=tf.int64)
        writes = [var.scatter_update(tf.IndexedSlices(value, rows))
                  for var, value in zip(tf.nest.flatten(self._storage),
                                        tf.nest.flatten(trajectory))]
        with tf.control_dependencies(writes):
            self._num_adds.assign_add(1)

    def add_steps(self, steps):
        """Writes `T` consecutive steps of the one env copy, `[T, ...]`, as T `add`s would.

        Loading a dataset (rlds_io.importing) goes through here in chunks: one `add` per
        step costs ~0.2 ms of graph-loop overhead, four minutes for a 1M-step dataset.
        """
        if not self.capabilities.bulk_steps:
            raise NotImplementedError(f"{type(self).__name__}.add_steps needs num_envs=1 and "
                                      "UniformReplay's own add (capabilities.bulk_steps).")
        count = tf.shape(tf.nest.flatten(steps)[0], out_type=tf.int64)[0]
        tf.debugging.assert_less_equal(count, tf.cast(self._rows_per_env, tf.int64),
                                       message='add_steps: more steps than the ring holds')
        rows = (self._num_adds + tf.range(count, dtype=tf.int64)) % self._rows_per_env
        writes = [var.scatter_update(tf.IndexedSlices(value, rows))
                  for var, value in zip(tf.nest.flatten(self._storage), tf.nest.flatten(steps))]
        with tf.control_dependencies(writes):
            self._num_adds.assign_add(count)

    def allow_concurrent_writes(self, steps):
        """Lets a collector thread add up to `steps` steps per env copy during any sample.

        Sampling then skips the oldest `steps` rows of a full ring: those are the
        ones such a writer may be overwriting while a window is gathered. Call it
        before the first `sample` is traced. Subclasses that keep more state than
        the rows (prioritized replay's sum tree) declare `concurrent_writes=False`;
        callers go through `buffers.base.allow_concurrent_writes`, which refuses them.
        """
        if steps + 1 >= self._rows_per_env:
            raise UserError(f"run.overlap_collection keeps the oldest {steps} steps per env "
                            f"copy out of sampling, but the replay holds only "
                            f"{self._rows_per_env} per copy: raise run.replay_capacity.")
        self._write_guard = int(steps)

    def sample(self, batch_size, num_steps):
        """Draws `batch_size` windows of `num_steps` steps, uniformly.

        Only windows lying wholly inside the last `rows_per_env` steps are valid,
        so a window never mixes overwritten and fresh rows (nor, with concurrent
        writes allowed, rows that may be overwritten while they are gathered).
        """
        num_adds = self._num_adds.read_value()
        oldest = tf.maximum(num_adds - self._rows_per_env + self._write_guard, 0)
        num_starts = tf.maximum(num_adds - num_steps + 1 - oldest, 1)
        start = oldest + self._rng.uniform([batch_size], 0, num_starts, dtype=tf.int64)
        env = self._rng.uniform([batch_size], 0, self._num_envs, dtype=tf.int64)
        window = self._gather_windows(start, env, num_steps)
        self._num_sampled.assign_add(batch_size)
        probability = 1.0 / tf.cast(num_starts * self._num_envs, tf.float32)
        info = SampleInfo(keys=start * self._num_envs + env,
                          probabilities=tf.fill([batch_size], probability))
        return window, info

    def _gather_windows(self, start, env, num_steps):
        """Reads `num_steps` consecutive steps of copy `env` from absolute step `start`.

        Shared with subclasses that choose starts differently (prioritized
        replay), so the ring layout is decoded in one place.
        """
        steps = start[:, None] + tf.range(num_steps, dtype=tf.int64)[None, :]
        rows = (steps % self._rows_per_env) * self._num_envs + env[:, None]
        flat_rows = tf.reshape(rows, [-1])
        return tf.nest.map_structure(
            lambda var: tf.reshape(tf.gather(var, flat_rows), [-1, num_steps, *var.shape[1:]]),
            self._storage)

    def stored_steps(self):
        """`(oldest, end)`: the absolute steps `[oldest, end)` each env copy still holds."""
        end = self._num_adds.read_value()
        return tf.maximum(end - self._rows_per_env, 0), end

    def read(self, keys):
        """The stored steps at absolute keys `step * num_envs + env`, any shape of keys.

        For callers that choose what to read themselves (TF-Agents' `gather_all` and
        deterministic passes in buffers/tf_agents_api.py); the keys must be stored.
        """
        keys = tf.cast(keys, tf.int64)
        step, env = keys // self._num_envs, keys % self._num_envs
        rows = (step % self._rows_per_env) * self._num_envs + env
        return tf.nest.map_structure(lambda var: tf.gather(var, rows), self._storage)

    def clear(self, zero_storage=False):
        """Forgets every stored step (TF-Agents' `clear`); the memory stays allocated.

        Args:
          zero_storage: also overwrite the rows with zeros, not only forget them.
        """
        self._num_adds.assign(0)
        if zero_storage:
            for var in tf.nest.flatten(self._storage):
                var.assign(tf.zeros_like(var))

    def as_dataset(self, batch_size, num_steps):
        """An endless dataset of sampled batches, for learners fed by tf.data."""
        return tf.data.Dataset.from_tensors(0).repeat().map(
            lambda _: self.sample(batch_size, num_steps))

    def update_priorities(self, keys, priorities):
        """Uniform replay has no priorities; accepting the call keeps loops backend-agnostic."""
        del keys, priorities

    def size(self):
        """Transitions currently stored (a tensor)."""
        return tf.minimum(self._num_adds, self._rows_per_env) * self._num_envs

    def metrics(self):
        size = float(self.size().numpy())
        return {
            'size': size,
            'capacity': float(self._capacity),
            'fill_ratio': size / self._capacity,
            'inserted': float(self._num_adds.numpy() * self._num_envs),
            'sampled': float(self._num_sampled.numpy()),
        }

    def histograms(self):
        """Distributions worth a TensorBoard histogram (name -> numpy array); none here."""
        return {}

    def ages(self, keys):
        """Transitions inserted since each key's first step was written.

        Keys are absolute ids `step * num_envs + env`, so the age in env steps
        (summed over copies) falls out of the insertion counter directly.
        """
        newest = self._num_adds.read_value() * self._num_envs
        return newest - tf.cast(keys, tf.int64)

    def checkpoint_items(self):
        return {
            'storage': tf.nest.flatten(self._storage),
            'num_adds': self._num_adds,
            'num_sampled': self._num_sampled,
            'rng': self._rng,
        }

    def close(self):
        """Drops the storage references so their memory can be freed; idempotent."""
        self._closed = True
