"""What every recurrent agent shares: the recorded start state, the sequence mask, burn-in.

A recurrent agent acts with a state that its network carries from step to step
(reset to zero at each episode's FIRST step, which TF-Agents' recurrent networks
do themselves). It learns from stored sequences (buffers/sequence.py), which
raises the question R2D2 (Kapturowski et al., 2019) studied: which state should
the learner unroll a sampled sequence from? The choices here, each a binding:

- `initial_state='zero'`: a zero state, as TF-Agents' RNN examples do;
- `initial_state='stored'`: the state the collect policy had when it acted at the
  sequence's first step (recorded by `StateRecordingPolicy`, kept by the buffer);
- `burn_in_steps > 0` (with either): the first steps only warm the state up, with no
  loss and no gradient, so the trained steps start from a fresher state.
"""

import numpy as np
import tensorflow as tf
from tf_agents.policies import tf_policy
from tf_agents.trajectories import policy_step
from tf_agents.trajectories import time_step as ts

from core.errors import UserError

INITIAL_STATES = ('zero', 'stored')
# Defaults of the sequence settings every recurrent agent takes (they apply only with an
# `lstm_size`): 10 burn-in steps, 20 trained steps, a sequence every 10 steps.
SEQUENCE_DEFAULTS = dict(burn_in_steps=10, trace_length=20, sequence_period=10,
                         initial_state='stored', priority_eta=0.9)


def refuse_unless_recurrent(scope, settings, defaults):
    """Recurrent-only settings changed without `lstm_size` would do nothing: one line."""
    changed = [name for name, value in settings.items() if value != defaults[name]]
    if changed:
        raise UserError(f"{scope}.{', '.join(changed)} only apply to a recurrent agent: bind "
                        f"{scope}.lstm_size (e.g. (64,)) or remove them.")


