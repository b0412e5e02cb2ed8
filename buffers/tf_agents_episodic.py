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

Layout. Capacity counts episodes, as in TF-Agents: episode id `e` lives at
location `e % capacity`, and starting episode `e + capacity` evicts it. The
episodes' items (frames) share one pool of slots, `[num_slots, ...]` per data
leaf, with three per-slot int64 vectors: the episode id the frame belongs to,
its position in the episode, and the slot of the episode's next frame (-1 at
the tail). Frames of different episodes interleave in the pool in the order
they were added; a frame never moves once written. A slot is free when its
episode id is -1 or no longer the id at its location, so evicting an episode
costs nothing: its frames become free as soon as its location is reused. Per
location there are the episode id, length, completed flag and tail slot.

Memory grows with what is stored, as TF-Agents' TensorLists do (episodes have
no maximum length): an add that finds too few free slots doubles the pool
(the variables are declared with an unknown leading dimension, so they can be
reassigned larger, inside `tf.function` too). Frames never move, so a pool
that grew stays that size. Adds take the next free slots after the previous
add's (a ring), checking only those slots when they are free, so a steady
collect loop costs O(items) per add, and O(num_slots) only when the ring runs
into frames of still-stored episodes.

Sampling `num_steps` windows is uniform over all valid windows: a start frame
`t` of episode `e` with `t + num_steps <= length(e)` (and `e` completed, with
`completed_only`). TF-Agents' pipeline aims at the same ("sample uniformly
across frames") by drawing episodes in proportion to their length and a start
inside each; that over-weights windows of short episodes and can draw episodes
that hold no window, which it then filters out. Here the valid starts are one
mask over the pool and a draw is a `searchsorted` in its cumulative sum; the
window's other frames are `num_steps - 1` gathers along the next-slot links,
then one gather per data leaf. Every op has an XLA kernel.

`as_dataset` amortises the O(num_slots) mask as TF-Agents' `buffer_size`
documents: it draws the starts of `buffer_size` batches at once, so new data
may be unseen for up to `buffer_size - 1` batches. Each batch re-checks its
starts when it is delivered (episode still stored, window still inside it)
and redraws those that are not, so it never returns a stale window.

Concurrency: there is no CriticalSection (that is what keeps sampling
compilable). Adds write the frames before they publish the new lengths, so a
sampler running beside one writer sees either the old or the new episode
length; a window can only be torn if its episode is evicted and its slots are
reused between the draw and the gather of one batch.
"""

import collections

import numpy as np
import tensorflow as tf
from tensorflow.python.data.util import nest as data_nest  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.ops import list_ops  # pylint: disable=g-direct-tensorflow-import
from tf_agents.replay_buffers import replay_buffer
from tf_agents.replay_buffers.episodic_replay_buffer import BufferInfo, Episodes

__all__ = ['BufferInfo', 'EpisodicReplayBuffer', 'Episodes', 'StatefulEpisodicReplayBuffer']

_INVALID = -1
_EMPTY = 'EpisodicReplayBuffer is empty. Make sure to add items before sampling the buffer.'
# Slots allocated up front, at least: small enough to be free, large enough that
# short tests and small buffers never grow.
_MIN_SLOTS = 64

_Draw = collections.namedtuple('_Draw', ['slots', 'ids'])


def _seed(seed):
    """An explicit seed, or one drawn from TF's global RNG, so `tf.random.set_seed`
    makes sampling repeatable as it does for TF-Agents' class."""
    if seed is not None:
        return int(seed)
    with tf.init_scope():
        return int(tf.random.uniform([], 0, 2**31 - 1, dtype=tf.int64).numpy())


