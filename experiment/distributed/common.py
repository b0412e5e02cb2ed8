"""What every role builds the same way: TF settings, the agent, table counters, summaries.

Each role builds its own copy of the agent from the one Gin config (the
replay server needs only its specs; collectors and the evaluator its policy;
the learner all of it), so the weights' layout agrees everywhere by
construction.
"""

import os
import time

import gin
import tensorflow as tf
from tf_agents.environments import tf_py_environment

from core import niceness, rundir
from core.tf_setup import configure_tf
from envs.suite import make_env
from experiment import staged_agent
from experiment.distributed import config
from experiment.distributed.config import REPLAY_TABLE
from experiment.replay import Mode, ServerLink, build_replay
from experiment.summaries import SummaryWriter

ROLE_DIRS = {'replay': 'replay', 'learn': 'learner', 'eval': 'eval'}


def role_name(role, index=0, shards=1):
    """A role's name (its directory and log): `collector_N`, and `replay_N` for the shards of a
    sharded run (`replay` when there is one)."""
    if role == 'collect':
        return f'collector_{index}'
    if role == 'replay' and shards > 1:
        return f'replay_{index}'
    return ROLE_DIRS[role]


def role_dir(root_dir, role, index=0, shards=1):
    return os.path.join(root_dir, role_name(role, index, shards))


def prepare_dir(directory, *, force):
    """Locks and creates a role's directory; refuses to resume it under a changed config.

    Returns the held `RunLock`: a second copy of the same role is refused.
    """
    _, lock = rundir.open_run(directory, gin.config_str(), force=force)
    return lock


def start_role(kind, root_dir, *, force, seed, collector_id=0, shard=0):
    """What every role does first: read and check the config, name itself, prepare its dir.

    Returns:
      (params, settings, role, directory): the run's `RunConfig`, the
      distributed `Settings`, the `Role` (log, stop flag) and its directory.
    """
    from experiment.distributed.waiting import Role

    params, settings = config.run_params(), config.settings()
    config.validate(settings, params)
    directory = role_dir(root_dir, kind, shard if kind == 'replay' else collector_id,
                         settings.replay_shards)
    role = Role(os.path.basename(directory), give_up_after_s=settings.give_up_after_s)
    role.lock = prepare_dir(directory, force=force)  # held for the role's lifetime
    if kind != 'learn':
        niceness.lower_priority(settings.other_roles_niceness)
    threads = settings.learner_tf_threads if kind == 'learn' else params.tf_threads
    configure_tf(seed + collector_id + shard, threads)
    return params, settings, role, directory


def build_agent(params, *, seed, env=None):
    """(agent, train_step, tf_env) for this config; `env` is made with `seed` if not given."""
    env = env if env is not None else make_env(seed=seed)
    tf_env = tf_py_environment.TFPyEnvironment(env)
    train_step = tf.Variable(0, dtype=tf.int64, name='train_step')
    # Collectors and the evaluator act with the statistics the learner publishes with the
    # weights; the learner updates them from the batches it samples (it does not collect).
    agent = staged_agent.build_agent(
        params.make_agent, params.preprocessing, tf_env.time_step_spec(), tf_env.action_spec(),
        train_step, num_envs=tf_env.batch_size, collects=False, frame_stack=params.frame_stack)
    return agent, train_step, tf_env


def remote_backend(mode, params, settings, agent, *, num_envs, address, seed):
    """The run's replay backend for a collector or the learner, at the replay server.

    The same `ReplayBackend` (layout, priorities, ids) a single-process Reverb run
    uses, from the one replay assembly; every wait is bounded by `settings.timeout_s`.
    """
    # A learner call's worth of windows requested ahead, shared by the shards it mixes (each
    # supplies about 1/K of them).
    in_flight = max(params.batch_size, settings.learner_steps_per_call * params.batch_size
                    // settings.replay_shards) if mode is Mode.LEARNER else None
    # With shards, a collector whose shard died moves to another once a write fails.
    flush_timeout = max(10.0, 3 * settings.timeout_s) \
        if mode is Mode.COLLECTOR and settings.replay_shards > 1 else None
    if settings.learner_holds_replay and mode is Mode.LEARNER:
        in_flight = config.windows_per_drain(settings, params)  # the next drain, ahead
    link = ServerLink(timeout_s=settings.timeout_s, address=address,
                      flush_every=settings.flush_every, samples_in_flight=in_flight,
                      flush_timeout_s=flush_timeout,
                      queue_length=settings.queue_length or None)
    return build_replay(mode, params, agent, num_envs=num_envs, seed=seed, link=link).backend


def replay_counters(info):
    """Counters of the replay table from a `server_info()` answer."""
    table = info[REPLAY_TABLE]
    limiter = table.rate_limiter_info
    return {
        'size': int(table.current_size),
        'inserted': int(limiter.insert_stats.completed),
        'sampled': int(limiter.sample_stats.completed),
        # Time the table worker held sample requests for want of inserts, and
        # insert requests for want of samples: the rate limiter's blocked time.
        'sample_blocked_ms': int(table.table_worker_time.waiting_for_inserts_ms),
        'insert_blocked_ms': int(table.table_worker_time.waiting_for_sampling_ms),
        'samples_per_insert': float(limiter.samples_per_insert),
        'max_diff': float(limiter.max_diff),
        'min_diff': float(limiter.min_diff),
        'min_size_to_sample': int(limiter.min_size_to_sample),
    }


def limiter_state(counters):
    """One phrase saying which side the rate limiter holds back now, and why."""
    diff = counters['inserted'] * counters['samples_per_insert'] - counters['sampled']
    where = (f"table {counters['size']:,} windows, {counters['inserted']:,} inserted, "
             f"{counters['sampled']:,} sampled")
    if counters['size'] < counters['min_size_to_sample']:
        return f"sampling waits for min_size_to_sample={counters['min_size_to_sample']:,}; {where}"
    if diff + counters['samples_per_insert'] > counters['max_diff']:
        return f"rate limiter blocks inserts until the learner samples; {where}"
    if diff - 1 < counters['min_diff']:
        return f"rate limiter blocks sampling until collectors insert; {where}"
    return f"rate limiter blocks neither side; {where}"


class RateSummaries:
    """TensorBoard scalars and per-second rates of growing counters, flushed at once.

    Distributed roles have no training checkpoint to align summaries with, so
    each write goes straight to disk.
    """

    def __init__(self, directory):
        self._writer = SummaryWriter(directory)
        self._last = {}
        self._last_time = None

    def write(self, step, scalars, counters=None, kinds=None):
        """Writes `scalars`, and `<tag>_per_sec` for each counter since the previous call.

        `kinds` ({tag: (kind, value)}) adds histograms too (the preprocessing statistics).
        """
        now = time.monotonic()
        values = dict(scalars)
        counters = counters or {}
        if self._last_time is not None and now > self._last_time:
            for tag, value in counters.items():
                if tag in self._last:
                    values[f'{tag}_per_sec'] = (value - self._last[tag]) / (now - self._last_time)
        if counters:
            self._last, self._last_time = dict(counters), now
        values.update(counters)
        self._writer.scalars(values, step)
        self._writer.kinds(kinds or {}, step)
        self._writer.flush()
        return values

    def close(self):
        self._writer.close()
