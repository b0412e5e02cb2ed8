"""Gin-configurable factory for batched Gymnasium environments.

Training code always sees a batched `PyEnvironment` (batch_size == num_envs,
even for one copy), so it never has to special-case unbatched time steps.
"""

import difflib
import functools
import re

import gin
import gymnasium
from gymnasium import error as gym_error
from tf_agents.environments import parallel_py_environment
from tf_agents.system import system_multiprocessing

from core.checks import check
from core.errors import UserError
from envs import atari
from envs.batched import BatchedGymnasiumEnvironment
from envs.gymnasium_env import GymnasiumEnvironment
from envs.partial import HiddenObservations


@gin.configurable
def make_env(env_id='CartPole-v1', num_envs=1, parallel=False, seed=0,
             max_episode_steps=None, float32_observations=True,
             env_kwargs=None, hidden_observations=()):
    """Makes `num_envs` seeded copies of a Gymnasium env as one batched env.

    With `parallel=True` each copy runs in its own subprocess through
    TF-Agents' `ParallelPyEnvironment`. TF-Agents refuses to start processes
    until its multiprocessing module is initialised (normally by wrapping
    `main` in `tf_agents.system.multiprocessing.handle_main`); if nothing has
    done so, this function calls `enable_interactive_mode()`, so plain
    scripts and pytest work as they are. Processes are started with the
    platform's default method: `fork` on Linux needs nothing more, while
    `spawn` (macOS, Windows) re-imports the main module in every child, so
    there the call must sit under `if __name__ == '__main__':`. Close the
    returned env to stop its processes (they are also stopped at exit).

    Args:
      env_id: A registered Gymnasium id, e.g. 'CartPole-v1'.
      num_envs: Number of copies, at least 1.
      parallel: Whether to step copies in subprocesses instead of in turn.
      seed: Copy i is seeded with `seed + i`, so copies see different
        episodes yet a run is reproducible. None leaves them unseeded.
      max_episode_steps: Overrides the registered time limit when not None.
      float32_observations: Whether float64 observations become float32.
      env_kwargs: Extra keyword arguments for the env's constructor.
      hidden_observations: indices of observation entries to hide (envs/partial.py),
        e.g. (1, 3) for CartPole without its velocities: a partially observed task.

    Returns:
      A batched `PyEnvironment` with `batch_size == num_envs`.

    Raises:
      UserError: On a bad `num_envs`, an unknown id, or an env that cannot
        be made as configured. The message is one line, but Gin appends
        "In call to configurable" lines to anything raised in a configurable,
        so printers should show only the first line.
    """
    _check_values(locals())
    constructors = [
        functools.partial(
            _make_one, env_id,
            seed=None if seed is None else seed + index,
            max_episode_steps=max_episode_steps,
            float32_observations=float32_observations,
            env_kwargs=env_kwargs, hidden_observations=tuple(hidden_observations or ()))
        for index in range(num_envs)
    ]
    if parallel:
        return _make_parallel(constructors, env_id, max_episode_steps,
                              env_kwargs, hidden_observations)
    return BatchedGymnasiumEnvironment([construct() for construct in constructors])


def _check_values(values):
    """Rejects values that would silently make an empty or odd batch, or no time limit."""
    check('make_env', values, positive=('num_envs',), optional_positive=('max_episode_steps',),
          flags=('parallel', 'float32_observations'))
    if values['seed'] is not None and (isinstance(values['seed'], bool)
                                       or not isinstance(values['seed'], int)):
        raise UserError(f"make_env.seed must be None or a whole number, got "
                        f"{values['seed']!r}: fix the binding.")


def _make_one(env_id, *, seed, max_episode_steps, float32_observations,
              env_kwargs, hidden_observations=()):
    """Makes one wrapped copy; module-level so subprocesses can unpickle it."""
    return GymnasiumEnvironment(
        _make_gym_env(env_id, max_episode_steps, env_kwargs, hidden_observations),
        float32_observations=float32_observations, seed=seed)


def _make_parallel(constructors, env_id, max_episode_steps, env_kwargs, hidden_observations):
    """Runs each constructor in its own subprocess.

    A failure inside a TF-Agents worker surfaces only as an AssertionError
    carrying the child's stack trace, so one throwaway copy is made here
    first: configuration mistakes then raise our one-line `UserError`.
    """
    _make_gym_env(env_id, max_episode_steps, env_kwargs, hidden_observations).close()
    _ensure_multiprocessing_initialized()
    return parallel_py_environment.ParallelPyEnvironment(
        constructors, start_serially=False)


def _ensure_multiprocessing_initialized():
    """Lets TF-Agents start processes even without `handle_main`."""
    try:
        system_multiprocessing.enable_interactive_mode()
    except ValueError:
        pass  # Already initialised, by handle_main or an earlier call.


def _make_gym_env(env_id, max_episode_steps, env_kwargs, hidden_observations=()):
    """Calls `gymnasium.make`, turning its errors into one-line UserErrors.

    Gymnasium's messages are multi-line or miss the fix (its suggestions
    only cover the name part of the id), and `train.py` prints UserErrors
    as a single line, so the message is rebuilt here.
    """
    try:
        if atari.is_atari(env_id):
            if max_episode_steps is not None:
                raise UserError("make_env.max_episode_steps does not apply to Atari games: "
                                "bind atari_env.max_episode_frames (emulator frames) instead.")
            env = atari.atari_env(env_id, env_kwargs=env_kwargs)
        else:
            env = gymnasium.make(
                env_id, max_episode_steps=max_episode_steps,
                **(env_kwargs or {}))
    except ModuleNotFoundError:
        module = str(env_id).split(':')[0]
        raise UserError(f"Environment id {env_id!r} names module {module!r}, which cannot be "
                        "imported: install the package that registers it, or fix the "
                        "module part of the id ('module:EnvId').") from None
    except gym_error.UnregisteredEnv:
        raise UserError(_unknown_id_message(
            f'Unknown environment id {env_id!r}.', env_id)) from None
    except gym_error.DeprecatedEnv:
        raise UserError(_unknown_id_message(
            f'Environment id {env_id!r} is deprecated.', env_id)) from None
    except gym_error.DependencyNotInstalled as err:
        raise UserError(
            f'Environment {env_id!r} needs a package that is not installed: '
            f'{_one_line(err)}') from None
    except gym_error.Error as err:
        raise UserError(
            f'Cannot make environment {env_id!r}: {_one_line(err)} '
            'Registered ids are listed by gymnasium.pprint_registry().'
        ) from None
    return HiddenObservations(env, hidden_observations) if hidden_observations else env


def _unknown_id_message(problem, env_id):
    """Appends the closest registered ids, so typos are a glance to fix."""
    matches = difflib.get_close_matches(
        str(env_id), list(gymnasium.envs.registry.keys()), n=3)
    suggestion = f' Did you mean: {", ".join(matches)}?' if matches else ''
    return (f'{problem}{suggestion} Registered ids are listed by '
            'gymnasium.pprint_registry().')


def _one_line(err):
    """Collapses an exception message onto one line."""
    return re.sub(r'\s+', ' ', str(err)).strip()
