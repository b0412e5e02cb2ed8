"""One logical replay buffer over several Reverb servers (shards): faithful sampling, routed
priorities, and where a writer should write.

Reverb servers know nothing of each other, and one `TrajectoryDataset` opened on a
multi-address target samples only one of them (measured: 410 samples from one server, 0
from the other). So the read side opens one stream per shard and mixes them itself
(`tf.data.Dataset.sample_from_datasets`), choosing shard k with probability
`M_k / sum_j M_j`, where `M_k` is the shard's sampling mass: the sum of `q^alpha` over
its windows (`alpha` = 0 for a uniform table, so `M_k` is its size). Reverb then draws
window i within the shard with probability `q_i^alpha / M_k`, so overall

    P(i) = (M_k / sum_j M_j) * (q_i^alpha / M_k) = q_i^alpha / sum_j M_j,

exactly what one table holding every shard's windows would give (uniform: 1 / total
size). Reverb reports no priority sums, but every sample carries its priority `q_i` and
the probability it had in its table, so `M_k = q_i^alpha / P_k(i)` exactly, as of that
draw: each window taken from a shard updates that shard's mass. A shard not drawn from
yet counts its size times the mean mass per window of those that were (1 at first).
`refresh` reads each shard's size and rate limiter; a shard below its own
`min_size_to_sample`, or unreachable, gets no weight until a later refresh finds it ready.

Keys are per server (an update sent to another server is ignored), so the keys this
buffer hands out are `(shard, key)` pairs, int64 `[..., 2]`, and `update_priorities`
sends each priority to the shard that holds its key.
"""

import queue
import socket
import threading
import time

import numpy as np
import reverb
import tensorflow as tf

from buffers.base import SampleInfo
from core.errors import UserError

# How long a shard that was down may take to accept a TCP connection before it still counts
# as down (see `accepts_connections`).
CONNECT_PROBE_S = 0.25


def accepts_connections(address, timeout_s=CONNECT_PROBE_S):
    """Whether something listens at 'host:port' (a TCP connect, closed at once).

    A Reverb call to a server that is gone does not fail when the connection is refused:
    gRPC retries until the call's deadline (at least 1 s, `timeout_s` of the run), so
    every read of a dead shard's counters cost that long and the collectors, which read
    them at each weight pull, wrote at an eighth of their rate while a shard was down.
    A shard that was down is asked again only once its port accepts a connection.
    """
    host, _, port = address.rpartition(':')
    try:
        socket.create_connection((host.strip('[]'), int(port)), timeout=timeout_s).close()
    except (OSError, ValueError):
        return False
    return True


KEY_SHARD, KEY_VALUE = 0, 1  # the two columns of a sharded key


