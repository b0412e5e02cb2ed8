"""Storage of buffers/tf_agents_episodic.py: episodes' frames in one pool of flat variables.

Why a pool of slots rather than TF-Agents' one TensorList per episode (in a
variant variable, behind a CriticalSection): flat variables are read by plain
gathers, which compile with XLA, and an add is a fixed graph of scatters.

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

Adds write the frames before they publish the new lengths, so a reader running
beside one writer sees either the old or the new episode length.

`EpisodePool` is a mixin of the buffer class rather than an object it holds, so
the variables stay attributes of the buffer itself: TF-Agents' tests read some
of them (`_episode_lengths`, `_last_episode`), and a checkpoint of the buffer
keeps the keys it had.
"""

import tensorflow as tf

INVALID_ID = -1
# Slots allocated up front, at least: small enough to be free, large enough that
# short tests and small buffers never grow.
_MIN_SLOTS = 64


def invalid_ids(shape, name=None):
    """int64 -1s (no episode, no slot) of `shape`."""
    return tf.fill(shape, tf.constant(INVALID_ID, tf.int64), name=name)


class EpisodePool:
    """The episodes' variables and the ops that write them (module docstring).

    A mixin for a `tf.Module` that has set `_data_spec` and `_capacity` (as
    TF-Agents' `ReplayBuffer.__init__` does) and calls `_create_pool` once.
    `_get_batch_episode_ids` and `_maybe_end_batch_episodes` keep the names and
    meanings of TF-Agents' `EpisodicReplayBuffer` methods, which its tests call.
    """

    def _create_pool(self, name_prefix, device):
        """Creates the variables on `device`, and the two write paths as graphs."""
        capacity = self._capacity
        self._flat_spec = tf.nest.flatten(self._data_spec)
        slots = max(_MIN_SLOTS, capacity)

        def per_slot(name, value):
            # Unknown leading dimension: `_grow` reassigns it larger.
            return tf.Variable(tf.fill([slots], tf.constant(value, tf.int64)),
                               shape=tf.TensorShape([None]), trainable=False,
                               name=f'{name_prefix}_{name}')

        def per_episode(name, dtype, value):
            return tf.Variable(tf.fill([capacity], tf.constant(value, dtype)),
                               trainable=False, name=f'{name_prefix}_{name}')

        def counter(name, value):
            return tf.Variable(tf.constant(value, tf.int64), trainable=False,
                               name=f'{name_prefix}_{name}')

        with tf.device(device):
            # The pool: one variable per data leaf, and the three per-slot vectors.
            self._frames = [
                tf.Variable(tf.zeros([slots, *spec.shape], spec.dtype),
                            shape=tf.TensorShape([None, *spec.shape]), trainable=False,
                            name=f'{name_prefix}_frames_{i}')
                for i, spec in enumerate(self._flat_spec)]
            self._frame_episode = per_slot('frame_episode', INVALID_ID)
            self._frame_position = per_slot('frame_position', 0)
            self._frame_next = per_slot('frame_next', INVALID_ID)
            # Per location (TF-Agents' names, same meanings: its tests read two of them).
            self._episodes_loc_to_id_map = per_episode('episodes_loc_to_id_map', tf.int64,
                                                       INVALID_ID)
            self._episode_lengths = per_episode('episode_lengths', tf.int64, 0)
            self._episode_completed = per_episode('episode_completed', tf.uint8, 0)
            self._episode_tail = per_episode('episode_tail', tf.int64, INVALID_ID)
            self._last_episode = counter('last_episode', INVALID_ID)
            self._num_writes = counter('num_writes_counter', 0)
            # Where the next add starts looking for free slots.
            self._cursor = counter('cursor', 0)
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

    # ------------------------------------------------------------------ episode ids

    def _location(self, episode_ids):
        return tf.math.floormod(episode_ids, self._capacity)

    def _alive(self, episode_ids):
        """Whether each id is a stored episode: valid and still the id at its location."""
        stored = tf.gather(self._episodes_loc_to_id_map, self._location(episode_ids))
        return (episode_ids >= 0) & tf.equal(stored, episode_ids)

    def _id_range(self):
        """`[lo, hi)`: the ids of the stored episodes (the last `capacity` handed out)."""
        hi = self._last_episode.read_value() + 1
        return tf.maximum(hi - self._capacity, 0), hi

    def _reset_locations(self, locations):
        """The ops that empty `locations`: length 0, not completed, no tail."""
        return [
            self._episode_lengths.scatter_update(
                tf.IndexedSlices(tf.zeros_like(locations), locations)),
            self._episode_completed.scatter_update(
                tf.IndexedSlices(tf.zeros_like(locations, tf.uint8), locations)),
            self._episode_tail.scatter_update(
                tf.IndexedSlices(invalid_ids(tf.shape(locations)), locations))]

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
                *self._reset_locations(locations)]):
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

    # ------------------------------------------------------------------ writing

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
        following = tf.concat([slots[1:], tf.constant([INVALID_ID], tf.int64)], 0)
        writes = [var.scatter_update(tf.IndexedSlices(value, slots))
                  for var, value in zip(self._frames, frames)]
        writes += [
            self._frame_episode.scatter_update(tf.IndexedSlices(
                tf.gather(self._episodes_loc_to_id_map, frame_location), slots)),
            self._frame_position.scatter_update(tf.IndexedSlices(position, slots)),
            self._frame_next.scatter_update(tf.IndexedSlices(
                tf.where(is_tail, tf.constant(INVALID_ID, tf.int64), following), slots)),
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
        return ~self._alive(tf.gather(self._frame_episode, slots))

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
            for var, value in ((self._frame_episode, INVALID_ID), (self._frame_position, 0),
                               (self._frame_next, INVALID_ID)):
                grown.append(var.assign(tf.concat(
                    [var, tf.fill([extra], tf.constant(value, tf.int64))], 0)))
            return tf.group(grown)

        return tf.cond(missing > 0, grow, tf.no_op)

    # ------------------------------------------------------------------ reading

    def _pack(self, flat):
        return tf.nest.pack_sequence_as(self._data_spec, flat)

    def _slots_by_position(self, mask):
        """The slots where `mask` holds, ordered by their frames' positions in episodes."""
        slots = tf.where(mask)[:, 0]
        return tf.gather(slots, tf.argsort(tf.gather(self._frame_position, slots)))

    def _episode_values(self, episode_id):
        """The frames of `episode_id` in order, a nest `[length, ...]` (no validity check)."""
        episode_id = tf.convert_to_tensor(episode_id, tf.int64)
        slots = self._slots_by_position(tf.equal(self._frame_episode, episode_id)
                                        & (episode_id >= 0))
        return self._pack([tf.gather(var, slots) for var in self._frames])

    # ------------------------------------------------------------------ clearing

    def _clear_locations(self, locations):
        """Frees the frames of the episodes at `locations` and zeroes their lengths and flags."""
        episode = self._frame_episode.read_value()
        mine = tf.reduce_any(tf.equal(self._location(episode)[:, None], locations[None, :]),
                             axis=1) & (episode >= 0)
        return tf.group(
            self._frame_episode.assign(tf.where(mine, tf.constant(INVALID_ID, tf.int64),
                                                episode)),
            *self._reset_locations(locations))

    def _clear_pool(self, clear_all_variables=False):
        """Empties the pool. By default the episode ids stay stored (length 0), so
        writers holding them carry on; `clear_all_variables` forgets them too."""
        ops = [self._frame_episode.assign(invalid_ids(tf.shape(self._frame_episode))),
               self._episode_lengths.assign(tf.zeros_like(self._episode_lengths)),
               self._episode_tail.assign(invalid_ids([self._capacity])),
               self._num_writes.assign(0),
               self._cursor.assign(0)]
        if clear_all_variables:
            ops += [self._episode_completed.assign(tf.zeros_like(self._episode_completed)),
                    self._episodes_loc_to_id_map.assign(invalid_ids([self._capacity])),
                    self._last_episode.assign(INVALID_ID)]
        return tf.group(ops, name='clear')
