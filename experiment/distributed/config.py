"""Settings of a distributed run, read from the same Gin config as a single-process run.

The experiment's own numbers (agent, batch size, replay capacity, step
budget, eval interval, replay ratio) stay bound to `run`, so a distributed
config is the single-process config plus a few `distributed.settings`
lines; every role reads the same `RunConfig` a single-process run does.

The rate limiter is validated here, before any process starts, because
Reverb accepts settings that deadlock: a table that never reaches its
minimum size blocks the learner forever, and an error buffer narrower than
one insert's worth of samples blocks collectors and learner at once.
"""

import dataclasses
import math
import sys

import gin

from core.checks import check
from core.errors import UserError
from experiment import config as config_lib
from experiment.replay import REPLAY_TABLE  # noqa: F401  (the roles' name for it)


@dataclasses.dataclass(frozen=True)
class Settings:
    """What `distributed.settings` binds; see `settings` for the meaning of each field."""

    samples_per_insert: float
    error_buffer: float
    min_size_to_sample: int
    weight_pull_interval: int
    learner_steps_per_call: int
    weight_push_interval: int
    learner_checkpoint_interval: int
    server_checkpoint_interval_s: float
    summary_interval_s: float
    timeout_s: float
    give_up_after_s: float
    flush_every: int
    replay_shards: int = 1
    learner_tf_threads: int = 1
    learner_holds_replay: bool = False
    other_roles_niceness: int = 0
    # With learner_holds_replay: windows the replay server's queue holds (see `settings`).
    queue_length: int = 0
    # Sequence tables (recurrent agents): collectors are never held, see `for_agent`.
    inserts_unbounded: bool = False

    def shard_min_size(self):
        """Windows each shard must hold before it is sampled: its share of the minimum."""
        return int(math.ceil(self.min_size_to_sample / self.replay_shards))


@gin.configurable(module='distributed')
def settings(samples_per_insert=None,
             error_buffer=None,
             min_size_to_sample=None,
             weight_pull_interval=64,
             learner_steps_per_call=None,
             weight_push_interval=None,
             learner_checkpoint_interval=5_000,
             server_checkpoint_interval_s=60.0,
             summary_interval_s=10.0,
             timeout_s=10.0,
             give_up_after_s=600.0,
             flush_every=16,
             replay_shards=1,
             learner_tf_threads=None,
             learner_holds_replay=False,
             other_roles_niceness=0):
    """The distributed run's own settings; None means derived from `run`'s bindings.

    Args:
      samples_per_insert: sampled windows per inserted window, the replay
        ratio the rate limiter enforces. None: `batch_size *
        train_steps_per_iteration / collect_steps_per_iteration`, the same
        ratio as the single-process run.
      error_buffer: how far (in samples) the learner may run ahead of or fall
        behind that ratio before the limiter blocks it or the collectors.
        None: two learner calls' worth of samples (and at least one insert's).
      min_size_to_sample: windows in the table before the learner may
        sample. None: `run.initial_collect_steps`.
      weight_pull_interval: env steps (per collector) between weight pulls.
      learner_steps_per_call: gradient steps per compiled learner call.
        None: `run.train_steps_per_iteration`.
      weight_push_interval: gradient steps between weight pushes. None:
        every learner call.
      learner_checkpoint_interval: gradient steps between learner checkpoints.
      server_checkpoint_interval_s: seconds between replay-server checkpoints.
      summary_interval_s: seconds between each role's TensorBoard summaries.
      timeout_s: the bound on every single call to another process.
      give_up_after_s: a role blocked or retrying this long exits with an
        error instead of waiting on.
      flush_every: windows a collector writes between flushes. Items the rate
        limiter holds count as pending, and Reverb's writer warns ("alarmingly
        high") from about 50 pending items on, so keep it well below that.
      replay_shards: replay servers the buffer is split over (docs/distributed.md,
        "Sharded replay"): each holds 1/K of the capacity, collectors write to one shard
        each (kept balanced, local first) and the learner samples all of them as one
        buffer. 1: one server.
      learner_tf_threads: TF intra/inter-op threads of the learner. None:
        `run.tf_threads`.
      learner_holds_replay: the learner keeps the replay in its own memory and samples it
        there, as one process does; the replay server is only a queue that carries each
        window from the collectors to the learner once (docs/distributed.md, "Where the
        replay lives"). The queue holds `error_buffer / samples_per_insert` windows (at
        least one learner call's and two flushes' worth, at most `run.replay_capacity`):
        collectors wait while it is full, and the learner takes in windows at the run's
        ratio. Vector observations, one server, feed-forward agents only.
      other_roles_niceness: the Unix niceness (0-19) of every role but the learner:
        replay servers, collectors, the evaluator. Where they share cores with the
        learner, whose gradient steps set the run's pace, each wake-up of theirs at
        niceness 0 preempts one of the learner's TF threads and stalls the op that thread
        shares; niced, they run in the learner's idle moments instead. On machines of
        their own it changes nothing. 0 (the default): the end-to-end benchmark does
        not separate its gain from the noise (docs/distributed.md, "Where the replay
        lives"); configs/sac_pendulum_distributed.gin sets 19.

    Returns:
      A `Settings`.
    """
    whole = (0, math.inf, 'closed')
    seconds = (0, math.inf, 'open')
    if not isinstance(other_roles_niceness, int) or isinstance(other_roles_niceness, bool) \
            or not 0 <= other_roles_niceness <= 19:
        raise UserError('distributed.settings.other_roles_niceness must be a whole '
                        f'number from 0 to 19 (a lower niceness needs root), got '
                        f'{other_roles_niceness!r}: fix the binding.')
    check('distributed.settings', locals(),
          positive=('weight_pull_interval', 'learner_checkpoint_interval', 'flush_every',
                    'replay_shards'),
          optional_positive=('learner_steps_per_call', 'weight_push_interval',
                             'learner_tf_threads'),
          flags=('learner_holds_replay',),
          optional_numbers={'samples_per_insert': whole, 'error_buffer': whole,
                            'min_size_to_sample': whole},
          numbers={'server_checkpoint_interval_s': seconds, 'summary_interval_s': seconds,
                   'timeout_s': seconds, 'give_up_after_s': seconds})
    params = run_params()
    batch_size = params.batch_size
    if samples_per_insert is None:
        samples_per_insert = batch_size * params.replay_ratio
    steps_per_call = learner_steps_per_call or params.train_steps_per_iteration
    if error_buffer is None:
        error_buffer = max(2.0 * steps_per_call * batch_size, 2.0 * samples_per_insert)
    queue_length = 0
    if learner_holds_replay:
        queue_length = min(params.replay_capacity, max(
            math.ceil(error_buffer / samples_per_insert),
            math.ceil(steps_per_call * batch_size / samples_per_insert), 2 * flush_every))
    return Settings(
        learner_holds_replay=bool(learner_holds_replay), queue_length=int(queue_length),
        other_roles_niceness=other_roles_niceness,
        samples_per_insert=float(samples_per_insert),
        error_buffer=float(error_buffer),
        min_size_to_sample=int(min_size_to_sample if min_size_to_sample is not None
                               else params.initial_collect_steps),
        weight_pull_interval=int(weight_pull_interval),
        learner_steps_per_call=int(steps_per_call),
        weight_push_interval=int(weight_push_interval or steps_per_call),
        learner_checkpoint_interval=int(learner_checkpoint_interval),
        server_checkpoint_interval_s=float(server_checkpoint_interval_s),
        summary_interval_s=float(summary_interval_s),
        timeout_s=float(timeout_s),
        give_up_after_s=float(give_up_after_s),
        flush_every=int(flush_every),
        replay_shards=int(replay_shards),
        learner_tf_threads=int(learner_tf_threads or params.tf_threads))


