"""TF-Agents' `EpisodicReplayBuffer`, rebuilt on flat variables for speed.

A TF-Agents user swaps this class into their own script by changing the class
they construct: it is a `tf_agents.replay_buffers.replay_buffer.ReplayBuffer`
with the constructor and behaviour of TF-Agents' `EpisodicReplayBuffer`
(episode ids handed out by the buffer, `add_batch(items, episode_ids)`,
`add_sequence`, `extend_episodes`, `extract`, whole episodes or `num_steps`
windows from `as_dataset`, `completed_only`, a single deterministic pass,
`clear`), and works under TF-Agents' `StatefulEpisodicReplayBuffer`. TF-Agents'
own test file for that class runs against it (tests/unit/test_tf_agents_episodic_suite.py).

Why not TF-Agents' class: it keeps each episode in a TensorList inside a
variant variable, guarded by a CriticalSection, and samples windows element
by element in a tf.data pipeline (draw an episode, read its lists, filter the
short ones, slice). None of that compiles with XLA, and every window costs a
handful of list ops. Here storage is one flat variable per data leaf, and a
batch of windows is a fixed graph of vectorised gathers.

Three modules, bottom up: buffers/episode_pool.py (the storage layout and the
write path), buffers/episode_sampling.py (the reads: uniform windows and episodes,
the datasets, `gather_all`; how sampling differs from TF-Agents'), and this one (TF-Agents'
interface: the constructor, episode ids, adds, `extend_episodes`, `extract`,
`clear`, and the stateful wrapper).
"""

import functools

import tensorflow as tf
from tensorflow.python.ops import list_ops  # pylint: disable=g-direct-tensorflow-import
from tf_agents.replay_buffers import replay_buffer
from tf_agents.replay_buffers.episodic_replay_buffer import BufferInfo, Episodes

from buffers.episode_pool import INVALID_ID, invalid_ids
from buffers.episode_sampling import EpisodeSampling, positive_int

__all__ = ['BufferInfo', 'EpisodicReplayBuffer', 'Episodes', 'StatefulEpisodicReplayBuffer']


def _trajectory_flag(read_flag, argument):
    """TF-Agents' default `begin_episode_fn` (reading `is_first()`) or `end_episode_fn`
    (`is_last()`): the Trajectory's own flags, and TF-Agents' error for anything else."""
    def flag(items):
        try:
            return read_flag(items)
        except AttributeError:
            raise TypeError('Argument t is not a Trajectory; did you forget to pass the proper '
                            f'{argument} to EpisodicReplayBuffer?  Saw: {items!r}') from None
    return flag


_is_first = _trajectory_flag(lambda items: items.is_first(), 'begin_episode_fn')
_is_last = _trajectory_flag(lambda items: items.is_last(), 'end_episode_fn')