class ShardedReplay:
    """The learner's read side of K Reverb tables with the same layout, as one buffer.

    Takes read-only Reverb backends, one per shard (each validated its own table);
    `as_dataset` and `update_priorities` are the `ReplayBackend` read side; nothing
    here writes (collectors write to one shard each, see `choose_shard`).
    """

    def __init__(self, shards, *, seed=0, timeout_s=5.0):
        """Mixes `shards` (read-only Reverb backends of one class, one per server).

        `timeout_s` bounds each shard's answer in `refresh`: a shard that does not answer
        in time counts as down.
        """
        if not shards:
            raise UserError("A sharded replay buffer needs at least one shard.")
        classes = {type(shard).__name__ for shard in shards}
        if len(classes) != 1:
            raise UserError(f"Replay shards must all be one backend class, got {sorted(classes)}.")
        self._shards = list(shards)
        self.capabilities = shards[0].capabilities
        self._alpha = shards[0].alpha if self.capabilities.priorities else 0.0
        self._seed = seed
        self._timeout_s = timeout_s
        self._states = None
        self._priority_updaters = None
        # Each shard's answer time at the last `refresh` (a round trip; NaN when down).
        self.latencies_ms = [float('nan')] * len(shards)
        count = len(shards)
        # -1: no window drawn from that shard yet (its mass is estimated from its size).
        self._sampled_mass = tf.Variable(tf.fill([count], tf.constant(-1.0, tf.float64)),
                                         trainable=False, name='shard_sampled_mass')
        self._sizes = tf.Variable(tf.zeros([count], tf.float64), trainable=False,
                                  name='shard_sizes')
        self._ready = tf.Variable(tf.zeros([count], tf.bool), trainable=False,
                                  name='shard_ready')

    @property
    def num_shards(self):
        return len(self._shards)

    @property
    def shards(self):
        return list(self._shards)

    @property
    def capacity(self):
        return sum(shard.capacity for shard in self._shards)

    @property
    def data_spec(self):
        return self._shards[0].data_spec

    # -- Weights ----------------------------------------------------------------------------------

    def refresh(self):
        """Reads every shard's size and readiness; returns [(size, ready) or None per shard].

        A shard is ready when it holds at least its own `min_size_to_sample` windows (its
        stream would block otherwise); an unreachable one (None) is not.
        """
        states, latencies = [], []
        for index, shard in enumerate(self._shards):
            started = time.perf_counter()
            was_down = self._states is not None and self._states[index] is None
            if was_down and not accepts_connections(shard.server_address):
                states.append(None)
                latencies.append(float('nan'))
                continue
            try:
                info = shard.table_info(self._timeout_s)
            except (RuntimeError, reverb.errors.ReverbError, KeyError):
                states.append(None)
                latencies.append(float('nan'))
                continue
            latencies.append(1000 * (time.perf_counter() - started))
            size = int(info.current_size)
            minimum = int(info.rate_limiter_info.min_size_to_sample)
            states.append((size, size > 0 and size >= minimum))
        self._sizes.assign([float(s[0]) if s else 0.0 for s in states])
        self._ready.assign([bool(s and s[1]) for s in states])
        self._states = states
        self.latencies_ms = latencies
        return states

    def masses(self):
        """Each shard's sampling mass as it is used now (0 for a shard not ready)."""
        known = self._sampled_mass >= 0
        sizes = self._sizes
        known_sizes = tf.reduce_sum(tf.where(known, sizes, 0.0))
        per_window = tf.math.divide_no_nan(tf.reduce_sum(tf.where(known, self._sampled_mass, 0.0)),
                                           known_sizes)
        per_window = tf.where(known_sizes > 0, per_window, tf.constant(1.0, tf.float64))
        mass = tf.where(known, self._sampled_mass, sizes * per_window)
        return tf.where(self._ready, mass, 0.0)

    def _weights(self):
        mass = self.masses()
        total = tf.reduce_sum(mass)
        count = tf.cast(tf.size(mass), tf.float64)
        # No shard ready: equal weights (each stream then waits on its rate limiter).
        return tf.cast(tf.where(total > 0, mass / total, tf.ones_like(mass) / count), tf.float32)

    # -- Read path --------------------------------------------------------------------------------

    def _shard_stream(self, index, batch_size, num_steps, group):
        """Shard `index`'s samples in groups of `group`, as (data, key, priority, index) with a
        leading `[group]` dimension, updating the shard's mass from each group.

        A shard that was down at the last `refresh` gets a stand-in stream of the same
        element type instead (Reverb would wait for it to answer): its weight is 0, so it
        is never drawn from; a dataset opened after it is back samples it again.
        """
        if self._states[index] is None:
            zeros = tf.nest.map_structure(lambda s: tf.zeros([group, *s.shape], s.dtype),
                                          self._shards[index].signature)
            return tf.data.Dataset.from_tensors(
                (zeros, tf.zeros([group], tf.int64), tf.zeros([group], tf.float64),
                 tf.fill([group], tf.constant(index, tf.int64)))).repeat()
        alpha = self._alpha

        def tagged(sample):
            priority = tf.cast(sample.info.priority, tf.float64)
            mass = tf.pow(priority[-1], alpha) / tf.cast(sample.info.probability[-1],
                                                         tf.float64)
            self._sampled_mass.scatter_nd_update([[index]], [mass])
            return (sample.data, tf.bitcast(sample.info.key, tf.int64), priority,
                    tf.fill([group], tf.constant(index, tf.int64)))

        samples = self._shards[index].raw_samples(batch_size, num_steps)
        return samples.batch(group, drop_remainder=True).map(tagged)

    def down_shards(self):
        """The shards that did not answer at the last `refresh`."""
        return [k for k, state in enumerate(self._states or []) if state is None]

    def as_dataset(self, batch_size, num_steps):
        """An endless dataset of `(window, SampleInfo)` batches drawn over every shard.

        `SampleInfo.keys` are int64 `[B, 2]` (shard, key) pairs; `probabilities` are each
        window's probability in the whole buffer, `q^alpha / sum of masses`.

        The shard is chosen per group of `GROUP` windows (the largest of 16, 8, 4, 2, 1
        dividing the batch), each window of a group drawn independently by its shard: every
        window's chance of being drawn is the same as with a choice per window, and the
        mixing costs 1/GROUP as many tf.data steps (per window it sampled 0.3x as fast as
        one server; bench/shard_sampling.py).
        """
        self.refresh()
        group = next(g for g in (16, 8, 4, 2, 1) if batch_size % g == 0)
        streams = [self._shard_stream(k, batch_size, num_steps, group)
                   for k in range(self.num_shards)]
        weights = tf.data.Dataset.from_tensors(0).repeat().map(lambda _: self._weights())
        # A shard's stream ends when its table gives nothing within the rate limiter's
        # timeout; the mix then ends too (an OutOfRangeError the learner answers by
        # reopening, as with one server) instead of drawing on without that shard.
        mixed = tf.data.Dataset.sample_from_datasets(streams, weights=weights, seed=self._seed,
                                                     stop_on_empty_dataset=True)
        alpha = self._alpha
        decode = self._shards[0].decode_window

        def windows(data, key, priority, shard):
            # [B / group, group, ...] -> [B, ...]
            data, key, priority, shard = tf.nest.map_structure(
                lambda x: tf.reshape(x, [batch_size, *x.shape[2:]]), (data, key, priority, shard))
            window, _ = decode(data)
            total = tf.reduce_sum(self.masses())
            probabilities = tf.math.divide_no_nan(tf.pow(priority, alpha), total)
            keys = tf.stack([shard, key], axis=-1)
            return window, SampleInfo(keys=keys, probabilities=tf.cast(probabilities, tf.float32))

        return mixed.batch(batch_size // group, drop_remainder=True).map(
            windows, num_parallel_calls=tf.data.AUTOTUNE)

    def update_priorities(self, keys, priorities):
        """Sends each window's new priority to the shard that holds its key; eager only.

        The updates go out on one thread per shard, so the learner never waits on them:
        Reverb's priority update has no timeout, and one sent to a shard that was just
        killed would hold the learner until the shard is back. A shard that falls
        `UPDATE_QUEUE` calls behind (it is down) loses the oldest pending ones: its table
        comes back from a checkpoint older than them anyway.
        """
        if not tf.executing_eagerly():
            raise RuntimeError("ShardedReplay.update_priorities runs eagerly (the learner "
                               "calls it after each chunk), not inside a tf.function.")
        keys = np.asarray(keys, np.int64).reshape(-1, 2)
        priorities = np.asarray(priorities).reshape(-1)
        for index, updater in enumerate(self._updaters()):
            mine = keys[:, KEY_SHARD] == index
            if mine.any():
                updater.send(keys[mine, KEY_VALUE], priorities[mine])

    def _updaters(self):
        if self._priority_updaters is None:
            self._priority_updaters = [_PriorityUpdater(shard) for shard in self._shards]
        return self._priority_updaters

    def wait_for_updates(self, timeout_s=10.0):
        """Blocks until every priority update sent so far has reached its shard (or the
        time is up); returns whether all had."""
        deadline = time.monotonic() + timeout_s
        return all(updater.wait(deadline) for updater in self._priority_updaters or [])

    def dropped_updates(self):
        """Priority-update calls dropped because a shard fell behind (was down), per shard."""
        return [u.dropped for u in self._priority_updaters or []]

    def metrics(self):
        """Per shard and in total: windows stored, and whether the shard is ready."""
        states = self.refresh()
        values = {'windows': float(sum(s[0] for s in states if s))}
        for index, state in enumerate(states):
            values[f'shard_{index}/windows'] = float(state[0]) if state else float('nan')
        return values

    def close(self):
        for updater in self._priority_updaters or []:
            updater.stop()
        for shard in self._shards:
            shard.close()