def run_params():
    """The run's `RunConfig` as Gin binds it: the object a single process reads too."""
    return config_lib.load(config_lib.RunConfig)


def max_train_steps(params):
    """The learner's gradient-step budget: the single-process run's, at its replay ratio."""
    collected = max(params.num_env_steps - params.initial_collect_steps, 0)
    return int(math.ceil(collected * params.replay_ratio))


def validate(config, params):
    """Refuses settings that would deadlock or wait forever, before anything starts.

    Args:
      config: the `Settings`.
      params: the run's `RunConfig`.

    Raises:
      UserError: naming the setting, why it cannot work, and what to set.
    """
    spi, buffer, min_size = config.samples_per_insert, config.error_buffer, \
        config.min_size_to_sample
    capacity = params.replay_capacity
    if not spi > 0:
        raise UserError(f"distributed.settings.samples_per_insert must be > 0, got {spi}.")
    if min_size < 1:
        raise UserError(
            f"distributed.settings.min_size_to_sample must be >= 1, got {min_size}: Reverb "
            "samples from an empty table only by blocking.")
    if buffer < max(1.0, spi):
        raise UserError(
            f"distributed.settings.error_buffer={buffer:g} is below samples_per_insert={spi:g}: "
            "Reverb would block collectors and learner at the same time (a deadlock); set it "
            f"to at least {max(1.0, spi):g} (a few learner calls' samples is better).")
    if min_size > capacity:
        raise UserError(
            f"distributed.settings.min_size_to_sample={min_size} exceeds run.replay_capacity="
            f"{capacity}: the table could never hold enough windows to start sampling, and the "
            "learner would wait forever. Lower it or raise the capacity.")
    if min_size >= params.num_env_steps:
        raise UserError(
            f"distributed.settings.min_size_to_sample={min_size} is not below "
            f"run.num_env_steps={params.num_env_steps}: the learner would never start.")
    if min_size < params.batch_size:
        raise UserError(
            f"distributed.settings.min_size_to_sample={min_size} is below run.batch_size="
            f"{params.batch_size}: the first batches would repeat a handful of windows.")
    shards = config.replay_shards
    if shards > 1:
        if capacity // shards < params.batch_size:
            raise UserError(
                f"run.replay_capacity={capacity} split over replay_shards={shards} leaves "
                f"{capacity // shards} windows per shard, fewer than run.batch_size="
                f"{params.batch_size}: raise the capacity or use fewer shards.")
    if config.learner_holds_replay and shards > 1:
        raise UserError(
            f"distributed.settings.learner_holds_replay keeps the replay on the learner, so "
            f"there is nothing to shard: set replay_shards=1 (it is {shards}), or let the "
            "servers hold the replay (learner_holds_replay=False).")
    if config.give_up_after_s < 3 * config.timeout_s:
        raise UserError(
            f"distributed.settings.give_up_after_s={config.give_up_after_s:g} leaves fewer than "
            f"three tries of timeout_s={config.timeout_s:g}: raise it.")


