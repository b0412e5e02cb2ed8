"""Replay backends on a Reverb table: uniform and prioritized.

Why Reverb when `UniformReplay`/`PrioritizedReplay` are faster in one process:
the same table serves distributed actors and learners (many writers, one
server), and its checkpoints are Reverb's own. These backends keep the one
`ReplayBackend` contract so a run switches to them with one Gin binding.

Items. The table holds `num_steps`-step windows of ONE env copy (written by
`buffers/reverb/writer.py`). Capacity counts items, i.e. transitions (one
window per step); the Fifo remover evicts the oldest window first, so a full
table keeps each copy's last `capacity / num_envs` windows, which reach
`num_steps - 1` steps further back than a row buffer's. The window length is
fixed when the backend is built, so `sample` serves only `num_steps`-step
windows. Windows may cross an episode boundary (LAST -> FIRST) exactly as in
`UniformReplay`; agents mask them.

The parts, one job each (buffers/reverb/): `layout.py` packs a step's small
leaves into one uint8 column (Reverb's costs grow with columns per item: a
CartPole-like step writes 1 column instead of 7, about 3x the vector insert
and sample rates); `writer.py` is the write side, `reader.py` the read side;
`server.py` is an in-process server with its checkpoints, owned by whoever
hosts it; `backend.py` joins them. This file adds each backend's sampler and
priorities.

Server. By default the backend hosts its own `ReplayServer` on a free port
(`MinSize(1)` rate limiter: in one process nothing must throttle inserts against
samples). With `server_address='host:port'` a running server is used instead; it
must host a table named `table_name` (default `reverb_uniform_replay` or
`reverb_prioritized_replay`) with this backend's signature, selector and a Fifo
remover. With `server=` a `ReplayServer` its caller owns (the distributed
replay role: its port, rate limiter, weights table and initial checkpoint) is
started with this backend's table, so the table's layout is written in one place.

Checkpoints. `checkpoint_items()` holds a `PythonState` that, when a
`tf.train.Checkpoint` is saved, makes Reverb write its own checkpoint and
records that checkpoint's path; restoring restarts the hosted server from
exactly that checkpoint and reopens the writer and reader, so `tf.function`s
that sample must be traced after the restore (the trainer restores before it
builds the loop). Without `checkpoint_dir` a temporary directory is used and
removed by `close()` (and at exit): enough within a process, but a resumable
run must pass a persistent directory, e.g. `<root_dir>/checkpoints/replay`.
With a server run elsewhere, a save checkpoints that server (its owner
restores it) and a restore brings back only this side's counters.
"""

import gin
import reverb
import tensorflow as tf

from buffers.base import Capabilities, check_priority_settings
from buffers.reverb.backend import ReverbBackend
from buffers.reverb.layout import SequenceLayout
from buffers.reverb.server import latest_checkpoint  # noqa: F401  (re-exported)
from buffers.reverb.writer import SequenceWriter
from buffers.sequence import check_sequence_backend


@gin.configurable
class ReverbUniformReplay(ReverbBackend):
    """Uniform replay of `num_steps` windows from a Reverb table.

    Every stored window is drawn with probability `1 / size`; `update_priorities`
    is accepted and ignored.
    """

    default_table_name = 'reverb_uniform_replay'


class ReverbWindowQueue(ReverbBackend):
    """A Reverb queue of windows: each window is sampled once, oldest first, then removed.

    What collectors write to when the learner holds the replay
    (`distributed.settings.learner_holds_replay`, buffers/windows.py): the same items and
    columns as `ReverbUniformReplay`, so the collectors' writer is unchanged, but the table
    only carries windows across to the learner, which keeps them. `capacity` is the queue's
    length; the replay role gives the table a `Queue` rate limiter of that length, so that
    collectors wait while it is full and the learner while it is empty.
    """

    default_table_name = 'reverb_window_queue'

    def make_table(self, rate_limiter=None):
        return reverb.Table(
            name=self._table_name,
            sampler=reverb.selectors.Fifo(),
            remover=reverb.selectors.Fifo(),
            max_size=self._max_items(),
            max_times_sampled=1,
            rate_limiter=rate_limiter or reverb.rate_limiters.Queue(self._max_items()),
            signature=self._layout.signature)