UPDATE_QUEUE = 16  # priority-update calls a shard may fall behind before the oldest are dropped


class _PriorityUpdater:
    """One shard's priority updates, sent in order on a thread of their own."""

    def __init__(self, shard):
        self._shard = shard
        self._queue = queue.Queue()
        self._lock = threading.Lock()
        self._idle = threading.Condition()
        self._pending = 0  # calls sent and not yet done
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name='shard-priorities')
        self._thread.start()

    def send(self, keys, priorities):
        with self._lock:
            while self._queue.qsize() >= UPDATE_QUEUE:
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
                self.dropped += 1
                self._done()
            with self._idle:
                self._pending += 1
            self._queue.put((keys, priorities))

    def _done(self):
        with self._idle:
            self._pending -= 1
            self._idle.notify_all()

    def wait(self, deadline):
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0,
                                       timeout=max(0.0, deadline - time.monotonic()))

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            keys, priorities = item
            try:
                self._shard.update_priorities(tf.constant(keys), tf.constant(priorities))
            except (tf.errors.OpError, RuntimeError, reverb.errors.ReverbError):
                self.dropped += 1  # the shard went away mid-call; its checkpoint predates it
            self._done()

    def stop(self):
        """Ends the thread after what is queued (a thread stuck on a dead shard stays)."""
        self._queue.put(None)