def for_agent(config, agent):
    """The settings as the replay table counts for this agent (call after `validate`).

    A recurrent agent's table holds sequences and the learner samples sequences, so the
    ratio and minimum size, given in transitions, become sequences: `samples_per_insert` x
    period, `min_size_to_sample` / period. A sequence starts every `sequence_period` steps
    of an episode and at each episode's start, so there is at least one per `period` env
    steps but often more (short episodes), and the ratio in sequences is an upper bound,
    not a rate: the learner is held to it (it cannot sample ahead of the run's ratio), the
    collectors are not (`inserts_unbounded`). Holding collectors at a ratio that
    overcounts what they insert would stop them before the learner's last step: measured,
    a tiny run stalled that way. Sequence replay is not sharded: more than one shard is
    refused in one line.
    """
    period = agent.sequence_period
    if not period:
        return config
    if config.replay_shards > 1:
        raise UserError(f"distributed.settings.replay_shards={config.replay_shards}: sequence "
                        "replay (recurrent agents) runs on one replay server; set "
                        "replay_shards=1.")
    samples_per_insert = config.samples_per_insert * period
    return dataclasses.replace(
        config, samples_per_insert=samples_per_insert,
        min_size_to_sample=max(1, int(math.ceil(config.min_size_to_sample / period))),
        error_buffer=max(config.error_buffer, 2.0 * samples_per_insert),
        inserts_unbounded=True)


def rate_limiter(config):
    """The replay table's limiter (call after `validate`).

    One server: Reverb's `SampleToInsertRatio` with the run's settings. A learner that
    holds the replay: a `Queue` of `queue_length` windows (the learner keeps the ratio).
    Replay shards: `MinSize` of each shard's share of `min_size_to_sample` only. A ratio per shard
    deadlocks across shards -- collectors held on the shards the learner samples little
    while the learner waits on one no collector writes to -- so with shards the run's
    ratio is kept over the whole buffer by the learner and the collectors themselves
    (`experiment.distributed.tier.RatioGate`), with the same bounds.
    """
    import reverb

    if config.learner_holds_replay:
        return reverb.rate_limiters.Queue(config.queue_length)
    if config.replay_shards > 1:
        return reverb.rate_limiters.MinSize(config.shard_min_size())
    if config.inserts_unbounded:
        # Reverb's SampleToInsertRatio bounds, without the upper one that holds inserts.
        offset = config.samples_per_insert * config.min_size_to_sample
        return reverb.rate_limiters.RateLimiter(
            samples_per_insert=config.samples_per_insert,
            min_size_to_sample=config.min_size_to_sample,
            min_diff=offset - config.error_buffer, max_diff=sys.float_info.max)
    return reverb.rate_limiters.SampleToInsertRatio(
        samples_per_insert=config.samples_per_insert,
        min_size_to_sample=config.min_size_to_sample,
        error_buffer=config.error_buffer)


MAX_AUTO_COLLECTORS = 8


def auto_collectors(cpus):
    """Collector processes for `--collectors=auto` on a machine with `cpus` CPUs.

    The learner gets a core and the replay server with the evaluator another; the rest
    collect, at least 1 and at most 8. Why not more: one learner core absorbs well under
    one collector's worth of env steps for every workload measured (docs/scaling.md, "The
    model"), and on this 2-core machine a second collector only competes with the learner
    for CPU (docs/benchmarks.md, "Distributed against one process": 1 collector ran faster
    than 2 for SAC Pendulum and DQN CartPole). A faster learner or a slower env wants
    `--collectors=N` from the scaling model's table.
    """
    return min(MAX_AUTO_COLLECTORS, max(1, cpus - 2))


def windows_per_drain(config, params):
    """A learner holding the replay takes windows from the queue this many at a time: one
    learner call's samples' worth at the run's ratio (at least 1)."""
    return max(1, math.ceil(config.learner_steps_per_call * params.batch_size
                            / config.samples_per_insert))
