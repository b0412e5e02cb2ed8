"""Greedy evaluation over N episodes run side by side, and the evaluation report.

Each of the N batched eval env copies plays exactly one episode per
evaluation, so one evaluation is a handful of batched policy calls rather than
N * episode_length Python-level steps. `play_episodes` is the one episode
loop: periodic evaluation, the best policy's confirmation, the end-of-run
report and evaluate.py all use it.
"""

import json
import os

import numpy as np
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from agents import frame_stack, recurrent
from core.errors import UserError
from experiment import eval_report


def play_episodes(env, act, *, seed=None):
    """Plays one episode in each copy of a batched py env; returns (returns, lengths).

    Copies whose episode has ended are no longer stepped nor acted for when the env can
    step a subset of its copies (`step_copies`) and `act` can act for one (`takes_rows`):
    a slow tail (one stalled game among 100) then costs one copy per step. Results do not
    depend on it: each copy sees the same time steps and actions either way.

    Args:
      env: a batched py environment (`BatchedGymnasiumEnvironment`).
      act: time step (numpy, batched) -> actions (numpy).
      seed: if given, copy i is reseeded with seed + i first, so the same seed
        replays the same start states (what makes two policies comparable).
    """
    if seed is not None:
        for index, copy in enumerate(env.envs):
            copy.seed(seed + index)
    time_step = env.reset()
    num = env.batch_size
    returns = np.zeros(num, np.float64)
    lengths = np.zeros(num, np.int64)
    done = np.zeros(num, bool)
    subsets = takes_rows(act) and hasattr(env, 'step_copies')
    while not done.all():
        if subsets and done.any():
            rows = np.flatnonzero(~done)
            acting = tf.nest.map_structure(lambda leaf: np.asarray(leaf)[rows], time_step)
            time_step = env.step_copies(rows, act(acting, rows=rows))
        else:
            time_step = env.step(act(time_step))
        active = ~done
        returns += np.where(active, time_step.reward, 0.0)
        lengths += active
        done |= time_step.is_last()
    return returns, lengths


def takes_rows(act):
    """Whether `act(time_step, rows=indices)` acts for just those env copies.

    Actors that keep state per env copy (frame stacks, the epsilon stream) say so with
    a `takes_rows` attribute; stateless ones get it from `_stateless`.
    """
    return bool(getattr(act, 'takes_rows', False))


def _stateless(act):
    """`act` as an actor that takes `rows`: it keeps no per-copy state, so rows change nothing."""
    def act_on(time_step, rows=None):
        del rows
        return act(time_step)

    act_on.takes_rows = True
    return act_on


def greedy_actor(policy, env_observation_spec=None):
    """A compiled numpy-in numpy-out `act` for an in-process TF-Agents policy.

    A policy of frame stacks [H, W, k] played on an env of frames [H, W]
    (`env_observation_spec`) gets the stacks built per env copy.
    """
    batched_spec = tensor_spec.add_outer_dims_nest(policy.time_step_spec, (None,))
    if tf.nest.flatten(policy.policy_state_spec):
        return _recurrent_actor(policy, batched_spec)
    action = tf.function(lambda time_step: policy.action(time_step).action,
                         input_signature=[batched_spec])
    act = lambda time_step: action(  # noqa: E731
        tf.nest.map_structure(tf.convert_to_tensor, time_step)).numpy()
    num_frames = env_observation_spec is not None and frame_stack.frames_to_stack(
        policy.time_step_spec.observation.shape, env_observation_spec.shape)
    return frame_stack.stacking_actor(act, num_frames) if num_frames else _stateless(act)


def _recurrent_actor(policy, batched_spec):
    """A compiled numpy actor for a recurrent policy, its state kept per env copy."""
    state_spec = tensor_spec.add_outer_dims_nest(policy.policy_state_spec, (None,))
    action = tf.function(lambda time_step, state: policy.action(time_step, state),
                         input_signature=[batched_spec, state_spec])

    def step(time_step, state):
        result = action(tf.nest.map_structure(tf.convert_to_tensor, time_step),
                        tf.nest.map_structure(tf.convert_to_tensor, state))
        return result.action.numpy(), tf.nest.map_structure(lambda t: t.numpy(), result.state)

    def initial_state(count):
        return tf.nest.map_structure(lambda t: t.numpy(), policy.get_initial_state(count))

    return recurrent.stateful_actor(step, initial_state)


def saved_actor(policy_dir):
    """An exported policy (evaluate.py, the report, datasets) as a numpy `act`.

    A pixel policy reads frame stacks [H, W, k]; played on an env of single
    frames, its frames are stacked per env copy (agents/frame_stack.py).
    """
    from rlds_io.behaviour import load_saved_policy

    act = load_saved_policy(policy_dir)
    if act.initial_state is not None:
        # A recurrent policy; it reads what the env yields (no frame stacks with memory).
        return recurrent.stateful_actor(act, act.initial_state)
    if act.observation_shape is None:
        return _stateless(act)
    chosen = None

    def act_on(time_step, rows=None):
        nonlocal chosen
        if chosen is None:  # the first time step shows what the env yields
            num_frames = frame_stack.frames_to_stack(
                act.observation_shape, np.asarray(time_step.observation).shape[1:])
            chosen = (frame_stack.stacking_actor(act, num_frames) if num_frames
                      else _stateless(act))
        return chosen(time_step, rows=rows)

    act_on.takes_rows = True
    return act_on


