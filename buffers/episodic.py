"""Episodic replay: the uniform ring plus per-row episode ids, sampled within episodes.

Why not TF-Agents' `EpisodicReplayBuffer`: it counts capacity in episodes (so
memory depends on episode length), returns whole episodes through Python-side
bookkeeping, runs at ~19k transitions/s, and cannot be compiled by XLA. This
backend keeps the exact storage of `UniformReplay` (one flat TF variable per
data leaf, `row = slot * num_envs + env`) and adds one int64 variable holding
each row's episode id, so every operation is a fixed graph of gathers and
scatters that XLA compiles.

Episode ids. An episode's id is the absolute step (`add` call count) at which
its first item was written, per env copy. Ids therefore grow along each env
copy's stream and say by themselves whether an episode's head is still stored:
it is iff `id >= oldest`, the oldest step the ring keeps. A new episode begins
on an item with `step_type == FIRST`, on the item after a `LAST` item, and on
an env copy's first item. A data spec without a `step_type` leaf has no
boundaries: each env copy's stream is one episode and the buffer behaves like
`UniformReplay`.

Eviction of whole episodes. The ring overwrites the oldest step of every env
copy on each `add`. Once the head (first item) of an episode is overwritten,
the rest of that episode is dead: it still occupies its rows until they are
overwritten, but it is never sampled and not counted in `size`. So an episode
is never partially replayed while others remain. The one exception is an
episode longer than `capacity // num_envs` (the rows per env copy): while it is
the env copy's current episode (still being collected, or just ended and not
yet followed by the next one) it is truncated from its oldest end and stays
sampleable, counted in the `truncated_episodes` metric and left out of
`episodes` and `episode_stats`. When the next episode begins, it is evicted
whole.

Eviction is lazy, an O(num_envs) scatter per `add`; sampling computes the
valid-start mask over all rows (O(capacity), vectorised) and draws uniformly
among valid starts by descending a sum tree rebuilt from the mask -- not by a
`cumsum` and `searchsorted`, because XLA lowers `cumsum` on CPU to a
reduce-window that is quadratic in the capacity. At capacity 100k (one CPU
core's worth of work) a batch of 256 two-step windows takes ~1 ms per call
under XLA and ~2 ms without; when the fused loop samples several batches in one
compiled call with no `add` in between, XLA computes the mask once for all of
them.
"""

from collections.abc import Mapping

import gin
import numpy as np
import tensorflow as tf
from tf_agents.trajectories.time_step import StepType

from buffers.base import Capabilities, SampleInfo
from buffers.uniform import UniformReplay
from core.errors import UserError

_FIRST = int(StepType.FIRST)
_LAST = int(StepType.LAST)


def _leaf(nest, name):
    """The single-tensor leaf `name` of a dict or namedtuple nest (a Trajectory), or None."""
    if isinstance(nest, Mapping):
        leaf = nest.get(name)
    else:
        leaf = getattr(nest, name, None)
    if leaf is None or tf.nest.is_nested(leaf):
        return None
    return leaf


