"""Our replay backends behind TF-Agents' own `ReplayBuffer` interface.

A TF-Agents user with their own training script swaps a buffer by changing the
class they construct, nothing else: `UniformReplayBuffer` takes
`TFUniformReplayBuffer`'s arguments, `EpisodicReplayBuffer` (re-exported from
buffers/tf_agents_episodic.py) `EpisodicReplayBuffer`'s, and
`PrioritizedReplayBuffer` -- which TF-Agents does not have in process -- the
same plus `alpha` and `update_priorities`. They pass TF-Agents' own test files
for those classes (tests/unit/test_tf_agents_*_suite.py runs them, unmodified).

Why a thin adapter rather than a second implementation: the storage, sampling
and priorities are `UniformReplay`'s and `PrioritizedReplay`'s (one flat
variable per data leaf, no CriticalSection), so `get_next` and `as_dataset`
keep their speed and compile with XLA; this module only translates shapes
(no batch or time dimension when TF-Agents' arguments ask for none) and adds
the reads TF-Agents offers and training never needs (`gather_all`, a single
deterministic pass, `clear`).

Storage is TF-Agents' layout: `batch_size` env copies each keep the last
`max_length` items, so `capacity = batch_size * max_length` items.
"""

import tensorflow as tf
from tf_agents.replay_buffers import replay_buffer, table
from tf_agents.replay_buffers.tf_uniform_replay_buffer import BufferInfo
from tf_agents.specs import tensor_spec
from tf_agents.utils import nest_utils

from buffers.episode_sampling import seed_from_global_rng
from buffers.prioritized import PrioritizedReplay
from buffers.tf_agents_episodic import EpisodicReplayBuffer, StatefulEpisodicReplayBuffer
from buffers.tf_agents_reverb import ReverbReplayBuffer
from buffers.tf_agents_reverb import table as reverb_table
from buffers.tf_agents_reverb_observer import ReverbAddTrajectoryObserver
from buffers.uniform import UniformReplay

__all__ = ['BufferInfo', 'EpisodicReplayBuffer', 'PrioritizedReplayBuffer',
           'ReverbAddTrajectoryObserver', 'ReverbReplayBuffer', 'StatefulEpisodicReplayBuffer',
           'TrajectoryObserver', 'UniformReplayBuffer', 'reverb_table']

_EMPTY = 'TFUniformReplayBuffer is empty. Make sure to add items before sampling the buffer.'