def epsilon_actor(act, epsilon, action_spec, seed=0):
    """`act` that takes a uniformly random action with probability `epsilon` per env copy.

    Atari evaluation protocols act epsilon-greedily (Dopamine: 0.001) so that a greedy
    policy cannot stall a game forever (Breakout waits for FIRE until the 108k-frame cap).
    The random stream restarts from `seed` whenever every copy starts an episode (the
    start of `play_episodes`), so each play draws the same random numbers: candidates
    confirmed on the same episodes stay comparable, and a resumed run replays them.
    """
    if not epsilon:
        return act
    if not np.issubdtype(action_spec.dtype, np.integer) or action_spec.shape != ():
        raise UserError(f"An evaluation epsilon ({epsilon}) needs one discrete action per "
                        "step; this env's actions are not: set run.eval_epsilon=0.")
    low, high = int(action_spec.minimum), int(action_spec.maximum)
    rng = np.random.default_rng(seed)
    num_copies = None

    def act_epsilon_greedy(time_step, rows=None):
        nonlocal rng, num_copies
        if rows is None:
            num_copies = np.asarray(time_step.step_type).shape[0]
            if np.all(np.asarray(time_step.step_type) == ts.StepType.FIRST):
                rng = np.random.default_rng(seed)
        actions = np.asarray(act(time_step, rows=rows) if takes_rows(act) else act(time_step))
        # Draws for every copy, used for the listed ones: copy i gets the same numbers
        # whether or not the others are still playing.
        explore = rng.random(num_copies) < epsilon
        if explore.any():
            random_actions = rng.integers(low, high + 1, num_copies)
            if rows is not None:
                explore, random_actions = explore[rows], random_actions[rows]
            actions = np.where(explore, random_actions, actions).astype(actions.dtype)
        return actions

    act_epsilon_greedy.takes_rows = takes_rows(act)
    return act_epsilon_greedy


class Evaluator:
    """Plays one episode in each copy of a batched py environment (new episodes each call)."""

    def __init__(self, py_env, policy, epsilon=0.0, seed=0):
        self._env = py_env
        self._epsilon, self._seed = epsilon, seed
        self.act = self.explore(greedy_actor(policy, py_env.observation_spec()))

    def explore(self, act):
        """`act` with this evaluation's epsilon (e.g. the exported best policy in the report)."""
        return epsilon_actor(act, self._epsilon, self._env.action_spec(), self._seed)

    def __call__(self):
        """Returns (average return, average episode length) over the copies."""
        returns, lengths = play_episodes(self._env, self.act)
        return float(returns.mean()), float(lengths.mean())


def compare_policies(policy_dirs, *, env_id, episodes, seed, report_path=None,
                     video_dir=None, epsilon=0.0):
    """Plays every exported policy on the same seeded episodes (evaluate.py).

    Env copy i is seeded with seed + i for every policy, so differences are the
    policies', not the start states'. Prints one line per policy (mean ± std,
    95% bootstrap interval) and, for two or more, each one's paired
    difference with the first.

    Returns:
      {'env_id', 'policies': [report with 'policy'], 'differences': [...]}; also
      written as JSON to `report_path` when given.
    """
    from envs.suite import make_env
    from experiment.video import record_video

    reports = []
    env = make_env(env_id, num_envs=episodes, seed=seed)
    try:
        for index, policy_dir in enumerate(policy_dirs):
            act = epsilon_actor(saved_actor(policy_dir), epsilon, env.action_spec(), seed)
            returns, lengths = play_episodes(env, act, seed=seed)
            report = {'policy': policy_dir, **eval_report.summarize(returns, lengths, seed=seed)}
            reports.append(report)
            print(eval_report.summary_line(policy_dir, report), flush=True)
            if video_dir:
                path = record_video(act, os.path.join(video_dir, f'policy_{index}'), env_id=env_id,
                                    seed=seed)
                print(f"  video of its episode from seed {seed}: {path}", flush=True)
    finally:
        env.close()
    differences = []
    for report in reports[1:]:
        difference = eval_report.paired_difference(report['returns'], reports[0]['returns'])
        differences.append({'a': report['policy'], 'b': reports[0]['policy'], **difference})
        print(eval_report.difference_line(report['policy'], reports[0]['policy'], difference),
              flush=True)
    result = {'env_id': env_id, 'policies': reports, 'differences': differences}
    if report_path:
        os.makedirs(os.path.dirname(os.path.abspath(report_path)), exist_ok=True)
        with open(report_path, 'w') as f:
            json.dump(result, f, indent=1)
    return result
