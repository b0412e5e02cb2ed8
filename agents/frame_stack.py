"""Frame stacks for acting: the last k frames of each env copy, never across an episode start.

The environment yields one frame per step; a pixel agent's policy (and the
SavedModel it is exported as) takes the stack of the last k frames, oldest
first, as [H, W, k]. Two equivalent stackers feed it:

- `FrameStackingPolicy` (TF), around the collect policy inside the compiled
  collect loop; its ring is a plain variable, not checkpointed (a resumed run
  starts new episodes, which refill it);
- `stacking_actor` (numpy), around any numpy `act` (evaluation, the report,
  videos, evaluate.py on an exported policy).

At an episode's first step the ring is filled with that first frame, as
`buffers/frames.py` does for sampled windows, so the network sees the same
kind of stack when it acts as when it trains.
"""

import numpy as np
import tensorflow as tf
from tf_agents.policies import tf_policy


def frames_to_stack(policy_observation_shape, env_observation_shape):
    """k if a policy of `policy_observation_shape` needs stacks of env frames, else None."""
    policy_shape = tuple(policy_observation_shape)
    env_shape = tuple(env_observation_shape)
    if len(policy_shape) == len(env_shape) + 1 and policy_shape[:-1] == env_shape:
        return policy_shape[-1]
    return None


class FrameStackingPolicy(tf_policy.TFPolicy):
    """`policy` (of stacks [H, W, k]) as a policy of single frames [H, W]."""

    def __init__(self, policy, time_step_spec, ring=None):
        """Wraps `policy`; policies given the same `ring` (a `.ring` variable of another
        wrapper) share it, e.g. the random warm-up policy and the collect policy."""
        super().__init__(time_step_spec, policy.action_spec,
                         policy_state_spec=policy.policy_state_spec, info_spec=policy.info_spec,
                         clip=False, emit_log_probability=policy.emit_log_probability,
                         name=policy.name + '_frame_stacking')
        self._policy = policy
        stack_shape = policy.time_step_spec.observation.shape
        self._num_frames = int(stack_shape[-1])
        # [batch, H, W, k]; starts empty and takes the size of the batches it is given.
        self.ring = ring if ring is not None else tf.Variable(
            tf.zeros([0, *stack_shape], tf.uint8), trainable=False,
            shape=tf.TensorShape([None, *stack_shape]), name='frame_ring')

    @property
    def wrapped_policy(self):
        return self._policy

    def _variables(self):
        return self._policy.variables()

    def _stack(self, time_step):
        frame = time_step.observation[..., None]
        batch = tf.shape(frame)[0]
        # The ring as [batch, ...] (zeros the first time): no tf.cond on a variable's shape.
        padding = tf.zeros(tf.concat([[batch], tf.shape(self.ring)[1:]], 0), tf.uint8)
        ring = tf.concat([self.ring, padding], 0)[:batch]
        shifted = tf.concat([ring[..., 1:], frame], axis=-1)
        restarted = tf.tile(frame, [1, 1, 1, self._num_frames])
        stack = tf.where(time_step.is_first()[:, None, None, None], restarted, shifted)
        self.ring.assign(stack)
        return time_step._replace(observation=stack)

    def _action(self, time_step, policy_state, seed):
        return self._policy.action(self._stack(time_step), policy_state, seed)

    def _distribution(self, time_step, policy_state):
        # Advances the ring like `action`: call one of the two per env step, not both.
        return self._policy.distribution(self._stack(time_step), policy_state)


def stacking_actor(act, num_frames):
    """A numpy `act` of stacks [N, H, W, k] as one of single frames [N, H, W].

    The stacks live per env copy, so the returned actor takes `rows` (the copies the time
    step holds, in order; all of them when None) and evaluation can stop acting for copies
    whose episode has ended (`takes_rows`, experiment/evaluation.py).
    """
    ring = None

    def act_on_frames(time_step, rows=None):
        nonlocal ring
        frames = np.asarray(time_step.observation)
        first = np.asarray(time_step.step_type) == 0
        if rows is None:
            if ring is None or ring.shape[0] != frames.shape[0]:
                ring = np.repeat(frames[..., None], num_frames, axis=-1)
            rows = slice(None)
        stacks = np.concatenate([ring[rows][..., 1:], frames[..., None]], axis=-1)
        stacks[first] = frames[first][..., None]
        ring[rows] = stacks
        return act(time_step._replace(observation=stacks))

    act_on_frames.takes_rows = True
    return act_on_frames
