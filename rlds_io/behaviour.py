"""Behaviour policies that make datasets: random, a saved policy, a training snapshot.

All act on batched numpy time steps and return numpy actions, optionally
perturbed (Gaussian noise, or a uniform-random action with some probability)
so that a deterministic saved policy still yields a varied dataset.
"""

import glob
import json
import os

import numpy as np
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

from core.errors import UserError
from core.export import COLLECT_POLICY_DIR, SNAPSHOT_FILE

SNAPSHOT_POLICIES = ('greedy', 'collect')


class BehaviourPolicy:
    """Acts in a batched env: a base policy plus exploration noise, seeded."""

    def __init__(self, action_spec, base=None, *, random_action_probability=0.0,
                 action_noise_stddev=0.0, seed=0):
        if not 0.0 <= random_action_probability <= 1.0:
            raise UserError("make_dataset.random_action_probability must lie in [0, 1], got "
                            f"{random_action_probability}.")
        self._spec = action_spec
        self._dtype = np.dtype(action_spec.dtype)
        self._discrete = np.issubdtype(self._dtype, np.integer)
        self._base = base
        self._random_p = random_action_probability if base is not None else 1.0
        self._noise = action_noise_stddev
        self._rng = np.random.default_rng(seed)

    def _random(self, n):
        low, high = self._spec.minimum, self._spec.maximum
        shape = (n,) + tuple(self._spec.shape)
        if self._discrete:
            return self._rng.integers(low, high + 1, size=shape).astype(self._dtype)
        return self._rng.uniform(low, high, size=shape).astype(self._dtype)

    def __call__(self, time_step):
        n = np.asarray(time_step.step_type).shape[0]
        if self._base is None:
            return self._random(n)
        action = np.asarray(self._base(time_step))
        if self._noise and not self._discrete:
            span = np.asarray(self._spec.maximum - self._spec.minimum, np.float32)
            action = action + self._rng.normal(0.0, self._noise, action.shape) * span / 2
            action = np.clip(action, self._spec.minimum, self._spec.maximum)
        if self._random_p:
            swap = self._rng.random(n) < self._random_p
            action = np.where(swap.reshape((n,) + (1,) * (action.ndim - 1)),
                              self._random(n), action)
        return action.astype(self._dtype)


def load_saved_policy(policy_dir):
    """A SavedModel exported by train.py (root_dir/policy), as a numpy-in numpy-out callable.

    A recurrent policy's callable takes and returns its state too (`initial_state` set);
    wrap it with `agents.recurrent.stateful_actor` to act step by step.
    """
    if not os.path.isfile(os.path.join(policy_dir, 'saved_model.pb')):
        raise UserError(f"No saved policy at {policy_dir}: point at a run's policy/ directory "
                        "(written at the end of train.py) or a snapshot under policies/.")
    policy = tf.saved_model.load(policy_dir)
    observation_specs = [spec for name, spec in
                         policy.signatures['action'].structured_input_signature[1].items()
                         if name.endswith('observation')]

    def tensors(time_step):
        return ts.TimeStep(
            step_type=tf.constant(time_step.step_type, tf.int32),
            reward=tf.constant(time_step.reward, tf.float32),
            discount=tf.constant(time_step.discount, tf.float32),
            observation=tf.nest.map_structure(tf.constant, time_step.observation))

    def act(time_step):
        return policy.action(tensors(time_step), ()).action.numpy()

    def act_with_state(time_step, state):
        step = policy.action(tensors(time_step), tf.nest.map_structure(tf.constant, state))
        return step.action.numpy(), tf.nest.map_structure(lambda t: t.numpy(), step.state)

    def initial_state(count):
        return tf.nest.map_structure(lambda t: t.numpy(), policy.get_initial_state(count))

    recurrent = bool(tf.nest.flatten(policy.get_initial_state(1)))
    act = act_with_state if recurrent else act
    # A recurrent policy: (time step, state) -> (actions, state), from this zero state.
    act.initial_state = initial_state if recurrent else None
    # What the policy reads, for callers that must adapt what they feed it (frame stacks).
    act.observation_shape = (tuple(observation_specs[0].shape[1:])
                             if len(observation_specs) == 1 else None)
    return act


def find_snapshot(run_dir, target_return):
    """The policy snapshot of a training run whose eval return is closest to `target_return`.

    Snapshots are written by `run.policy_snapshot_interval`; each holds the
    greedy policy and the eval return it scored when it was taken.
    """
    found = []
    for path in glob.glob(os.path.join(run_dir, 'policies', 'step_*', SNAPSHOT_FILE)):
        with open(path) as f:
            found.append((json.load(f), os.path.dirname(path)))
    if not found:
        raise UserError(
            f"No policy snapshots under {run_dir}/policies: train that run with policy "
            "snapshots first (see docs/offline_rl.md).")
    info, path = min(found, key=lambda item: abs(item[0]['eval_return'] - target_return))
    return path, info


def snapshot_policy_dir(snapshot_dir, which):
    """The SavedModel directory of a snapshot's 'greedy' or 'collect' policy."""
    if which not in SNAPSHOT_POLICIES:
        raise UserError(f"make_dataset.behaviour_policy must be one of "
                        f"{', '.join(SNAPSHOT_POLICIES)}; got {which!r}.")
    if which == 'greedy':
        return snapshot_dir
    path = os.path.join(snapshot_dir, COLLECT_POLICY_DIR)
    if not os.path.isdir(path):
        raise UserError(f"The snapshot {snapshot_dir} holds no collect policy: train its run "
                        "with run.snapshot_collect_policy=True, or set "
                        "make_dataset.behaviour_policy='greedy'.")
    return path