def check_sequence_settings(scope, *, burn_in_steps, trace_length, sequence_period,
                            initial_state):
    """One-line errors for sequence settings that cannot work together."""
    for name, value, low in (('burn_in_steps', burn_in_steps, 0),
                             ('trace_length', trace_length, 1),
                             ('sequence_period', sequence_period, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise UserError(f"{scope}.{name} must be a whole number >= {low}, got {value!r}.")
    if sequence_period > trace_length:
        raise UserError(f"{scope}.sequence_period={sequence_period} is longer than "
                        f"trace_length={trace_length}: the steps between two trained traces "
                        "would never be trained on. Lower the period or lengthen the trace.")
    if initial_state not in INITIAL_STATES:
        raise UserError(f"{scope}.initial_state={initial_state!r}: choose 'zero' (unroll each "
                        "sequence from a zero state) or 'stored' (from the state the collect "
                        "policy had at its first step).")


def zero_where_first(state, step_type):
    """`state` with the rows of env copies at an episode's FIRST step set to zero: the
    state a recurrent network really starts such a step from (it resets there)."""
    first = tf.equal(step_type, ts.StepType.FIRST)

    def reset(value):
        mask = tf.reshape(first, [-1] + [1] * (value.shape.rank - 1))
        return tf.where(mask, tf.zeros_like(value), value)

    return tf.nest.map_structure(reset, state)


class StateRecordingPolicy(tf_policy.TFPolicy):
    """A stateful policy whose `info` is the state it acted from at each step.

    That is how the state reaches replay: the collected `Trajectory` carries it in
    `policy_info`, and sequence replay keeps it for the steps that start a sequence
    (buffers/sequence.py). The recorded state is the one the network really used:
    zero on an episode's FIRST step.
    """

    def __init__(self, policy):
        if not tf.nest.flatten(policy.policy_state_spec):
            raise ValueError(f"{type(policy).__name__} keeps no state to record")
        # The recorded state is a flat tuple: tf.data would turn a list (Keras' LSTM state)
        # into one stacked tensor when a learner batches the sampled sequences.
        super().__init__(policy.time_step_spec, policy.action_spec,
                         policy_state_spec=policy.policy_state_spec,
                         info_spec=tuple(tf.nest.flatten(policy.policy_state_spec)), clip=False,
                         name='state_recording_policy')
        self._policy = policy

    @property
    def wrapped(self):
        return self._policy

    def _variables(self):
        return self._policy.variables()

    def _action(self, time_step, policy_state, seed):
        step = self._policy.action(time_step, policy_state, seed)
        return step._replace(info=self._recorded(policy_state, time_step))

    def _distribution(self, time_step, policy_state):
        step = self._policy.distribution(time_step, policy_state)
        return policy_step.PolicyStep(step.action, step.state,
                                      self._recorded(policy_state, time_step))

    @staticmethod
    def _recorded(policy_state, time_step):
        return tuple(tf.nest.flatten(zero_where_first(policy_state, time_step.step_type)))


def sequence_mask(step_type):
    """float [B, L]: 1 for the steps of a sequence that are transitions of its first episode.

    A step is masked (0) once a later episode has started (a FIRST step after the
    first position), and on LAST boundary rows, which hold no transition (the
    action there is never executed). So a sequence never trains across an episode
    start: what follows its episode's end is padding the loss ignores.
    """
    first = tf.equal(step_type, ts.StepType.FIRST)
    later_first = tf.concat([tf.zeros_like(first[:, :1]), first[:, 1:]], axis=1)
    same_episode = tf.equal(tf.cumsum(tf.cast(later_first, tf.int32), axis=1), 0)
    transition = ~tf.equal(step_type, ts.StepType.LAST)
    return tf.cast(same_episode & transition, tf.float32)


def start_state(experience, network, initial_state):
    """The state a sampled sequence is unrolled from: stored (its `policy_info` at step 0)
    or zero."""
    if initial_state == 'zero':
        return network.get_initial_state(tf.shape(experience.step_type)[0])
    return tf.nest.pack_sequence_as(
        network.state_spec, [value[:, 0] for value in tf.nest.flatten(experience.policy_info)])


def burn_in(networks, experience, state, steps):
    """Unrolls each network over the first `steps` steps from `state`; no gradient flows back.

    Returns one state per network (the state after the burn-in), or `state` for each
    when `steps` is 0.
    """
    if not steps:
        return [state for _ in networks]
    observation = tf.nest.map_structure(lambda value: value[:, :steps], experience.observation)
    step_type = experience.step_type[:, :steps]
    states = []
    for network in networks:
        _, after = network(observation, step_type=step_type, network_state=state,
                           training=False)
        states.append(tf.nest.map_structure(tf.stop_gradient, after))
    return states


def after_burn_in(experience, steps):
    """The steps of each sequence after its burn-in."""
    return tf.nest.map_structure(lambda value: value[:, steps:], experience)


def stateful_actor(step, initial_state):
    """A numpy actor for a recurrent policy: it keeps the state of every env copy.

    Args:
      step: (batched numpy time step, state nest) -> (numpy actions, next state nest).
      initial_state: batch size -> the zero state nest (numpy).

    Returns:
      `act(time_step, rows=None)`: with `rows`, the time step holds only those copies
      (evaluation stops acting for copies whose episode has ended) and only their
      states move on. The network itself resets a copy's state at its FIRST step.
    """
    state = None

    def act(time_step, rows=None):
        nonlocal state
        count = np.asarray(time_step.step_type).shape[0]
        if rows is None:
            if state is None or tf.nest.flatten(state)[0].shape[0] != count:
                state = initial_state(count)
            actions, state = step(time_step, state)
            state = tf.nest.map_structure(np.array, state)
            return actions
        actions, moved = step(time_step, tf.nest.map_structure(lambda s: s[rows], state))
        for kept, new in zip(tf.nest.flatten(state), tf.nest.flatten(moved)):
            kept[rows] = np.asarray(new)
        return actions

    act.takes_rows = True
    return act
