"""Sequence replay for recurrent agents: every env step stored once, sequences cut at sampling.

A recurrent learner trains on sequences of consecutive steps and needs the
policy's recurrent state at each sequence's start (R2D2, Kapturowski et al.,
2019). R2D2's reference implementations (Acme's `SequenceAdder`) store every
sequence as its own item of burn-in + trace + 1 steps, `period` steps apart, so
each env step is stored about three times. Here steps are stored once, in the
same ring as `UniformReplay`, and a sequence is a window of that ring:

- **Where sequences start** (the "entries"): at each episode's first step and every
  `period` steps after it (Acme's rule), never on an episode's LAST boundary row.
  An entry is a row with a non-zero leaf in the sum tree of `PrioritizedReplay`;
  every other row has a leaf of 0 and cannot be drawn. Uniform sampling is the same
  tree with every entry's leaf 1 (`alpha` = 0); prioritized sampling stores R2D2's
  sequence priority (the agent's eta-mix of the sequence's |TD errors|).
- **Start states**: the collect policy records the state it acted from in
  `policy_info` (agents/recurrent.py). Only an entry's state is kept, in a ring of one
  slot per `period` rows per env copy: within an episode entries are `period` apart,
  so no block of `period` rows holds two entries after an episode's first step, and
  an episode's first step needs no slot (its state is zero by definition: networks
  reset at FIRST). The ring has one spare block, so a slot is reused only once
  every row of its block is overwritten. A step thus costs its row plus
  `state bytes / period`, not three rows.
- **Episode ends**: a sequence is a fixed-length window and may run past its
  episode's LAST row into the next episode. Those steps are not cut out but
  masked: the agent gives them no loss (agents/recurrent.py, `sequence_mask`), so a
  sequence never trains across an episode start.

A sampled batch is the usual `(Trajectory [B, L, ...], SampleInfo)`; its
`policy_info` is the stored start state, repeated over the L steps.
"""

import gin
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

from buffers.base import Capabilities
from buffers.prioritized import PrioritizedReplay
from core.errors import UserError


def check_sequence_backend(name, data_spec, period):
    """One-line errors for a sequence backend (in process or on Reverb) that cannot work:
    a period that is no positive whole number, or an agent that records no state."""
    if isinstance(period, bool) or not isinstance(period, int) or period < 1:
        raise UserError(f"The sequence period must be a positive number of steps, got "
                        f"{period!r}: fix the agent's sequence_period binding.")
    if not tf.nest.flatten(data_spec.policy_info):
        raise UserError(f"{name} keeps the recurrent state each sequence starts from, but this "
                        "agent's collect policy records none: use it with a recurrent agent "
                        "(dqn.make_agent or sac.make_agent with an lstm_size), or bind "
                        "run.replay_backend to @UniformReplay.")


def _without_policy_info(data_spec):
    return data_spec._replace(policy_info=())