@gin.configurable
class ReverbPrioritizedReplay(ReverbBackend):
    """Proportional prioritized replay (Schaul et al., 2016) on a Reverb table.

    A window is drawn with probability `q_i ** alpha / sum_j q_j ** alpha`, where
    `q = p + priority_epsilon` for the last priority `p` given to its key (the
    table's `priority_exponent` is `alpha`). New windows get the largest `q`
    seen so far (1.0 at first), so each is likely replayed once before its TD
    error is known. That maximum is checkpointed with the buffer.
    """

    capabilities = Capabilities(own_checkpoints=True, server=True, priorities=True)
    default_table_name = 'reverb_prioritized_replay'

    def __init__(self, data_spec, *, capacity, num_envs=1, batch_size=1, num_steps=2, seed=0,
                 alpha=0.6, priority_epsilon=1e-6, **kwargs):
        """Like `ReverbUniformReplay`, plus the prioritization settings.

        Args:
          data_spec: nest of `tf.TensorSpec`, normally `agent.collect_data_spec`.
          capacity: transitions (= windows) kept, summed over env copies.
          num_envs: batch size of every `add` call.
          batch_size: the learner's batch size (validated against capacity).
          num_steps: the window length of every item.
          seed: accepted for interface parity (Reverb cannot seed its sampler).
          alpha: how strongly priorities skew sampling; 0 is uniform.
          priority_epsilon: added to every priority so that a zero TD error
            still leaves its window a chance to be replayed.
          **kwargs: the Reverb options of `ReverbUniformReplay`.

        Raises:
          UserError: on a negative `alpha` or `priority_epsilon`.
        """
        check_priority_settings(type(self).__name__, alpha, priority_epsilon)
        self._alpha = float(alpha)
        self._epsilon = float(priority_epsilon)
        self._max_priority = tf.Variable(1.0, dtype=tf.float64, trainable=False,
                                         name='max_priority')
        super().__init__(data_spec, capacity=capacity, num_envs=num_envs, batch_size=batch_size,
                         num_steps=num_steps, seed=seed, **kwargs)

    @property
    def alpha(self):
        return self._alpha

    def _sampler(self):
        return reverb.selectors.Prioritized(priority_exponent=self._alpha)

    def _new_item_priority(self):
        return self._max_priority.read_value()

    def update_priorities(self, keys, priorities):
        """Sets the priorities of sampled windows; callable inside `tf.function`.

        Keys of windows evicted since they were sampled are ignored by Reverb.
        """
        priorities = tf.cast(tf.reshape(priorities, [-1]), tf.float64) + self._epsilon
        self._max_priority.assign(tf.maximum(self._max_priority, tf.reduce_max(priorities)))
        keys = tf.bitcast(tf.cast(tf.reshape(keys, [-1]), tf.int64), tf.uint64)
        self._client_op().update_priorities(self._table_name, keys, priorities)

    def _client_op(self):
        if self._tf_client is None:
            with tf.init_scope():
                self._tf_client = reverb.TFClient(self._address)
        return self._tf_client

    def histograms(self):
        """The stored priorities (p + priority_epsilon) of the last sampled windows.

        Reverb cannot list a table's priorities cheaply, so this shows what the
        learner drew (skewed towards high priorities, by design of the sampler).
        """
        return {'sampled_priority': self._reader.recent_priorities()}

    def checkpoint_items(self):
        return {**super().checkpoint_items(), 'max_priority': self._max_priority}


class _ReverbSequences:
    """Sequence replay on Reverb (mixed into a Reverb backend): what buffers/sequence.py does in
    process, with Reverb's chunks storing each step once.

    An item is a sequence: the `num_steps` steps from one sequence start (each episode's first
    step and every `period` steps after it) and that start's recorded state, a column written
    only at starts. Items overlap by `num_steps - period` steps, which their chunks share. The
    table keeps `ceil(capacity / period)` items, about `capacity` steps; the learner gets the
    start state in `policy_info`, repeated over the sequence, as from `SequenceReplay`.
    """

    def __init__(self, data_spec, *, period, **kwargs):
        check_sequence_backend(type(self).__name__, data_spec, period)
        self._period = period
        super().__init__(data_spec, **kwargs)

    @property
    def period(self):
        return self._period

    def _make_layout(self, data_spec, num_steps):
        return SequenceLayout(data_spec, num_steps)

    def _make_writer(self):
        return SequenceWriter(self._client, self._layout, period=self._period,
                              **self._writer_options)

    def _max_items(self):
        return -(-self._capacity // self._period)

    def _capacity_of(self, max_items):
        return max_items * self._period

    def metrics(self):
        """As for windows, except that `size` counts the steps added, up to the capacity (the
        kept sequences cover about that many), and `sequences` is the table's item count."""
        metrics = super().metrics()
        metrics['sequences'] = metrics.pop('windows')
        metrics['size'] = float(min(self._inserted, self._capacity))
        metrics['fill_ratio'] = metrics['size'] / self._capacity
        return metrics


@gin.configurable
class ReverbSequenceReplay(_ReverbSequences, ReverbUniformReplay):
    """Uniform sequence replay on a Reverb table (the in-process one: `SequenceReplay`)."""

    capabilities = Capabilities(own_checkpoints=True, server=True, sequences=True)
    default_table_name = 'reverb_sequence_replay'


@gin.configurable
class ReverbPrioritizedSequenceReplay(_ReverbSequences, ReverbPrioritizedReplay):
    """Prioritized sequence replay on a Reverb table (the in-process one:
    `PrioritizedSequenceReplay`)."""

    capabilities = Capabilities(own_checkpoints=True, server=True, sequences=True,
                                priorities=True)
    default_table_name = 'reverb_prioritized_sequence_replay'