def _positive_int(name, value, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < 1:
        raise ValueError(f'{name} must be a positive integer, got {value!r}.')
    return int(value)


def _is_first(items):
    """TF-Agents' default `begin_episode_fn`: a Trajectory's FIRST steps."""
    try:
        return items.is_first()
    except AttributeError:
        raise TypeError('Argument t is not a Trajectory; did you forget to pass the proper '
                        f'begin_episode_fn to EpisodicReplayBuffer?  Saw: {items!r}') from None


def _is_last(items):
    """TF-Agents' default `end_episode_fn`: a Trajectory's LAST steps."""
    try:
        return items.is_last()
    except AttributeError:
        raise TypeError('Argument t is not a Trajectory; did you forget to pass the proper '
                        f'end_episode_fn to EpisodicReplayBuffer?  Saw: {items!r}') from None


class EpisodicReplayBuffer(replay_buffer.ReplayBuffer):
    """Episodes in flat variables, behind TF-Agents' `EpisodicReplayBuffer` interface.

    See the module docstring for the layout and how sampling differs (uniform
    over valid windows). Episode ids, their locations, completion, eviction
    and the private methods TF-Agents' tests call (`_get_episode_id`,
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
        capacity = _positive_int('capacity', capacity)
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
        self._buffer_size = _positive_int('buffer_size', buffer_size)
        self._name_prefix = name_prefix
        self._device = device
        self._dataset_drop_remainder = bool(dataset_drop_remainder)
        self._dataset_window_shift = _positive_int('dataset_window_shift',
                                                   dataset_window_shift, allow_none=True)
        self._flat_spec = tf.nest.flatten(data_spec)
        slots = max(_MIN_SLOTS, capacity)

        def per_slot(name, value):
            # Unknown leading dimension: `_grow` reassigns it larger.
            return tf.Variable(tf.fill([slots], tf.constant(value, tf.int64)),
                               shape=tf.TensorShape([None]), trainable=False,
                               name=f'{name_prefix}_{name}')

        def per_episode(name, dtype, value):
            return tf.Variable(tf.fill([capacity], tf.constant(value, dtype)),
                               trainable=False, name=f'{name_prefix}_{name}')

        with tf.device(device):
            # The pool: one variable per data leaf, and the three per-slot vectors.
            self._frames = [
                tf.Variable(tf.zeros([slots, *spec.shape], spec.dtype),
                            shape=tf.TensorShape([None, *spec.shape]), trainable=False,
                            name=f'{name_prefix}_frames_{i}')
                for i, spec in enumerate(self._flat_spec)]
            self._frame_episode = per_slot('frame_episode', _INVALID)
            self._frame_position = per_slot('frame_position', 0)
            self._frame_next = per_slot('frame_next', _INVALID)
            # Per location (TF-Agents' names, same meanings: its tests read two of them).
            self._episodes_loc_to_id_map = per_episode('episodes_loc_to_id_map', tf.int64,
                                                       _INVALID)
            self._episode_lengths = per_episode('episode_lengths', tf.int64, 0)
            self._episode_completed = per_episode('episode_completed', tf.uint8, 0)
            self._episode_tail = per_episode('episode_tail', tf.int64, _INVALID)
            self._last_episode = tf.Variable(tf.constant(_INVALID, tf.int64), trainable=False,
                                             name=f'{name_prefix}_last_episode')
            self._num_writes = tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                           name=f'{name_prefix}_num_writes_counter')
            # Where the next add starts looking for free slots.
            self._cursor = tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                       name=f'{name_prefix}_cursor')
            self._rng = tf.random.Generator.from_seed(_seed(seed))
        # The write paths as graphs: run op by op (eagerly) an add costs ~100 ops' dispatch
        # (~5 ms). Their arguments are plain tensors (the user's begin/end functions run
        # outside, on every call), so one trace serves every call.
        flat_frames = [tf.TensorSpec([None, *spec.shape], spec.dtype)
                       for spec in self._flat_spec]
        vector = lambda dtype: tf.TensorSpec([None], dtype)  # noqa: E731
        self._append = tf.function(self._append_frames, input_signature=[
            vector(tf.int64), vector(tf.int64), flat_frames])
        self._write = tf.function(self._write_frames, input_signature=[
            vector(tf.int64), vector(tf.bool), vector(tf.bool), vector(tf.int64),
            tf.TensorSpec([], tf.int64), flat_frames])

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
            return tf.fill([num_episodes], tf.constant(_INVALID, tf.int64), name='episode_id')
        shape = ()
        if num_episodes is not None and num_episodes > 0:
            if num_episodes > self._capacity:
                raise ValueError(f'Buffer cannot create episode_ids when num_episodes '
                                 f'{num_episodes} > capacity {self._capacity}.')
            shape = (num_episodes,)
        return tf.constant(_INVALID, tf.int64, shape=shape, name='episode_id')

    def _location(self, episode_ids):
        return tf.math.floormod(episode_ids, self._capacity)

    def _alive(self, episode_ids):
        """Whether each id is a stored episode: valid and still the id at its location."""
        stored = tf.gather(self._episodes_loc_to_id_map, self._location(episode_ids))
        return (episode_ids >= 0) & tf.equal(stored, episode_ids)

    def get_valid_ids_mask(self, episode_ids):
        """Whether each of `episode_ids` is a stored episode."""
        return self._alive(tf.convert_to_tensor(episode_ids, tf.int64))

    def _get_last_episode_id(self):
        return self._last_episode.read_value()

    def _get_batch_episode_ids(self, batch_episode_ids, begin_episode=False, end_episode=False,
                               mask=None):
        """Gives a new id to each entry that is -1 or begins an episode; ends those that end.

        New ids are consecutive, in batch order. Starting an episode claims its
        location: the episode there before is evicted (its frames become free)
        and the location's length, completion and tail are reset.

        Args:
          batch_episode_ids: int64 `[n]`.
          begin_episode: bool, scalar or `[n]`: start a new episode.
          end_episode: bool, scalar or `[n]`: mark the (new) episode completed.
          mask: optional bool `[n]`: only these entries may change.

        Returns:
          The updated int64 `[n]` ids.
        """
        ids = tf.convert_to_tensor(batch_episode_ids, tf.int64)
        if ids.shape.rank != 1:
            raise ValueError('batch_episode_ids must be a vector with 1 dimension')
        begin = tf.broadcast_to(tf.convert_to_tensor(begin_episode, tf.bool), tf.shape(ids))
        renew = (ids < 0) | begin
        if mask is not None:
            renew &= tf.convert_to_tensor(mask, tf.bool)
        rank = tf.cumsum(tf.cast(renew, tf.int64))
        first = self._last_episode.read_value() + 1
        ids = tf.where(renew, first + rank - 1, ids)
        new_ids = tf.boolean_mask(ids, renew)
        locations = self._location(new_ids)
        with tf.control_dependencies([
                self._last_episode.assign_add(tf.size(new_ids, out_type=tf.int64)),
                self._episodes_loc_to_id_map.scatter_update(
                    tf.IndexedSlices(new_ids, locations)),
                self._episode_lengths.scatter_update(
                    tf.IndexedSlices(tf.zeros_like(new_ids), locations)),
                self._episode_completed.scatter_update(
                    tf.IndexedSlices(tf.zeros_like(new_ids, tf.uint8), locations)),
                self._episode_tail.scatter_update(
                    tf.IndexedSlices(tf.fill(tf.shape(new_ids), tf.constant(_INVALID, tf.int64)),
                                     locations))]):
            ids = tf.identity(ids)
        with tf.control_dependencies([self._maybe_end_batch_episodes(ids, end_episode)]):
            return tf.identity(ids)

    def _maybe_end_batch_episodes(self, batch_episode_ids, end_episode=False):
        """Marks the stored episodes among `batch_episode_ids` completed where `end_episode`.

        Returns:
          bool `[n]`: whether each id is a stored, completed episode.
        """
        ids = tf.convert_to_tensor(batch_episode_ids, tf.int64)
        end = tf.broadcast_to(tf.convert_to_tensor(end_episode, tf.bool), tf.shape(ids))
        alive = self._alive(ids)
        ending = self._location(tf.boolean_mask(ids, end & alive))
        with tf.control_dependencies([self._episode_completed.scatter_update(
                tf.IndexedSlices(tf.ones_like(ending, tf.uint8), ending))]):
            completed = tf.gather(self._episode_completed, self._location(ids)) > 0
        return alive & completed

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

    def _id_range(self):
        """`[lo, hi)`: the ids of the stored episodes (the last `capacity` handed out)."""
        hi = self._last_episode.read_value() + 1
        return tf.maximum(hi - self._capacity, 0), hi

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

    def _write_frames(self, episode_ids, begin, end, counts, writes, frames):
        """The write path of `add_batch` and `add_sequence`, as one graph.

        Renews and ends ids, then appends `counts[i]` of the `frames` (back to
        back) to entry i's episode if it is stored; frames of others are dropped.
        """
        ids = self._get_batch_episode_ids(episode_ids, begin, end)
        alive = self._alive(ids)
        keep = tf.repeat(alive, counts)
        frames = [tf.boolean_mask(x, keep) for x in frames]
        total = self._append_frames(self._location(ids), tf.where(alive, counts, 0), frames)
        with tf.control_dependencies([total]):
            count = self._num_writes.assign_add(writes * tf.cast(tf.reduce_any(alive), tf.int64))
        with tf.control_dependencies([count]):
            return tf.identity(ids)

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

    def _append_frames(self, locations, counts, frames):
        """Appends `counts[i]` frames to the episode at `locations[i]`, for every i.

        `frames` (flat list of data leaves) holds the segments back to back,
        `[sum(counts), ...]`. Frames and their links are written before the
        episodes' tails and lengths move, so a reader never sees a length that
        covers unwritten frames.
        """
        counts = tf.cast(counts, tf.int64)
        total = tf.reduce_sum(counts)
        slots = self._allocate(total)
        segment = tf.repeat(tf.range(tf.size(counts, out_type=tf.int64)), counts)
        starts = tf.cumsum(counts, exclusive=True)
        offset = tf.range(total) - tf.gather(starts, segment)
        frame_location = tf.gather(locations, segment)
        position = tf.gather(self._episode_lengths, frame_location) + offset
        is_tail = tf.equal(offset, tf.gather(counts, segment) - 1)
        following = tf.concat([slots[1:], tf.constant([_INVALID], tf.int64)], 0)
        writes = [var.scatter_update(tf.IndexedSlices(value, slots))
                  for var, value in zip(self._frames, frames)]
        writes += [
            self._frame_episode.scatter_update(tf.IndexedSlices(
                tf.gather(self._episodes_loc_to_id_map, frame_location), slots)),
            self._frame_position.scatter_update(tf.IndexedSlices(position, slots)),
            self._frame_next.scatter_update(tf.IndexedSlices(
                tf.where(is_tail, tf.constant(_INVALID, tf.int64), following), slots)),
        ]
        # Link each extended episode's old tail to its first new frame.
        extended = counts > 0
        heads = tf.gather(slots, tf.boolean_mask(starts, extended))
        tails = tf.gather(slots, tf.boolean_mask(starts + counts - 1, extended))
        extended_locations = tf.boolean_mask(locations, extended)
        old_tails = tf.gather(self._episode_tail, extended_locations)
        linked = old_tails >= 0
        with tf.control_dependencies(writes):
            link = self._frame_next.scatter_update(tf.IndexedSlices(
                tf.boolean_mask(heads, linked), tf.boolean_mask(old_tails, linked)))
        with tf.control_dependencies([link]):
            publish = [
                self._episode_tail.scatter_update(tf.IndexedSlices(tails, extended_locations)),
                self._episode_lengths.scatter_add(tf.IndexedSlices(counts, locations)),
            ]
        with tf.control_dependencies(publish):
            return tf.identity(total)

    def _free(self, slots):
        """Whether each slot holds no frame of a stored episode."""
        episode = tf.gather(self._frame_episode, slots)
        return (episode < 0) | tf.not_equal(
            tf.gather(self._episodes_loc_to_id_map, self._location(episode)), episode)

    def _allocate(self, count):
        """`count` free slots, the first ones at or after the cursor (a ring), growing the
        pool when fewer are free. Checks only those slots when they are free (the usual
        case); scans the pool otherwise."""
        count = tf.cast(count, tf.int64)
        num_slots = tf.shape(self._frame_episode, out_type=tf.int64)[0]
        cursor = tf.math.floormod(self._cursor.read_value(), num_slots)
        ahead = tf.range(cursor, tf.minimum(cursor + count, num_slots))
        in_order = (cursor + count <= num_slots) & tf.reduce_all(self._free(ahead))

        def scan():
            with tf.control_dependencies([self._grow(count - tf.reduce_sum(
                    tf.cast(self._free(tf.range(num_slots)), tf.int64)))]):
                size = tf.shape(self._frame_episode, out_type=tf.int64)[0]
                every = tf.range(size)
            distance = tf.math.floormod(every - cursor, size)
            key = tf.where(self._free(every), distance, size + distance)
            _, chosen = tf.math.top_k(-key, k=tf.cast(count, tf.int32))
            return tf.cast(chosen, tf.int64)

        slots = tf.cond(in_order, lambda: ahead, scan)
        last = tf.concat([[cursor - 1], slots], 0)[-1]
        with tf.control_dependencies([self._cursor.assign(last + 1)]):
            return tf.identity(slots)

    def _grow(self, missing):
        """Enlarges the pool (at least doubling it) when `missing` > 0 slots are lacking.

        New slots go at the end, so no frame moves and every slot index held
        elsewhere stays valid.
        """
        def grow():
            size = tf.shape(self._frame_episode, out_type=tf.int64)[0]
            extra = tf.maximum(size, missing)
            grown = [var.assign(tf.concat([var, tf.zeros([extra, *spec.shape], spec.dtype)], 0))
                     for var, spec in zip(self._frames, self._flat_spec)]
            for var, value in ((self._frame_episode, _INVALID), (self._frame_position, 0),
                               (self._frame_next, _INVALID)):
                grown.append(var.assign(tf.concat(
                    [var, tf.fill([extra], tf.constant(value, tf.int64))], 0)))
            return tf.group(grown)

        return tf.cond(missing > 0, grow, tf.no_op)

    # ------------------------------------------------------------------ reading

    def _episode_values(self, episode_id):
        """The frames of `episode_id` in order, a nest `[length, ...]` (no validity check)."""
        episode_id = tf.convert_to_tensor(episode_id, tf.int64)
        mine = tf.equal(self._frame_episode, episode_id) & (episode_id >= 0)
        slots = tf.where(mine)[:, 0]
        slots = tf.gather(slots, tf.argsort(tf.gather(self._frame_position, slots)))
        return self._pack([tf.gather(var, slots) for var in self._frames])

    def _pack(self, flat):
        return tf.nest.pack_sequence_as(self._data_spec, flat)

    def _get_episode(self, episode_id):
        """The items of stored episode `episode_id`, a nest `[length, ...]`.

        Raises:
          InvalidArgumentError: (at run time) if the episode is not stored.
        """
        with tf.device(self._device), tf.name_scope('get_episode'):
            episode_id = tf.convert_to_tensor(episode_id, tf.int64)
            location = self._location(episode_id)
            stored = self._episodes_loc_to_id_map[location]
            check = tf.debugging.Assert(tf.equal(stored, episode_id), [
                'Episode id', episode_id, 'is not valid.  It points to location', location,
                'but the episode at that location is currently id', stored])
            with tf.control_dependencies([check]):
                return self._episode_values(episode_id)

    def _assert_not_empty(self):
        return tf.debugging.assert_non_negative(self._last_episode.read_value(),
                                                message=_EMPTY)

    def _uniform_index(self, mask, count, message):
        """`count` indices drawn uniformly among the True entries of `mask` (int64), and
        their number; fails with `message` when there are none.

        A `searchsorted` in the mask's cumulative sum: O(len(mask)) once for all
        `count` draws, and every op compiles with XLA.
        """
        cumulative = tf.cumsum(tf.cast(mask, tf.int64))
        total = cumulative[-1]
        with tf.control_dependencies([self._assert_not_empty(),
                                      tf.debugging.assert_positive(total, message=message)]):
            target = self._rng.uniform([count], 0, tf.maximum(total, 1), dtype=tf.int64)
        return tf.searchsorted(cumulative, target, side='right', out_type=tf.int64), total

    def _window_starts_mask(self, num_steps):
        """bool `[num_slots]`: the slots that start a valid `num_steps` window."""
        episode = self._frame_episode.read_value()
        location = self._location(episode)
        stored = (episode >= 0) & tf.equal(tf.gather(self._episodes_loc_to_id_map, location),
                                           episode)
        fits = self._frame_position + num_steps <= tf.gather(self._episode_lengths, location)
        valid = stored & fits
        if self._completed_only:
            valid &= tf.gather(self._episode_completed, location) > 0
        return valid

    def _no_window_message(self, num_steps):
        kind = 'completed episode' if self._completed_only else 'episode'
        return (f'EpisodicReplayBuffer holds no {kind} of at least num_steps={num_steps} '
                'items, so no window can be sampled yet: add longer episodes or sample fewer '
                'steps.')

    def _draw_windows(self, count, num_steps):
        """`count` window starts drawn uniformly over the valid `num_steps` windows."""
        slots, _ = self._uniform_index(self._window_starts_mask(num_steps), count,
                                       self._no_window_message(num_steps))
        return _Draw(slots, tf.gather(self._frame_episode, slots))

    def _still_valid(self, draw, num_steps):
        """Whether drawn windows are still valid windows of the same episodes."""
        location = self._location(draw.ids)
        valid = self._alive(draw.ids) & tf.equal(tf.gather(self._frame_episode, draw.slots),
                                                 draw.ids)
        valid &= (tf.gather(self._frame_position, draw.slots) + num_steps
                  <= tf.gather(self._episode_lengths, location))
        if self._completed_only:
            valid &= tf.gather(self._episode_completed, location) > 0
        return valid

    def _windows(self, draw, num_steps):
        """The windows starting at `draw.slots`: a nest `[count, num_steps, ...]` and
        `BufferInfo(ids=[count])`."""
        slot = draw.slots
        slots = [slot]
        for _ in range(num_steps - 1):
            slot = tf.gather(self._frame_next, slot)
            slots.append(slot)
        flat_slots = tf.reshape(tf.stack(slots, axis=1), [-1])
        flat = [tf.reshape(tf.gather(var, flat_slots), [-1, num_steps, *spec.shape])
                for var, spec in zip(self._frames, self._flat_spec)]
        return self._pack(flat), BufferInfo(ids=draw.ids)

    def _sample_windows(self, batch_size, num_steps):
        """`batch_size` windows drawn afresh (what `get_next` returns); XLA-compilable."""
        return self._windows(self._draw_windows(batch_size, num_steps), num_steps)

    def _deliver(self, draw, num_steps):
        """Windows of an earlier draw, redrawing those no longer valid."""
        valid = self._still_valid(draw, num_steps)

        def redraw():
            fresh = self._draw_windows(tf.size(draw.slots), num_steps)
            return _Draw(tf.where(valid, draw.slots, fresh.slots),
                         tf.where(valid, draw.ids, fresh.ids))

        draw = tf.cond(tf.reduce_all(valid), lambda: draw, redraw)
        return self._windows(draw, num_steps)

    def _sample_episode(self):
        """One stored episode drawn uniformly (completed ones only, with `completed_only`)."""
        ids = self._episodes_loc_to_id_map.read_value()
        mask = ids >= 0
        if self._completed_only:
            mask &= tf.equal(self._episode_completed, 1)
        location, _ = self._uniform_index(
            mask, 1, 'EpisodicReplayBuffer holds no completed episode (completed_only=True).')
        episode_id = tf.gather(ids, location[0])
        return self._episode_values(episode_id), BufferInfo(ids=episode_id)

    @staticmethod
    def _check_steps(sample_batch_size, num_steps):
        if sample_batch_size is not None and num_steps is None:
            raise ValueError('`num_steps` must be set if `sample_batch_size` is set in '
                             'EpisodicReplayBuffer: whole episodes differ in length and cannot '
                             'be batched.')
        return (_positive_int('sample_batch_size', sample_batch_size, allow_none=True),
                _positive_int('num_steps', num_steps, allow_none=True))

    def _get_next(self, sample_batch_size=None, num_steps=None, time_stacked=True):
        """One whole episode drawn uniformly (no arguments), or `num_steps` windows:
        `[num_steps, ...]`, or `[sample_batch_size, num_steps, ...]`.

        TF-Agents' class ignores all three arguments; here the ones it can honour are
        honoured and `time_stacked=False` is refused rather than ignored.
        """
        if not time_stacked:
            raise NotImplementedError('EpisodicReplayBuffer.get_next: time_stacked=False is not '
                                      'supported; windows come time-stacked.')
        sample_batch_size, num_steps = self._check_steps(sample_batch_size, num_steps)
        with tf.device(self._device), tf.name_scope('get_next'):
            if num_steps is None:
                return self._sample_episode()
            data, info = self._sample_windows(sample_batch_size or 1, num_steps)
            if sample_batch_size is None:
                return tf.nest.map_structure(lambda x: x[0], (data, info))
            return data, info

    def _check_dataset_args(self, sequence_preprocess_fn):
        if sequence_preprocess_fn is not None:
            raise NotImplementedError('sequence_preprocess_fn is not supported.')
        if tf.nest.flatten(self._data_spec) != data_nest.flatten(self._data_spec):
            raise ValueError('Cannot perform gather; data spec contains lists: convert any '
                             'lists to tuples, e.g. [a, b, c] to (a, b, c).')

    def _as_dataset(self, sample_batch_size=None, num_steps=None, sequence_preprocess_fn=None,
                    num_parallel_calls=None):
        """An endless dataset of whole episodes (`num_steps=None`) or of windows.

        Whole episodes: one `([length, ...], BufferInfo(ids=scalar))` per element,
        drawn uniformly among the stored (with `completed_only`, completed)
        episodes. Windows: `([num_steps, ...], ids)` per element, or batches
        `([sample_batch_size, num_steps, ...], ids [sample_batch_size])`, uniform
        over valid windows; `buffer_size` batches are drawn at once and
        re-checked on delivery (module docstring).

        Raises:
          ValueError: `sample_batch_size` without `num_steps`, or a spec with lists.
          NotImplementedError: a `sequence_preprocess_fn`.
        """
        self._check_dataset_args(sequence_preprocess_fn)
        sample_batch_size, num_steps = self._check_steps(sample_batch_size, num_steps)
        calls = num_parallel_calls
        if num_steps is None:
            return tf.data.Dataset.from_tensors(0).repeat().map(
                lambda _: self._sample_episode(), num_parallel_calls=calls)
        batch = sample_batch_size or 1
        block = self._buffer_size

        def draw(_):
            drawn = self._draw_windows(block * batch, num_steps)
            return tuple(tf.reshape(x, [block, batch]) for x in drawn)

        ds = tf.data.Dataset.from_tensors(0).repeat().map(draw).unbatch()
        ds = ds.map(lambda slots, ids: self._deliver(_Draw(slots, ids), num_steps),
                    num_parallel_calls=calls)
        if sample_batch_size is None:
            ds = ds.map(lambda data, info: tf.nest.map_structure(lambda x: x[0], (data, info)))
        return ds

    def _single_deterministic_pass_dataset(self, sample_batch_size=None, num_steps=None,
                                           sequence_preprocess_fn=None,
                                           num_parallel_calls=None):
        """Every stored episode once, in id order, as TF-Agents defines the pass.

        `num_steps=None`: one whole episode per element. `num_steps` set: the
        episodes' items run together and cut into windows of `num_steps`
        shifted by `dataset_window_shift` (windows here may cross episodes, as
        TF-Agents' do). With `sample_batch_size`, the episodes are dealt round
        robin to `sample_batch_size` streams, each cut into whole windows, and
        the batch takes one window from each stream in turn.
        """
        self._check_dataset_args(sequence_preprocess_fn)
        sample_batch_size, num_steps = self._check_steps(sample_batch_size, num_steps)
        shift = self._dataset_window_shift
        drop = self._dataset_drop_remainder

        def episode_ids(_):
            lo, hi = self._id_range()
            return tf.data.Dataset.range(lo, hi)

        # The range is read when iteration starts, not when the dataset is built.
        episodes = tf.data.Dataset.range(1).flat_map(episode_ids).map(
            self._episode_values, num_parallel_calls=num_parallel_calls)
        if num_steps is None:
            return episodes

        def windows(ds, drop_short):
            def stack(window):
                return tf.data.Dataset.zip(tf.nest.map_structure(
                    lambda d: d.batch(num_steps, drop_remainder=drop_short), window))
            return ds.unbatch().window(num_steps, shift=shift).flat_map(stack)

        if sample_batch_size is None:
            return windows(episodes, drop)
        streams = tf.data.Dataset.range(sample_batch_size).interleave(
            lambda i: windows(episodes.shard(sample_batch_size, i), True),
            cycle_length=sample_batch_size, block_length=1)
        return streams.batch(sample_batch_size, drop_remainder=drop)

    def gather_all(self):
        """Every stored item (with `completed_only`, of completed episodes), by episode id
        then position: `[1, total, ...]`, or `[0, ...]` when there is none (as TF-Agents)."""
        return self._gather_all()

    def _gather_all(self):
        self._check_dataset_args(None)
        episode = self._frame_episode.read_value()
        location = self._location(episode)
        stored = (episode >= 0) & tf.equal(tf.gather(self._episodes_loc_to_id_map, location),
                                           episode)
        if self._completed_only:
            stored &= tf.gather(self._episode_completed, location) > 0
        slots = tf.where(stored)[:, 0]
        slots = tf.gather(slots, tf.argsort(tf.gather(self._frame_position, slots)))
        slots = tf.gather(slots, tf.argsort(tf.gather(episode, slots), stable=True))

        def everything():
            return self._pack([tf.gather(var, slots)[None] for var in self._frames])

        def nothing():
            return self._pack([tf.zeros([0, *spec.shape], spec.dtype)
                               for spec in self._flat_spec])

        return tf.cond(tf.size(slots) > 0, everything, nothing)

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

    def _clear_locations(self, locations):
        """Frees the frames of the episodes at `locations` and zeroes their lengths and flags."""
        episode = self._frame_episode.read_value()
        mine = tf.reduce_any(tf.equal(self._location(episode)[:, None], locations[None, :]),
                             axis=1) & (episode >= 0)
        return tf.group(
            self._frame_episode.assign(tf.where(mine, tf.constant(_INVALID, tf.int64), episode)),
            self._episode_lengths.scatter_update(
                tf.IndexedSlices(tf.zeros_like(locations), locations)),
            self._episode_completed.scatter_update(
                tf.IndexedSlices(tf.zeros_like(locations, tf.uint8), locations)),
            self._episode_tail.scatter_update(
                tf.IndexedSlices(tf.fill(tf.shape(locations), tf.constant(_INVALID, tf.int64)),
                                 locations)))

    def _clear(self, clear_all_variables=False):
        """Empties the buffer. By default the episode ids stay stored (length 0), so
        writers holding them carry on; `clear_all_variables` forgets them too."""
        ops = [self._frame_episode.assign(tf.fill(tf.shape(self._frame_episode),
                                                  tf.constant(_INVALID, tf.int64))),
               self._episode_lengths.assign(tf.zeros_like(self._episode_lengths)),
               self._episode_tail.assign(tf.fill([self._capacity],
                                                 tf.constant(_INVALID, tf.int64))),
               self._num_writes.assign(0),
               self._cursor.assign(0)]
        if clear_all_variables:
            ops += [self._episode_completed.assign(tf.zeros_like(self._episode_completed)),
                    self._episodes_loc_to_id_map.assign(tf.fill([self._capacity],
                                                                tf.constant(_INVALID,
                                                                            tf.int64))),
                    self._last_episode.assign(_INVALID)]
        return tf.group(ops, name='clear')

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
                    num_parallel_calls=None):
        return self._replay_buffer.as_dataset(
            sample_batch_size, num_steps, sequence_preprocess_fn=sequence_preprocess_fn,
            num_parallel_calls=num_parallel_calls)

    def _single_deterministic_pass_dataset(self, sample_batch_size=None, num_steps=None,
                                           sequence_preprocess_fn=None,
                                           num_parallel_calls=None):
        return self._replay_buffer.as_dataset(
            sample_batch_size, num_steps, sequence_preprocess_fn=sequence_preprocess_fn,
            num_parallel_calls=num_parallel_calls, single_deterministic_pass=True)

    def _gather_all(self):
        return self._replay_buffer.gather_all()

    def _clear(self):
        return self._replay_buffer.clear()
