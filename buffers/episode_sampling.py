"""Reads of buffers/tf_agents_episodic.py: uniform windows and episodes, datasets, `gather_all`.

Sampling `num_steps` windows is uniform over all valid windows: a start frame
`t` of episode `e` with `t + num_steps <= length(e)` (and `e` completed, with
`completed_only`). TF-Agents' pipeline aims at the same ("sample uniformly
across frames") by drawing episodes in proportion to their length and a start
inside each; that over-weights windows of short episodes and can draw episodes
that hold no window, which it then filters out. Here the valid starts are one
mask over the pool (buffers/episode_pool.py) and a draw is a `searchsorted` in
its cumulative sum; the window's other frames are `num_steps - 1` gathers along
the next-slot links, then one gather per data leaf. Every op has an XLA kernel.

`as_dataset` amortises the O(num_slots) mask as TF-Agents' `buffer_size`
documents: it draws the starts of `buffer_size` batches at once, so new data
may be unseen for up to `buffer_size - 1` batches. Each batch re-checks its
starts when it is delivered (episode still stored, window still inside it)
and redraws those that are not, so it never returns a stale window.

Concurrency: there is no CriticalSection (that is what keeps sampling
compilable). Adds publish lengths after writing frames, so a sampler running
beside one writer sees either the old or the new episode length; a window can
only be torn if its episode is evicted and its slots are reused between the
draw and the gather of one batch.
"""

import collections

import numpy as np
import tensorflow as tf
from tensorflow.python.data.util import nest as data_nest  # pylint: disable=g-direct-tensorflow-import
from tf_agents.replay_buffers.episodic_replay_buffer import BufferInfo

from buffers.episode_pool import EpisodePool

_EMPTY = 'EpisodicReplayBuffer is empty. Make sure to add items before sampling the buffer.'

_Draw = collections.namedtuple('_Draw', ['slots', 'ids'])


def positive_int(name, value, allow_none=False):
    """`value` as an int, refusing anything but a positive integer (or None if allowed)."""
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < 1:
        raise ValueError(f'{name} must be a positive integer, got {value!r}.')
    return int(value)


def seed_from_global_rng(seed):
    """An explicit seed, or one drawn from TF's global RNG, so `tf.random.set_seed`
    makes sampling repeatable as it does for TF-Agents' classes (every buffer of
    buffers/tf_agents_api.py seeds this way)."""
    if seed is not None:
        return int(seed)
    with tf.init_scope():
        return int(tf.random.uniform([], 0, 2**31 - 1, dtype=tf.int64).numpy())


def _first_of_batch(data, info):
    """Drops the batch dimension of one drawn window or batch of one."""
    return tf.nest.map_structure(lambda x: x[0], (data, info))


class EpisodeSampling(EpisodePool):
    """TF-Agents' `ReplayBuffer` reads (`_get_next`, `_as_dataset`, the single
    deterministic pass, `gather_all`, and `_get_episode`, which TF-Agents' tests
    call) over an `EpisodePool`.

    A mixin, like `EpisodePool`: the host sets `_completed_only`, `_buffer_size`,
    `_dataset_drop_remainder`, `_dataset_window_shift` and `_device`, and calls
    `_create_rng` after `_create_pool`.
    """

    def _create_rng(self, seed, device):
        with tf.device(device):
            self._rng = tf.random.Generator.from_seed(seed_from_global_rng(seed))

    # ------------------------------------------------------------------ drawing

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

    def _sampleable(self, episode_ids):
        """Whether each id is a stored episode that may be read (completed, with
        `completed_only`)."""
        keep = self._alive(episode_ids)
        if self._completed_only:
            keep &= tf.gather(self._episode_completed, self._location(episode_ids)) > 0
        return keep

    def _window_fits(self, positions, episode_ids, num_steps):
        """Whether `num_steps` frames from each position stay inside its episode."""
        lengths = tf.gather(self._episode_lengths, self._location(episode_ids))
        return positions + num_steps <= lengths

    def _window_starts_mask(self, num_steps):
        """bool `[num_slots]`: the slots that start a valid `num_steps` window."""
        episode = self._frame_episode.read_value()
        return self._sampleable(episode) & self._window_fits(self._frame_position, episode,
                                                             num_steps)

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
        same = tf.equal(tf.gather(self._frame_episode, draw.slots), draw.ids)
        return self._sampleable(draw.ids) & same & self._window_fits(
            tf.gather(self._frame_position, draw.slots), draw.ids, num_steps)

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

    # ------------------------------------------------------------------ ReplayBuffer reads

    @staticmethod
    def _check_steps(sample_batch_size, num_steps):
        if sample_batch_size is not None and num_steps is None:
            raise ValueError('`num_steps` must be set if `sample_batch_size` is set in '
                             'EpisodicReplayBuffer: whole episodes differ in length and cannot '
                             'be batched.')
        return (positive_int('sample_batch_size', sample_batch_size, allow_none=True),
                positive_int('num_steps', num_steps, allow_none=True))

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
                return _first_of_batch(data, info)
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
            ds = ds.map(_first_of_batch)
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

    def gather_all(self):
        """Every stored item (with `completed_only`, of completed episodes), by episode id
        then position: `[1, total, ...]`, or `[0, ...]` when there is none (as TF-Agents)."""
        return self._gather_all()

    def _gather_all(self):
        """Every stored item (with `completed_only`, of completed episodes), by episode id
        then position: `[1, total, ...]`, or `[0, ...]` when there is none (as TF-Agents)."""
        self._check_dataset_args(None)
        episode = self._frame_episode.read_value()
        slots = self._slots_by_position(self._sampleable(episode))
        slots = tf.gather(slots, tf.argsort(tf.gather(episode, slots), stable=True))

        def everything():
            return self._pack([tf.gather(var, slots)[None] for var in self._frames])

        def nothing():
            return self._pack([tf.zeros([0, *spec.shape], spec.dtype)
                               for spec in self._flat_spec])

        return tf.cond(tf.size(slots) > 0, everything, nothing)