def choose_shard(inserted, local=None, current=None, rates=None, tolerance=0.01, offset=0):
    """The shard a writer should write to: keep shards balanced, then stay put, then stay local.

    Args:
      inserted: windows each shard has received so far (None for a shard that is down).
      local: for each shard, whether it runs on the writer's machine (None: not known).
      current: the shard the writer writes to now, if any.
      rates: how fast each shard is receiving windows now (any unit; None: not known).
      tolerance: how far above the least-filled shard (as a fraction of the mean) a shard
        may be and still be kept (current) or chosen for being local.
      offset: breaks ties from shard `offset % K` on (a writer passes its own number, so
        writers starting together spread over the shards instead of all taking shard 0).

    Returns:
      The index of the shard. Among the live shards within `tolerance` of the least-filled
      one: the current shard if it is one of them (a switch costs a new writer stream),
      else the least-filled local one, else the least-filled one. A writer stays on a
      current shard that is too full while the chosen one already receives windows faster
      (another writer moved there and the gap is closing): without this, every writer
      leaves the fuller shard before any sees the effect, and the shards swap roles.

    Raises:
      UserError: when every shard is down.
    """
    live = [k for k, count in enumerate(inserted) if count is not None]
    if not live:
        raise UserError("Every replay shard is down: restart them (the run resumes).")
    least = min(inserted[k] for k in live)
    mean = float(np.mean([inserted[k] for k in live]))
    eligible = [k for k in live if inserted[k] <= least + tolerance * max(mean, 1.0)]
    if current in eligible:
        return current
    nearby = [k for k in eligible if local is not None and local[k]]
    count = len(inserted)
    chosen = min(nearby or eligible, key=lambda k: (inserted[k], (k - offset) % count))
    if current in live and rates is not None and rates[chosen] > rates[current]:
        return current
    return chosen
