"""Greedy evaluation over N episodes run side by side.

Each of the N batched eval env copies plays exactly one episode per
evaluation, so one evaluation is a handful of batched policy calls rather than
N * episode_length Python-level steps.
"""

import numpy as np
import tensorflow as tf
from tf_agents.specs import tensor_spec


class Evaluator:
    """Plays one episode in each copy of a batched py environment."""

    def __init__(self, py_env, policy):
        self._env = py_env
        batched_spec = tensor_spec.add_outer_dims_nest(policy.time_step_spec, (None,))
        self._action = tf.function(
            lambda time_step: policy.action(time_step).action,
            input_signature=[batched_spec])

    def __call__(self):
        """Returns (average return, average episode length) over the copies."""
        time_step = self._env.reset()
        num = self._env.batch_size
        returns = np.zeros(num, np.float64)
        lengths = np.zeros(num, np.int64)
        done = np.zeros(num, bool)
        while not done.all():
            action = self._action(tf.nest.map_structure(tf.convert_to_tensor, time_step))
            time_step = self._env.step(action.numpy())
            active = ~done
            returns += np.where(active, time_step.reward, 0.0)
            lengths += active
            done |= time_step.is_last()
        return float(returns.mean()), float(lengths.mean())


def compare_policies(policy_dirs, *, env_id, episodes, seed):
    """Plays every exported policy on the same seeded episodes (evaluate.py).

    Env copy i is seeded with seed + i for every policy, so differences are the
    policies', not the start states'.

    Returns:
      [(policy_dir, mean return, std of returns)], in the order given.
    """
    from envs.suite import make_env
    from rlds_io.behaviour import load_saved_policy

    results = []
    for policy_dir in policy_dirs:
        act = load_saved_policy(policy_dir)
        env = make_env(env_id, num_envs=episodes, seed=seed)
        time_step = env.reset()
        returns = np.zeros(episodes)
        done = np.zeros(episodes, bool)
        while not done.all():
            time_step = env.step(act(time_step))
            returns += np.where(done, 0.0, time_step.reward)
            done |= time_step.is_last()
        env.close()
        results.append((policy_dir, float(returns.mean()), float(returns.std())))
        print(f"{policy_dir}: average return {returns.mean():.1f} ± {returns.std():.1f} "
              f"over {episodes} episodes (seed {seed})", flush=True)
    return results