class EpisodicReplayBuffer(EpisodeSampling, replay_buffer.ReplayBuffer):
    """Episodes in flat variables, behind TF-Agents' `EpisodicReplayBuffer` interface.

    Storage and the write path are `EpisodePool`'s, the reads `EpisodeSampling`'s
    (uniform over valid windows). Episode ids, their locations, completion,
    eviction and the private methods TF-Agents' tests call (`_get_episode_id`,
    `_get_batch_episode_ids`, `_maybe_end_episode`, `_maybe_end_batch_episodes`,
    `_completed_episodes`, `_get_episode`, `_get_last_episode_id`) mean what
    they mean in TF-Agents' class.
    """

    def __init__(self, data_spec, capacity=1000, completed_only=False, buffer_size=8,
                 name_prefix='EpisodicReplayBuffer', device='cpu:*', seed=None,
                 begin_episode_fn=None, end_episode_fn=None, dataset_drop_remainder=False,
                 dataset_window_shift=None):
        """Creates the buffer; the arguments are TF-Agents' `EpisodicReplayBuffer`'s.

        Args:
          data_spec: nest of `TensorSpec`s of one item.
          capacity: the number of episodes kept.
          completed_only: sample only completed episodes (whole, or windows).
          buffer_size: how many batches' window starts `as_dataset` draws at
            once (new data may be unseen for up to `buffer_size - 1` batches).
          name_prefix: prefix of the variable names.
          device: where the variables live.
          seed: the sampling RNG's seed; None draws one from TF's global RNG.
          begin_episode_fn: items -> bool scalar or [num_episodes]: the item
            begins a new episode. Default: `items.is_first()`.
          end_episode_fn: items -> bool: the item completes its episode.
            Default: `items.is_last()`.
          dataset_drop_remainder: a single deterministic pass drops a last
            window or batch that is short.
          dataset_window_shift: the shift between windows of a single
            deterministic pass (None: `num_steps`, no overlap).
        """
        capacity = positive_int('capacity', capacity)
        super().__init__(data_spec, capacity, stateful_dataset=True)
        begin_episode_fn = _is_first if begin_episode_fn is None else begin_episode_fn
        end_episode_fn = _is_last if end_episode_fn is None else end_episode_fn
        if not callable(begin_episode_fn):
            raise TypeError(f'begin_episode_fn is not callable: {begin_episode_fn}')
        if not callable(end_episode_fn):
            raise TypeError(f'end_episode_fn is not callable: {end_episode_fn}')
        self._begin_episode_fn = begin_episode_fn
        self._end_episode_fn = end_episode_fn
        self._completed_only = bool(completed_only)
        self._buffer_size = positive_int('buffer_size', buffer_size)
        self._name_prefix = name_prefix
        self._device = device
        self._dataset_drop_remainder = bool(dataset_drop_remainder)
        self._dataset_window_shift = positive_int('dataset_window_shift',
                                                  dataset_window_shift, allow_none=True)
        self._create_pool(name_prefix, device)
        self._create_rng(seed, device)

    # ------------------------------------------------------------------ properties

    @property
    def num_writes(self):
        return self._num_writes

    @property
    def name_prefix(self):
        return self._name_prefix

    def _num_frames(self):
        return tf.reduce_sum(self._episode_lengths)

    # ------------------------------------------------------------------ episode ids

    def create_episode_ids(self, num_episodes=None):
        """Fresh (invalid, -1) episode ids: a scalar, or a vector of `num_episodes`.

        `add_batch` and the like replace a -1 by a new episode's id and return it.

        Raises:
          ValueError: if `num_episodes` exceeds the capacity or is a non-scalar tensor.
        """
        if tf.is_tensor(num_episodes):
            if num_episodes.shape.rank != 0:
                raise ValueError(f'num_episodes must be a scalar, but saw shape: '
                                 f'{num_episodes.shape}')
            return invalid_ids([num_episodes], name='episode_id')
        shape = ()
        if num_episodes is not None and num_episodes > 0:
            if num_episodes > self._capacity:
                raise ValueError(f'Buffer cannot create episode_ids when num_episodes '
                                 f'{num_episodes} > capacity {self._capacity}.')
            shape = (num_episodes,)
        return tf.constant(INVALID_ID, tf.int64, shape=shape, name='episode_id')

    def get_valid_ids_mask(self, episode_ids):
        """Whether each of `episode_ids` is a stored episode."""
        return self._alive(tf.convert_to_tensor(episode_ids, tf.int64))

    def _get_last_episode_id(self):
        return self._last_episode.read_value()

    def _get_episode_id(self, episode_id, begin_episode=False, end_episode=False):
        """The scalar form of `_get_batch_episode_ids` (a new id if -1 or `begin_episode`)."""
        episode_id = tf.convert_to_tensor(episode_id, tf.int64)
        begin = tf.convert_to_tensor(begin_episode, tf.bool)
        end = tf.convert_to_tensor(end_episode, tf.bool)
        if episode_id.shape.rank != 0 or begin.shape.rank != 0 or end.shape.rank != 0:
            raise ValueError('Invalid condition predicate shape: episode_id, begin_episode '
                             'and end_episode must be scalars here (use the batch methods).')
        return self._get_batch_episode_ids(episode_id[None], begin[None], end[None])[0]

    def _maybe_end_episode(self, episode_id, end_episode=False):
        """Marks `episode_id` completed if `end_episode` and it is stored; returns whether
        it is a stored, completed episode."""
        episode_id = tf.convert_to_tensor(episode_id, tf.int64)
        end = tf.convert_to_tensor(end_episode, tf.bool)
        if end.shape.rank != 0:
            raise ValueError(f'Invalid condition shape: {end.shape} (should be scalar).')
        return self._maybe_end_batch_episodes(episode_id[None], end[None])[0]

    def _completed_episodes(self):
        """int64 ids of the stored completed episodes, in location order."""
        return tf.boolean_mask(self._episodes_loc_to_id_map,
                               tf.equal(self._episode_completed, 1))

    # ------------------------------------------------------------------ writing

    def _convert(self, items):
        return tf.nest.map_structure(lambda x, spec: tf.convert_to_tensor(x, spec.dtype),
                                     items, self._data_spec)

    def add_batch(self, items, episode_ids=None):
        """Adds one item to each of a batch of episodes.

        Args:
          items: nest like `data_spec` with an outer `[num_episodes]` dimension.
          episode_ids: int64 `[num_episodes]` (from `create_episode_ids` or the
            previous call).

        Returns:
          The updated ids: -1 entries and entries whose item begins an episode
          get new ids. Items of episodes no longer stored are dropped.

        Raises:
          NotImplementedError: without `episode_ids` (the base class's `add_batch(items)`).
        """
        if episode_ids is None:
            return self._add_batch(items)
        episode_ids = tf.convert_to_tensor(episode_ids, tf.int64)
        episode_ids.shape.assert_has_rank(1)
        items = self._convert(items)
        with tf.device(self._device), tf.name_scope('add_batch'):
            shape = tf.shape(episode_ids)
            return self._write(
                episode_ids, self._flags(self._begin_episode_fn(items), shape),
                self._flags(self._end_episode_fn(items), shape),
                tf.ones_like(episode_ids), tf.constant(1, tf.int64), tf.nest.flatten(items))

    def add_sequence(self, items, episode_id):
        """Adds a sequence of items `[T, ...]` to one episode.

        `begin_episode_fn` / `end_episode_fn` see the whole sequence and must
        give a scalar: whether it begins a new episode, and whether it
        completes it.

        Returns:
          The updated scalar episode id.
        """
        episode_id = tf.convert_to_tensor(episode_id, tf.int64)
        episode_id.shape.assert_has_rank(0)
        items = self._convert(items)
        flat = tf.nest.flatten(items)
        begin = tf.convert_to_tensor(self._begin_episode_fn(items), tf.bool)
        end = tf.convert_to_tensor(self._end_episode_fn(items), tf.bool)
        if begin.shape.rank != 0 or end.shape.rank != 0:
            raise ValueError('add_sequence: begin_episode_fn and end_episode_fn must give a '
                             f'scalar for the whole sequence, got shapes {begin.shape} and '
                             f'{end.shape}.')
        with tf.device(self._device), tf.name_scope('add_sequence'):
            count = tf.shape(flat[0], out_type=tf.int64)[:1]
            return self._write(episode_id[None], begin[None], end[None], count,
                               tf.constant(0, tf.int64), flat)[0]

    @staticmethod
    def _flags(flags, shape):
        return tf.broadcast_to(tf.convert_to_tensor(flags, tf.bool), shape)

    def extend_episodes(self, episode_ids, episode_ids_indices, episodes):
        """Appends whole `Episodes` (TensorLists, e.g. from `extract`) to some episodes.

        Args:
          episode_ids: int64 `[max_num_episodes]`.
          episode_ids_indices: int64 `[n]`: which entries of `episode_ids` are extended.
          episodes: an `Episodes` tuple with outer dimension `n`: `length` (items
            appended from each list), `completed` (the episode's new flag) and
            `tensor_lists` (a nest like `data_spec` of variant TensorList `[n]`).

        Returns:
          The updated `[max_num_episodes]` ids (`begin_episode_fn(episodes)`
          starts new episodes for the extended entries).
        """
        episode_ids = tf.convert_to_tensor(episode_ids, tf.int64)
        episode_ids.shape.assert_has_rank(1)
        indices = tf.cast(tf.convert_to_tensor(episode_ids_indices), tf.int64)
        indices.shape.assert_has_rank(1)
        with tf.device(self._device), tf.name_scope('extend_episodes'):
            shape = tf.shape(episode_ids, out_type=tf.int64)
            begin = tf.broadcast_to(tf.convert_to_tensor(self._begin_episode_fn(episodes),
                                                         tf.bool), tf.shape(indices))
            spread = lambda values: tf.scatter_nd(indices[:, None], values, shape)  # noqa: E731
            ids = self._get_batch_episode_ids(episode_ids, begin_episode=spread(begin),
                                              mask=spread(tf.ones_like(begin)))
            chosen = tf.gather(ids, indices)
            alive = self._alive(chosen)
            lengths = tf.cast(episodes.length, tf.int64)
            counts = tf.where(alive, lengths, tf.zeros_like(lengths))
            locations = self._location(chosen)
            completed = self._episode_completed.scatter_update(tf.IndexedSlices(
                tf.boolean_mask(tf.cast(episodes.completed, tf.uint8), alive),
                tf.boolean_mask(locations, alive)))
            frames = [self._concat_lists(lists, counts, spec)
                      for lists, spec in zip(tf.nest.flatten(episodes.tensor_lists),
                                             self._flat_spec)]
            with tf.control_dependencies([completed]):
                append = self._append(locations, counts, frames)
            with tf.control_dependencies([append]):
                return tf.identity(ids)

    @staticmethod
    def _concat_lists(lists, counts, spec):
        """The first `counts[i]` items of each TensorList `lists[i]`, concatenated."""
        size = tf.shape(lists)[0]
        parts = tf.TensorArray(spec.dtype, size=size, infer_shape=False,
                               element_shape=tf.TensorShape([None, *spec.shape]))

        def body(i, parts):
            items = list_ops.tensor_list_stack(lists[i], spec.dtype, element_shape=spec.shape)
            return i + 1, parts.write(i, items[:counts[i]])

        _, parts = tf.while_loop(lambda i, _: i < size, body, [tf.constant(0), parts])
        return tf.cond(size > 0, parts.concat,
                       lambda: tf.zeros([0, *spec.shape], spec.dtype))

    # ------------------------------------------------------------------ extract / clear

    def extract(self, locations, clear_data=False):
        """The episodes at `locations` (locations, not ids) as `Episodes` of TensorLists.

        Args:
          locations: int `[n]` in `[0, capacity)`.
          clear_data: also empty those locations (the ids stay stored, with
            length 0, so their writers carry on from empty, as in TF-Agents).
        """
        locations = tf.cast(tf.convert_to_tensor(locations), tf.int64)
        locations.shape.assert_has_rank(1)
        with tf.device(self._device), tf.name_scope('extract'):
            ids = tf.gather(self._episodes_loc_to_id_map, locations)

            def lists(episode_id):
                values = tf.nest.flatten(self._episode_values(episode_id))
                return [list_ops.tensor_list_from_tensor(v, element_shape=spec.shape)
                        for v, spec in zip(values, self._flat_spec)]

            flat_lists = tf.map_fn(
                lists, ids, fn_output_signature=[tf.TensorSpec([], tf.variant)] * len(
                    self._flat_spec))
            episodes = Episodes(length=tf.gather(self._episode_lengths, locations),
                                completed=tf.gather(self._episode_completed, locations),
                                tensor_lists=self._pack(flat_lists))
            if not clear_data:
                return episodes
            with tf.control_dependencies(tf.nest.flatten(episodes)):
                clear = self._clear_locations(locations)
            with tf.control_dependencies([clear]):
                return tf.nest.map_structure(tf.identity, episodes)

    def _clear(self, clear_all_variables=False):
        """Empties the buffer. By default the episode ids stay stored (length 0), so
        writers holding them carry on; `clear_all_variables` forgets them too."""
        return self._clear_pool(clear_all_variables)

    def _add_batch(self, items):
        raise NotImplementedError('EpisodicReplayBuffer.add_batch needs episode_ids: call '
                                  'add_batch(items, episode_ids), or wrap the buffer in '
                                  'buffers.tf_agents_episodic.StatefulEpisodicReplayBuffer, '
                                  'which keeps them.')


