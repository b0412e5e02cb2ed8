"""Collecting a dataset with a behaviour policy, on the fly, and writing it as RLDS.

`make_dataset` is the Gin-configured entry point behind make_dataset.py:
`random` needs nothing, `expert` a run's exported policy, `medium` a training
snapshot at a chosen return. (`replay` datasets are recorded by a training run
itself: `run.record_dataset`.)
"""

import time

import gin
import numpy as np
from tf_agents.trajectories import trajectory as trajectory_lib

from core.errors import UserError
from envs.suite import make_env
from experiment.evaluation import saved_actor
from rlds_io import behaviour
from rlds_io.episodes import EpisodeRecorder, episode_transitions
from rlds_io.files import write_dataset

KINDS = ('random', 'expert', 'medium')


@gin.configurable(denylist=['output_dir', 'seed'])
def make_dataset(output_dir, seed=0, *, kind='random', policy_dir=None, run_dir=None,
                 target_return=None, behaviour_policy='greedy', num_steps=50_000,
                 random_action_probability=0.0, action_noise_stddev=0.0, verbose=True):
    """Plays a behaviour policy in `make_env`'s env until `num_steps` steps of whole episodes.

    Args:
      output_dir: where the TFDS dataset directory goes (must not exist).
      seed: seeds the envs and the behaviour noise.
      kind: 'random' (uniform actions), 'expert' (the saved policy at
        `policy_dir`) or 'medium' (the snapshot of `run_dir` whose eval return
        is closest to `target_return`).
      policy_dir: a SavedModel policy (a run's policy/ or policy_best/), for 'expert'.
      run_dir: a training run with policy snapshots, for 'medium'.
      target_return: the eval return the 'medium' snapshot should have.
      behaviour_policy: which of the 'medium' snapshot's policies plays:
        'greedy' (its mean action) or 'collect' (its own exploring policy, as
        D4RL's medium datasets are played by the stochastic SAC policy; the
        run must export it: run.snapshot_collect_policy=True).
      num_steps: RLDS steps to collect at least (whole episodes only).
      random_action_probability: chance per step of a uniform-random action.
      action_noise_stddev: Gaussian noise on continuous actions, as a fraction
        of half the action range.
      verbose: print what was collected.

    Returns:
      The dataset's metadata (counts, behaviour return), also in collection.json.
    """
    base, source = _base_policy(kind, policy_dir, run_dir, target_return, behaviour_policy)
    env = make_env(seed=seed)
    policy = behaviour.BehaviourPolicy(
        env.action_spec(), base, random_action_probability=random_action_probability,
        action_noise_stddev=action_noise_stddev, seed=seed)
    start = time.perf_counter()
    episodes = _collect(env, policy, num_steps)
    metadata = write_dataset(
        output_dir, episodes, observation_spec=env.observation_spec(),
        action_spec=env.action_spec(),
        metadata={'kind': kind, 'source': source, 'seed': seed,
                  'random_action_probability': random_action_probability,
                  'action_noise_stddev': action_noise_stddev,
                  'behaviour_policy': behaviour_policy if kind == 'medium' else None,
                  'env_id': gin.query_parameter('make_env.env_id')
                  if _bound('make_env.env_id') else None})
    env.close()
    if verbose:
        print(f"Wrote {output_dir}: {metadata['num_steps']:,} steps in "
              f"{metadata['num_episodes']:,} episodes, behaviour return "
              f"{metadata['average_return']:.1f} ± {metadata['std_return']:.1f} "
              f"({time.perf_counter() - start:.0f} s).", flush=True)
    return metadata


def _bound(name):
    try:
        gin.query_parameter(name)
        return True
    except ValueError:
        return False


def _base_policy(kind, policy_dir, run_dir, target_return, behaviour_policy):
    if kind != 'medium' and behaviour_policy != 'greedy':
        raise UserError(f"make_dataset.behaviour_policy={behaviour_policy!r} picks a 'medium' "
                        f"snapshot's policy, but make_dataset.kind is {kind!r}: drop the "
                        "binding, or set make_dataset.kind='medium'.")
    if kind == 'random':
        return None, 'uniform random actions'
    if kind == 'expert':
        if not policy_dir:
            raise UserError("make_dataset.kind='expert' needs make_dataset.policy_dir "
                            "(a run's policy/ directory).")
        return saved_actor(policy_dir), policy_dir
    if kind == 'medium':
        if not run_dir or target_return is None:
            raise UserError("make_dataset.kind='medium' needs make_dataset.run_dir (a run with "
                            "policy snapshots) and make_dataset.target_return.")
        path, info = behaviour.find_snapshot(run_dir, target_return)
        return (saved_actor(behaviour.snapshot_policy_dir(path, behaviour_policy)),
                f"{path} (eval return {info['eval_return']:.1f})")
    raise UserError(f"make_dataset.kind must be one of {', '.join(KINDS)}; got {kind!r} "
                    "(a 'replay' dataset is recorded by train.py: run.record_dataset=True).")


def _collect(env, policy, num_steps):
    """Whole episodes totalling at least `num_steps` steps."""
    recorder = EpisodeRecorder(env.batch_size)
    episodes, steps = [], 0
    time_step = env.reset()
    while steps < num_steps:
        action = policy(time_step)
        next_time_step = env.step(action)
        recorder.add(trajectory_lib.Trajectory(
            step_type=time_step.step_type, observation=time_step.observation,
            action=action, policy_info=(), next_step_type=next_time_step.step_type,
            reward=np.asarray(next_time_step.reward, np.float32),
            discount=np.asarray(next_time_step.discount, np.float32)))
        time_step = next_time_step
        for episode in recorder.pop_complete():
            episodes.append(episode)
            steps += episode_transitions(episode)
    return episodes