class _BackendReplayBuffer(replay_buffer.ReplayBuffer):
    """TF-Agents' `ReplayBuffer` over one of our ring backends (`UniformReplay` or a subclass)."""

    # TF-Agents' ids name every sampled item (its step count); prioritized ids name windows.
    _ids_per_item = True

    def __init__(self, data_spec, batch_size, max_length, *, backend, scope, device,
                 table_fn, dataset_drop_remainder, dataset_window_shift, stateful_dataset):
        if table_fn is not table.Table:
            raise ValueError(f"{type(self).__name__} keeps its own storage (flat variables, "
                             "no Table): table_fn cannot take effect; leave it at its default.")
        if int(batch_size) < 1 or int(max_length) < 1:
            raise ValueError(f"batch_size and max_length must be >= 1, got {batch_size} and "
                             f"{max_length}.")
        super().__init__(data_spec, int(batch_size) * int(max_length), stateful_dataset)
        self._batch_size = int(batch_size)
        self._max_length = int(max_length)
        self._scope = scope
        self._device = device
        self._dataset_drop_remainder = dataset_drop_remainder
        self._dataset_window_shift = dataset_window_shift
        # Under 'Table', the name TF-Agents gives its storage variables (tests select them so).
        with tf.device(device), tf.name_scope(scope), tf.name_scope('Table'):
            self._backend = backend(data_spec, capacity=self._capacity,
                                    num_envs=self._batch_size, batch_size=1, num_steps=1)
            # TF-Agents' tests read `_capacity` as a tensor.
            self._capacity = tf.constant(self._batch_size * self._max_length, tf.int64)

    def variables(self):
        """Every variable of the buffer: a method, as on TF-Agents' buffers (not tf.Module's
        property)."""
        return list(self._backend.variables)

    @property
    def device(self):
        return self._device

    @property
    def scope(self):
        return self._scope

    @property
    def backend(self):
        """The backend underneath (`UniformReplay` or `PrioritizedReplay`)."""
        return self._backend

    def _num_frames(self):
        return self._backend.size()

    def _add_batch(self, items):
        """Writes one item per env copy: every leaf `[batch_size, ...]`."""
        nest_utils.assert_same_structure(items, self._data_spec)
        with tf.device(self._device):
            self._backend.add(tf.nest.map_structure(tf.convert_to_tensor, items))

    def _get_last_id(self):
        """The id of the newest item per env copy (-1 when empty), as TF-Agents counts them."""
        return self._backend.stored_steps()[1] - 1

    def _clear(self, clear_all_variables=False):
        with tf.device(self._device):
            self._backend.clear(zero_storage=clear_all_variables)

    def _get_next(self, sample_batch_size=None, num_steps=None, time_stacked=True):
        """One sampled item, window or batch, shaped as TF-Agents' arguments ask.

        `sample_batch_size=None` drops the batch dimension, `num_steps=None` the
        time dimension, and `time_stacked=False` returns the steps as a tuple.
        """
        batch = 1 if sample_batch_size is None else sample_batch_size
        steps = 1 if num_steps is None else num_steps
        with tf.device(self._device):
            oldest, end = self._backend.stored_steps()
            empty = tf.debugging.assert_greater(end - oldest, tf.cast(steps - 1, tf.int64),
                                                message=_EMPTY)
            with tf.control_dependencies([empty]):
                window, info = self._backend.sample(batch, steps)

        def shape(x):
            if num_steps is None:
                x = tf.squeeze(x, 1)
            if sample_batch_size is None:
                x = tf.squeeze(x, 0)
            return x

        window = tf.nest.pack_sequence_as(self._data_spec,
                                          tf.nest.flatten(tf.nest.map_structure(shape, window)))
        probabilities = info.probabilities
        if self._ids_per_item:
            start = info.keys // self._batch_size
            ids = shape(start[:, None] + tf.range(steps, dtype=tf.int64)[None, :])
        else:
            ids = info.keys
        if sample_batch_size is None:
            probabilities = probabilities[0]
            ids = ids if self._ids_per_item else ids[0]
        if num_steps is not None and not time_stacked:
            axis = 0 if sample_batch_size is None else 1
            window = tuple(tf.nest.map_structure(lambda x, t=t: tf.gather(x, t, axis=axis),
                                                 window) for t in range(num_steps))
            if self._ids_per_item:
                ids = tuple(tf.gather(ids, t, axis=axis) for t in range(num_steps))
        return window, BufferInfo(ids=ids, probabilities=probabilities)

    def _as_dataset(self, sample_batch_size=None, num_steps=None,
                    sequence_preprocess_fn=None, num_parallel_calls=None):
        """An endless dataset of `get_next` draws (what training reads)."""
        if sequence_preprocess_fn is not None:
            raise NotImplementedError('sequence_preprocess_fn is not supported.')
        return tf.data.Dataset.counter().map(
            lambda _: self._get_next(sample_batch_size, num_steps, time_stacked=True),
            num_parallel_calls=num_parallel_calls)

    def _single_deterministic_pass_dataset(self, sample_batch_size=None, num_steps=None,
                                           sequence_preprocess_fn=None,
                                           num_parallel_calls=None):
        """Every stored item once, env copy by env copy (or `sample_batch_size` copies side
        by side), oldest first, cut into `num_steps` windows that advance by
        `dataset_window_shift` (default: no overlap). The ids are our keys."""
        if sequence_preprocess_fn is not None:
            raise NotImplementedError('sequence_preprocess_fn is not supported.')
        self._refuse_dropping_everything(sample_batch_size, num_steps)
        shift = self._dataset_window_shift
        drop = self._dataset_drop_remainder
        num_envs = self._batch_size

        def windows(dataset, drop_remainder):
            if num_steps is None:
                return dataset
            return dataset.window(num_steps, shift=shift).flat_map(
                lambda w: w.batch(num_steps, drop_remainder=drop_remainder))

        def keys_in_order(_):
            oldest, end = self._backend.stored_steps()
            tf.debugging.assert_less(oldest, end, message=_EMPTY)
            steps = tf.range(oldest, end)
            if sample_batch_size is None:
                return tf.data.Dataset.range(num_envs).flat_map(
                    lambda env: windows(
                        tf.data.Dataset.from_tensor_slices(steps * num_envs + env), drop))
            groups = tf.data.Dataset.range(num_envs).batch(sample_batch_size,
                                                          drop_remainder=drop)
            # Each group's items step by step, [group]; windows of them [T, group] -> [group, T].
            rows = groups.flat_map(lambda envs: tf.data.Dataset.from_tensor_slices(
                steps[:, None] * num_envs + envs[None, :]))
            if num_steps is None:
                return rows
            return windows(rows, drop_remainder=True).map(tf.transpose)

        keys = tf.data.Dataset.range(1).flat_map(keys_in_order)
        return keys.map(lambda key: (self._read(key), BufferInfo(ids=key, probabilities=())),
                        num_parallel_calls=num_parallel_calls)

    def _refuse_dropping_everything(self, sample_batch_size, num_steps):
        """TF-Agents' check: with `dataset_drop_remainder`, a batch wider than the env copies
        or a window longer than `max_length` would drop every item."""
        if not self._dataset_drop_remainder:
            return
        size, steps = tf.get_static_value(sample_batch_size), tf.get_static_value(num_steps)
        if size is not None and size > self._batch_size:
            raise ValueError(f'sample_batch_size ({size}) > self.batch_size ({self._batch_size}) '
                             'and dataset_drop_remainder is True. In this case, ALL data will '
                             'be dropped by the deterministic dataset.')
        if steps is not None and steps > self._max_length:
            raise ValueError(f'num_steps ({steps}) > self.max_length ({self._max_length}) and '
                             'dataset_drop_remainder is True. In this case, ALL data will be '
                             'dropped by the deterministic dataset.')

    def _read(self, keys):
        return tf.nest.pack_sequence_as(self._data_spec,
                                        tf.nest.flatten(self._backend.read(keys)))

    def _gather_all(self):
        """Every stored item, `[batch_size, items per copy, ...]`, oldest first."""
        oldest, end = self._backend.stored_steps()
        steps = tf.range(oldest, end)
        envs = tf.range(self._batch_size, dtype=tf.int64)
        return self._read(envs[:, None] + steps[None, :] * self._batch_size)