class _SequenceRing(PrioritizedReplay):
    """The shared machinery; `SequenceReplay` and `PrioritizedSequenceReplay` choose sampling."""

    def __init__(self, data_spec, *, capacity, period, num_envs=1, batch_size=1, num_steps=2,
                 seed=0, alpha=0.0, priority_epsilon=1e-6, name='sequence_replay'):
        """Allocates the step ring, its sum tree of entries and the start-state ring.

        Args:
          data_spec: the agent's `collect_data_spec`, a `Trajectory` whose
            `policy_info` is the recurrent state the collect policy acted from.
          capacity: env steps kept, summed over env copies.
          period: steps between sequence starts within an episode (the agent's
            `sequence_period`).
          num_envs, batch_size, num_steps, seed: as for `UniformReplay`; `num_steps`
            is the sequence length.
          alpha, priority_epsilon: as for `PrioritizedReplay` (alpha 0: uniform).
          name: module name.
        """
        check_sequence_backend(type(self).__name__, data_spec, period)
        super().__init__(_without_policy_info(data_spec), capacity=capacity, num_envs=num_envs,
                         batch_size=batch_size, num_steps=num_steps, seed=seed, alpha=alpha,
                         priority_epsilon=priority_epsilon, name=name)
        self._full_spec = data_spec
        self._period = period
        self._slots_per_env = (self._rows_per_env - 1) // period + 2
        self._states = tf.nest.map_structure(
            lambda spec: tf.Variable(
                tf.zeros([self._slots_per_env * num_envs, *spec.shape], spec.dtype),
                trainable=False),
            data_spec.policy_info)
        # Steps since each copy's episode started, as of its next row.
        self._since_start = tf.Variable(tf.zeros([num_envs], tf.int64), trainable=False,
                                        name='since_start')

    @property
    def data_spec(self):
        return self._full_spec

    @property
    def period(self):
        return self._period

    def _slots(self, step, env):
        return ((step // self._period) % self._slots_per_env) * self._num_envs + env

    def _entries(self, trajectory):
        """Which env copies' new rows start a sequence, and which of those need a stored state."""
        first = tf.equal(trajectory.step_type, ts.StepType.FIRST)
        since_start = tf.where(first, tf.zeros_like(self._since_start), self._since_start)
        entry = (since_start % self._period == 0) & ~tf.equal(trajectory.step_type,
                                                              ts.StepType.LAST)
        return entry, entry & ~first, since_start

    def add(self, trajectory):
        """Writes one batched step: its row, its leaf (entries only) and an entry's state."""
        _, needs_state, since_start = self._entries(trajectory)
        step = self._num_adds.read_value()
        envs = tf.range(self._num_envs, dtype=tf.int64)
        # Rows that store no state write their slot's current value back: a no-op.
        slots = self._slots(tf.fill([self._num_envs], step), envs)
        for var, state in zip(tf.nest.flatten(self._states),
                              tf.nest.flatten(trajectory.policy_info)):
            current = tf.gather(var, slots)
            mask = tf.reshape(needs_state, [-1] + [1] * (state.shape.rank - 1))
            var.scatter_update(tf.IndexedSlices(tf.where(mask, state, current), slots))
        super().add(trajectory._replace(policy_info=()))
        self._since_start.assign(since_start + 1)

    def _new_leaves(self, trajectory):
        entry, _, _ = self._entries(trajectory)
        return tf.where(entry, tf.fill([self._num_envs], self._max_priority.read_value()),
                        tf.zeros([self._num_envs], tf.float64))

    def sample(self, batch_size, num_steps):
        """Draws `batch_size` sequences of `num_steps` steps; `policy_info` is each start state."""
        window, info = super().sample(batch_size, num_steps)
        start, env = info.keys // self._num_envs, info.keys % self._num_envs
        starts_episode = tf.equal(window.step_type[:, 0], ts.StepType.FIRST)
        slots = self._slots(start, env)

        def start_state(var):
            state = tf.gather(var, slots)
            mask = tf.reshape(starts_episode, [-1] + [1] * (state.shape.rank - 1))
            state = tf.where(mask, tf.zeros_like(state), state)
            return tf.repeat(state[:, None], num_steps, axis=1)

        return window._replace(policy_info=tf.nest.map_structure(start_state, self._states)), info

    def update_priorities(self, keys, priorities):
        """Sets the priorities of sampled sequences; keys that start no sequence are ignored."""
        keys = tf.reshape(tf.cast(keys, tf.int64), [-1])
        is_entry = self.priorities(keys) > 0
        super().update_priorities(tf.where(is_entry, keys, -tf.ones_like(keys)), priorities)

    def metrics(self):
        metrics = super().metrics()
        metrics['sequence_period'] = float(self._period)
        return metrics

    def checkpoint_items(self):
        return {**super().checkpoint_items(), 'start_states': tf.nest.flatten(self._states),
                'since_start': self._since_start}


@gin.configurable
class SequenceReplay(_SequenceRing):
    """Uniform sequence replay: every stored sequence start equally likely."""

    capabilities = Capabilities(xla=True, sequences=True)

    def __init__(self, data_spec, *, capacity, period, num_envs=1, batch_size=1, num_steps=2,
                 seed=0, name='sequence_replay'):
        super().__init__(data_spec, capacity=capacity, period=period, num_envs=num_envs,
                         batch_size=batch_size, num_steps=num_steps, seed=seed, alpha=0.0,
                         name=name)

    def update_priorities(self, keys, priorities):
        """Uniform: priorities change nothing (the loop does not call this)."""
        del keys, priorities


@gin.configurable
class PrioritizedSequenceReplay(_SequenceRing):
    """Prioritized sequence replay: a sequence is drawn in proportion to (p + eps) ** alpha,
    with p the agent's sequence priority (R2D2: eta * max + (1 - eta) * mean |TD error|)."""

    capabilities = Capabilities(xla=True, sequences=True, priorities=True)

    def __init__(self, data_spec, *, capacity, period, num_envs=1, batch_size=1, num_steps=2,
                 seed=0, alpha=0.6, priority_epsilon=1e-6, name='prioritized_sequence_replay'):
        super().__init__(data_spec, capacity=capacity, period=period, num_envs=num_envs,
                         batch_size=batch_size, num_steps=num_steps, seed=seed, alpha=alpha,
                         priority_epsilon=priority_epsilon, name=name)