@gin.configurable
class EpisodicReplay(UniformReplay):
    """In-process replay of whole episodes with windows that never cross a boundary.

    (Not for frame stacks: a window holding k - 1 context frames could then never
    cover an episode's first steps, so those would never be trained on.)

    Capacity counts transitions, as in every backend. `sample(B, T)` draws `B`
    windows of `T` consecutive items of one episode of one env copy, uniformly
    over all valid windows, where a window starting at item `t` is valid iff:

    - items `t .. t + T - 1` are stored and belong to the same episode (a
      window may end on the episode's `LAST` item, never go past it);
    - item `t` is not a `LAST` item: that item is the `LAST -> FIRST` boundary
      transition of batched auto-resetting envs, which no window starts on (so
      with `T == 1` boundary items are never sampled);
    - the episode is alive: its head is still stored, or it is its env copy's
      current, truncated episode (see the module docstring).

    The episode being collected in each env copy is sampleable as far as it
    has been written (windows wholly inside its written part), so short
    windows from long episodes are available before the episode ends.

    `SampleInfo.keys` are the absolute ids `start * num_envs + env` of each
    window's first item, as in `UniformReplay`; `probabilities` are exactly
    `1 / number_of_valid_windows`. Before any valid window exists the draw is
    arbitrary and its probabilities (1.0) are not meaningful.
    """

    # Its own `add` (episode ids) and sampling (valid windows per episode).
    capabilities = Capabilities(xla=True, episode_windows=True)

    def __init__(self, data_spec, *, capacity, num_envs=1, batch_size=1, num_steps=2, seed=0,
                 name='episodic_replay'):
        """Allocates storage for `capacity` transitions and their episode ids.

        Args:
          data_spec: nest of `tf.TensorSpec`, normally `agent.collect_data_spec`
            (a `Trajectory`, whose `step_type` marks episode boundaries and
            whose `reward` gives episode returns).
          capacity: transitions kept, summed over env copies.
          num_envs: batch size of every `add` call.
          batch_size: the learner's batch size (validated against capacity).
          num_steps: the learner's window length (validated against capacity).
          seed: seeds the sampling RNG, which is checkpointed with the buffer.
          name: module name.
        """
        super().__init__(data_spec, capacity=capacity, num_envs=num_envs, batch_size=batch_size,
                         num_steps=num_steps, seed=seed, name=name)
        self._step_types = _leaf(self._storage, 'step_type')
        self._rewards = _leaf(self._storage, 'reward')
        self._episode_ids = tf.Variable(tf.fill([self._capacity], tf.constant(-1, tf.int64)),
                                        trainable=False, name='episode_ids')
        # The id of each env copy's current episode (-1 before its first item)
        # and whether its last item was LAST, so the next item begins a new one.
        self._current_episode = tf.Variable(tf.fill([num_envs], tf.constant(-1, tf.int64)),
                                            trainable=False, name='current_episode')
        self._episode_ended = tf.Variable(tf.zeros([num_envs], tf.bool), trainable=False,
                                          name='episode_ended')
        # Leaves of the per-sample count tree: a power of two >= capacity.
        self._num_leaves = 1 << (self._capacity - 1).bit_length()

    def add(self, trajectory):
        """Writes one batched step `[num_envs, ...]` and the episode id of each row.

        O(num_envs): evicting an episode whose head this write overwrites needs
        no work here, because its id then falls below the oldest stored step.
        """
        num_envs = self._num_envs
        step = self._num_adds.read_value()
        step_type = _leaf(trajectory, 'step_type') if self._step_types is not None else None
        if step_type is None:
            first = last = tf.zeros([num_envs], tf.bool)
        else:
            step_type = tf.reshape(tf.cast(step_type, tf.int32), [num_envs])
            first, last = tf.equal(step_type, _FIRST), tf.equal(step_type, _LAST)
        current = self._current_episode.read_value()
        begins = first | self._episode_ended.read_value() | (current < 0)
        episode = tf.where(begins, tf.fill([num_envs], step), current)
        rows = (step % self._rows_per_env) * num_envs + tf.range(num_envs, dtype=tf.int64)
        self._episode_ids.scatter_update(tf.IndexedSlices(episode, rows))
        self._current_episode.assign(episode)
        self._episode_ended.assign(last)
        super().add(trajectory)

    def sample(self, batch_size, num_steps):
        """Draws `batch_size` windows of `num_steps` items, uniformly over valid windows.

        Returns:
          `(window, SampleInfo)`: the nest `[batch_size, num_steps, ...]`, the
          int64 keys (absolute id of each window's first item) and the float32
          probability `1 / num_valid_windows` of each draw.

        Raises:
          UserError: if `num_steps` exceeds the rows kept per env copy.
        """
        if num_steps > self._rows_per_env:
            raise UserError(
                f"cannot sample {num_steps}-step windows from a buffer keeping "
                f"{self._rows_per_env} steps per env copy: raise the capacity.")
        num_adds = self._num_adds.read_value()
        valid = tf.reshape(self._valid_starts(num_adds, num_steps), [-1])
        counts = tf.pad(tf.cast(valid, tf.int32), [[0, self._num_leaves - self._capacity]])
        # Sum tree of the mask, bottom level first: exact integer counts, so a
        # draw in [0, total) always lands on a valid leaf.
        levels = [counts]
        while levels[-1].shape[0] > 1:
            levels.append(tf.reduce_sum(tf.reshape(levels[-1], [-1, 2]), axis=1))
        total = levels[-1][0]
        target = self._rng.uniform([batch_size], 0, tf.maximum(total, 1), dtype=tf.int32)
        node = tf.zeros([batch_size], tf.int32)
        for level in reversed(levels[:-1]):
            left = tf.gather(level, 2 * node)
            go_right = target >= left
            target = tf.where(go_right, target - left, target)
            node = 2 * node + tf.cast(go_right, tf.int32)
        row = tf.minimum(tf.cast(node, tf.int64), self._capacity - 1)

        slot, env = row // self._num_envs, row % self._num_envs
        start = num_adds - 1 - (num_adds - 1 - slot) % self._rows_per_env
        window = self._gather_windows(start, env, num_steps)
        self._num_sampled.assign_add(batch_size)
        probability = 1.0 / tf.cast(tf.maximum(total, 1), tf.float32)
        info = SampleInfo(keys=start * self._num_envs + env,
                          probabilities=tf.fill([batch_size], probability))
        return window, info

    def update_priorities(self, keys, priorities):
        """Episodic replay is uniform over windows; accepting the call keeps loops generic."""
        del keys, priorities

    def size(self):
        """Transitions in alive episodes (a tensor); rows of evicted episodes do not count."""
        return tf.reduce_sum(tf.cast(self._alive_rows(self._num_adds.read_value()), tf.int64))

    def metrics(self):
        """Uniform's metrics plus `episodes` (stored complete) and `truncated_episodes`."""
        metrics = super().metrics()
        metrics['episodes'] = float(self._complete_episode_rows()[0].sum())
        num_adds = self._num_adds.numpy()
        current = self._current_episode.numpy()
        oldest = max(num_adds - self._rows_per_env, 0)
        metrics['truncated_episodes'] = float(((current >= 0) & (current < oldest)).sum())
        return metrics

    def histograms(self):
        """Stored complete episodes' lengths and (when rewards are stored) returns."""
        stats = self.episode_stats()
        histograms = {'episode_length': stats['lengths']}
        if 'returns' in stats:
            histograms['episode_return'] = stats['returns']
        return histograms

    def episode_stats(self):
        """Lengths and returns of the stored complete episodes, oldest first (for histograms).

        A complete episode has its head and its `LAST` item stored; truncated
        and still-running episodes are left out, so the statistics describe
        whole episodes only.

        Returns:
          A dict of numpy arrays, one entry per episode: `lengths` (int64,
          transitions, i.e. items other than the `LAST -> FIRST` boundary item,
          as TF-Agents' episode-length metric counts them) and, when the data
          spec has a single `reward` leaf, `returns` (float64, the sum of the
          episode's rewards; the boundary item's reward is included, as it is
          0 in TF-Agents trajectories).
        """
        is_last, members = self._complete_episode_rows()
        keys = self._row_keys()
        episodes = np.sort(keys[is_last])
        index = np.searchsorted(episodes, keys[members])
        stats = {'lengths': np.bincount(index, minlength=len(episodes)).astype(np.int64) - 1}
        if self._rewards is not None:
            rewards = self._rewards.numpy().reshape(
                self._rows_per_env, self._num_envs, *self._rewards.shape[1:])
            returns = np.zeros((len(episodes), *self._rewards.shape[1:]), np.float64)
            np.add.at(returns, index, rewards[members].astype(np.float64))
            stats['returns'] = returns
        return stats

    def checkpoint_items(self):
        """Uniform's items plus episode ids and per-env episode state: restores identically."""
        return {
            **super().checkpoint_items(),
            'episode_ids': self._episode_ids,
            'current_episode': self._current_episode,
            'episode_ended': self._episode_ended,
        }

    def _alive_rows(self, num_adds):
        """[rows_per_env, num_envs] bool: rows stored and belonging to an alive episode."""
        rows_per_env = self._rows_per_env
        oldest = tf.maximum(num_adds - rows_per_env, 0)
        age = (num_adds - 1 - tf.range(rows_per_env, dtype=tf.int64)) % rows_per_env
        stored = age < tf.minimum(num_adds, rows_per_env)
        episode = tf.reshape(self._episode_ids, [rows_per_env, self._num_envs])
        alive = (episode >= oldest) | tf.equal(episode, self._current_episode[None, :])
        return stored[:, None] & alive

    def _valid_starts(self, num_adds, num_steps):
        """[rows_per_env, num_envs] bool: rows that start a valid `num_steps` window.

        Slot `s` holds the item of age `(num_adds - 1 - s) % rows_per_env`; the
        window's last item is `num_steps - 1` slots later and must be stored
        (age >= num_steps - 1) and carry the same episode id. Ids are constant
        over an episode and grow along the stream, so equal ids at both ends
        mean the whole window lies in one episode.
        """
        rows_per_env, shift = self._rows_per_env, num_steps - 1
        age = (num_adds - 1 - tf.range(rows_per_env, dtype=tf.int64)) % rows_per_env
        episode = tf.reshape(self._episode_ids, [rows_per_env, self._num_envs])
        end_episode = tf.concat([episode[shift:], episode[:shift]], axis=0) if shift else episode
        valid = self._alive_rows(num_adds) & (age >= shift)[:, None] & tf.equal(
            episode, end_episode)
        if self._step_types is not None:
            step_type = tf.reshape(self._step_types, [rows_per_env, self._num_envs])
            valid &= tf.not_equal(tf.cast(step_type, tf.int32), _LAST)
        return valid

    def _row_keys(self):
        """[rows_per_env, num_envs] int64 numpy: a key unique to each (episode, env copy)."""
        episode = self._episode_ids.numpy().reshape(self._rows_per_env, self._num_envs)
        return episode * self._num_envs + np.arange(self._num_envs)

    def _complete_episode_rows(self):
        """Numpy masks `(is_last, members)` over `[rows_per_env, num_envs]`.

        `is_last` marks the `LAST` item of each stored complete episode (one
        per episode); `members` marks every item of those episodes.
        """
        shape = (self._rows_per_env, self._num_envs)
        if self._step_types is None:
            return np.zeros(shape, bool), np.zeros(shape, bool)
        num_adds = self._num_adds.read_value()
        oldest = max(int(num_adds.numpy()) - self._rows_per_env, 0)
        whole = self._alive_rows(num_adds).numpy() & (
            self._episode_ids.numpy().reshape(shape) >= oldest)
        is_last = whole & (self._step_types.numpy().reshape(shape) == _LAST)
        keys = self._row_keys()
        return is_last, whole & np.isin(keys, keys[is_last])
