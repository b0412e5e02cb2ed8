"""Replay of ready-made windows: what a distributed learner keeps when it holds the replay.

A distributed learner that samples every batch from a Reverb server pays Reverb's
client-side cost for every window of every batch (receiving, unpacking and batching it,
~10 µs per window on this project's CPU): SAC Pendulum samples 256 windows per
gradient step, and that cost alone held its learner to ~0.6x of one process
(docs/benchmarks.md). With `distributed.settings.learner_holds_replay` the learner
receives each window ONCE, from a Reverb queue the collectors fill, keeps it here, and
samples its batches from memory the way one process does.

Windows arrive whole (`[K, T, ...]`: `num_steps` steps of one env copy, as the collectors
write them), so this store keeps each window as one row of a `UniformReplay` or
`PrioritizedReplay` whose rows are windows: one "step" per row, `K` rows per `add`, and
`sample(batch, T)` draws one-row windows and drops that length-1 axis. Sampling,
priorities, importance probabilities, XLA and checkpoints are those backends' own, so
the learner's training chunk is the single-process one. A window stores both of its
steps (a ring of steps would store each observation once), which is why the learner holds
replay only for vector observations, not frames (experiment/replay.py refuses frames).
"""

import tensorflow as tf

from buffers.base import Capabilities


def window_spec(data_spec, num_steps):
    """The spec of one stored window: every leaf with a leading `num_steps` axis."""
    return tf.nest.map_structure(
        lambda spec: tf.TensorSpec([num_steps, *spec.shape], spec.dtype, spec.name), data_spec)


class WindowStore:
    """A `ReplayBackend` over whole windows, `windows_per_add` of them per `add`.

    Attributes:
      capabilities: the inner backend's XLA, priorities and concurrent writes (the
        learner takes its next windows in on a thread while it trains, where the inner
        backend allows it: uniform sampling, not the prioritized sum tree).
    """

    capabilities = Capabilities(xla=True, priorities=True, concurrent_writes=True)

    def __init__(self, inner_class, data_spec, *, capacity, windows_per_add, batch_size,
                 num_steps, seed=0):
        """Allocates `capacity` windows.

        Args:
          inner_class: `UniformReplay` or `PrioritizedReplay` (its sampling is kept).
          data_spec: the agent's `collect_data_spec` (one step).
          capacity: windows kept (rounded down to a multiple of `windows_per_add`).
          windows_per_add: windows in every `add` (the learner's drain size).
          batch_size: the learner's batch size (validated against capacity).
          num_steps: the window length the agent trains on.
          seed: seeds the inner backend's sampling (checkpointed with it).
        """
        self._num_steps = num_steps
        self._inner = inner_class(window_spec(data_spec, num_steps), capacity=capacity,
                                  num_envs=windows_per_add, batch_size=batch_size, num_steps=1,
                                  seed=seed, name='window_store')
        self.capabilities = type(self).capabilities.narrowed(
            xla=self._inner.capabilities.xla, priorities=self._inner.capabilities.priorities,
            concurrent_writes=self._inner.capabilities.concurrent_writes)
        self._windows_per_add = windows_per_add

    @property
    def inner(self):
        return self._inner

    @property
    def capacity(self):
        return self._inner.capacity

    @property
    def adds_kept(self):
        """How many `add`s the store keeps before it overwrites the oldest."""
        return self.capacity // self._windows_per_add

    def allow_concurrent_writes(self, adds):
        """Lets a thread make up to `adds` `add` calls while a batch is sampled."""
        self._inner.allow_concurrent_writes(adds)

    def add(self, windows):
        """Stores `windows_per_add` windows, the nest `[K, num_steps, ...]`."""
        self._inner.add(windows)

    def sample(self, batch_size, num_steps):
        """`(windows [B, num_steps, ...], SampleInfo)`, drawn as the inner backend draws."""
        if num_steps != self._num_steps:
            raise ValueError(f"this store keeps {self._num_steps}-step windows, not {num_steps}")
        rows, info = self._inner.sample(batch_size, 1)
        return tf.nest.map_structure(lambda leaf: leaf[:, 0], rows), info

    def as_dataset(self, batch_size, num_steps):
        return tf.data.Dataset.from_tensors(0).repeat().map(
            lambda _: self.sample(batch_size, num_steps))

    def update_priorities(self, keys, priorities):
        self._inner.update_priorities(keys, priorities)

    def size(self):
        """Windows stored now (a tensor)."""
        return self._inner.size()

    def metrics(self):
        return self._inner.metrics()

    def histograms(self):
        return self._inner.histograms()

    def ages(self, keys):
        """Windows received since each sampled key's window arrived."""
        return self._inner.ages(keys)

    def checkpoint_items(self):
        return self._inner.checkpoint_items()

    def close(self):
        self._inner.close()