class UniformReplayBuffer(_BackendReplayBuffer):
    """A drop-in `TFUniformReplayBuffer` over `UniformReplay`.

    Same constructor, methods and sampling law (each stored item, or each window
    of `num_steps` consecutive items of one env copy, equally likely; windows
    may cross episode boundaries as TF-Agents' do). `BufferInfo.ids` are each
    item's step count as TF-Agents gives them; `probabilities` are exact.
    `seed` (ours) seeds sampling; by default it is drawn from TF's global RNG.
    """

    def __init__(self, data_spec, batch_size, max_length=1000, scope='TFUniformReplayBuffer',
                 device='cpu:*', table_fn=table.Table, dataset_drop_remainder=False,
                 dataset_window_shift=None, stateful_dataset=False, seed=None):
        seed = seed_from_global_rng(seed)
        super().__init__(
            data_spec, batch_size, max_length,
            backend=lambda *args, **kwargs: UniformReplay(*args, seed=seed, **kwargs),
            scope=scope, device=device, table_fn=table_fn,
            dataset_drop_remainder=dataset_drop_remainder,
            dataset_window_shift=dataset_window_shift, stateful_dataset=stateful_dataset)


class PrioritizedReplayBuffer(_BackendReplayBuffer):
    """Proportional prioritized replay with `TFUniformReplayBuffer`'s interface.

    Windows are drawn with probability `(p + priority_epsilon) ** alpha` over the
    sum of valid windows, `p` the last priority given for the window's first
    item; new items get the largest priority so far. `BufferInfo.ids` holds one
    key per window (not per item): pass them with the new priorities (|TD
    errors|) to `update_priorities`, and weight the loss by
    `(1 / (N * probabilities)) ** beta` as usual. A batch is ordered by stratum
    (cumulative priority), not shuffled.
    """

    def __init__(self, data_spec, batch_size, max_length=1000, alpha=0.6,
                 priority_epsilon=1e-6, scope='PrioritizedReplayBuffer', device='cpu:*',
                 table_fn=table.Table, dataset_drop_remainder=False, dataset_window_shift=None,
                 stateful_dataset=False, seed=None):
        seed = seed_from_global_rng(seed)
        super().__init__(
            data_spec, batch_size, max_length,
            backend=lambda *args, **kwargs: PrioritizedReplay(
                *args, seed=seed, alpha=alpha, priority_epsilon=priority_epsilon, **kwargs),
            scope=scope, device=device, table_fn=table_fn,
            dataset_drop_remainder=dataset_drop_remainder,
            dataset_window_shift=dataset_window_shift, stateful_dataset=stateful_dataset)

    _ids_per_item = False

    def update_priorities(self, ids, priorities):
        """Sets the priorities of sampled windows (ids from `BufferInfo.ids`); ids whose item
        was overwritten since are ignored, and so are negative or non-finite priorities."""
        with tf.device(self._device):
            self._backend.update_priorities(ids, priorities)


class TrajectoryObserver:
    """TF-Agents' observer protocol over any of our backends (`buffers/`).

    What TF-Agents' drivers and `rlds_to_reverb.push_rlds_to_reverb` call: one
    unbatched `Trajectory` per `__call__`, and `get_table_signature()`, which
    `push_rlds_to_reverb` compares with the dataset's trajectory spec (so build
    the backend with `rlds_to_reverb.create_trajectory_data_spec(episodes)` as
    its data spec). With a Reverb backend the trajectories land in our packed
    table, in its own server:

        backend = ReverbUniformReplay(spec, capacity=..., num_steps=2)
        rlds_to_reverb.push_rlds_to_reverb(episodes, TrajectoryObserver(backend))
    """

    def __init__(self, backend):
        """`backend`: any of ours, built with `num_envs=1` (one trajectory per call)."""
        self._backend = backend

    def get_table_signature(self):
        """The trajectories this observer accepts, with the outer time dimension TF-Agents'
        Reverb tables declare."""
        return tensor_spec.add_outer_dim(self._backend.data_spec)

    def __call__(self, trajectory):
        self._backend.add(tf.nest.map_structure(lambda x: tf.convert_to_tensor(x)[None],
                                                trajectory))

    def flush(self):
        """Makes every written step sampleable (a Reverb backend sends its pending items)."""
        if self._backend.capabilities.server:
            self._backend.flush()

    def close(self):
        self.flush()