class StatefulEpisodicReplayBuffer(replay_buffer.ReplayBuffer):
    """Keeps the episode ids of an `EpisodicReplayBuffer` in a variable, for drivers.

    TF-Agents' `StatefulEpisodicReplayBuffer` accepts only TF-Agents' own
    episodic class, so a user swapping ours in swaps this wrapper too. Same
    constructor and methods: `add_batch(items)` (an observer), `add_sequence`,
    `extend_episodes`, `episode_ids`; reads go to the wrapped buffer.
    """

    def __init__(self, replay_buffer, num_episodes=None):
        """Wraps `replay_buffer` for `num_episodes` parallel episodes (None: one, scalar id).

        Raises:
          TypeError: if `replay_buffer` is not our `EpisodicReplayBuffer`.
          ValueError: if `num_episodes` exceeds its capacity.
        """
        if not isinstance(replay_buffer, EpisodicReplayBuffer):
            raise TypeError(f'Expected a buffers.tf_agents_episodic.EpisodicReplayBuffer, '
                            f'saw {replay_buffer}')
        super().__init__(replay_buffer.data_spec, replay_buffer.capacity)
        self._replay_buffer = replay_buffer
        self._episode_ids_var = tf.Variable(
            replay_buffer.create_episode_ids(num_episodes), trainable=False,
            name='episode_id')

    @property
    def episode_ids(self):
        """The variable holding the current episode ids."""
        return self._episode_ids_var

    def _keep(self, ids):
        with tf.control_dependencies([self._episode_ids_var.assign(ids)]):
            return tf.identity(ids)

    def add_batch(self, items):
        """Adds one item per episode; returns (and keeps) the updated ids."""
        return self._keep(self._replay_buffer.add_batch(items, self._episode_ids_var))

    def add_sequence(self, items):
        """Adds a sequence `[T, ...]` to the (scalar) episode; returns the updated id."""
        return self._keep(self._replay_buffer.add_sequence(items, self._episode_ids_var))

    def extend_episodes(self, episode_ids_indices, episodes):
        """Extends the episodes at `episode_ids_indices`; returns the updated ids."""
        return self._keep(self._replay_buffer.extend_episodes(
            self._episode_ids_var, episode_ids_indices, episodes))

    def _num_frames(self):
        return self._replay_buffer.num_frames()

    def _get_next(self, sample_batch_size=None, num_steps=None, time_stacked=True):
        return self._replay_buffer.get_next(sample_batch_size, num_steps, time_stacked)

    def _as_dataset(self, sample_batch_size=None, num_steps=None, sequence_preprocess_fn=None,
                    num_parallel_calls=None, single_deterministic_pass=False):
        return self._replay_buffer.as_dataset(
            sample_batch_size, num_steps, sequence_preprocess_fn=sequence_preprocess_fn,
            num_parallel_calls=num_parallel_calls,
            single_deterministic_pass=single_deterministic_pass)

    # The same read of the wrapped buffer, its single deterministic pass.
    _single_deterministic_pass_dataset = functools.partialmethod(
        _as_dataset, single_deterministic_pass=True)

    def _gather_all(self):
        return self._replay_buffer.gather_all()

    def _clear(self):
        return self._replay_buffer.clear()
