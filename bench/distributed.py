"""Distributed against one process, end to end: SAC Pendulum, DQN CartPole, DQN Pong, repeated.

Two sections: `distributed` (SAC Pendulum, DQN CartPole) and `distributed_pong` (DQN Pong on
LZ4 frames, whose runs take half an hour, so it can be re-measured on its own). For each
workload, on this machine's CPUs (every process may use all of them), systems at
equal learning work: one process as configured, one process with `run.overlap_collection`
(collection on a second thread and core), and the distributed launcher with 1 collector in
the workload's variants (`Variant`: the replay on the server, whose rate limiter holds the
single-process replay ratio, or held by the learner, which keeps that ratio itself; the
learner on 1 or 2 TF threads).
Every system runs the two-budget method (bench/harness.py) once; then the fastest one-process
and the fastest distributed system of that first round run again, taking turns (in reversed
order every other round, so that a drift of the machine touches both alike), until each has
the workload's `rounds`. A rate is the median of its runs, the spread the range of them. The
ratio is against the better one-process median ("the best single-process configuration"), and
its uncertainty a bootstrap interval over the two leaders' runs: the bar is met when the whole
interval clears it, so that the margin reported is larger than the noise it rests on.
"""

import dataclasses
import math
import random
import statistics
from typing import Optional

from bench import harness, timing

COMMON = harness.NO_EXTRA_WORK + ['run.checkpoint_interval=1000000']
OVERLAP = ['run.overlap_collection=True', 'run.tf_threads=2']
INTERVAL = 0.90  # the ratio's bootstrap interval
BOOTSTRAP_DRAWS = 2_000


@dataclasses.dataclass(frozen=True)
class Variant:
    """One distributed system: its collectors, the learner's TF threads (None: the run's),
    whether the learner holds the replay and the other roles' niceness (None: the config's;
    all `distributed.settings`)."""

    collectors: int = 1
    learner_threads: Optional[int] = None  # None: 1
    holds_replay: bool = False
    niceness: Optional[int] = None

    def label(self):
        return (f"distributed, {self.collectors} collector{'s' * (self.collectors > 1)}" +
                (', learner holds the replay' if self.holds_replay else '') +
                (f', learner_tf_threads={self.learner_threads}' if self.learner_threads
                 else '') +
                (f', other_roles_niceness={self.niceness}' if self.niceness is not None
                 else ''))

    def bindings(self):
        """Both settings bound, whatever the config says (a config may set either)."""
        return [f'distributed.settings.learner_tf_threads={self.learner_threads or 1}',
                f'distributed.settings.learner_holds_replay={self.holds_replay}'] + (
            [] if self.niceness is None else
            [f'distributed.settings.other_roles_niceness={self.niceness}'])


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    single_config: str
    distributed_config: str
    budgets: tuple
    quick_budgets: tuple
    bar: float  # distributed with 1 collector / the best one process, at least
    # The distributed systems: a second TF thread gives the learner a second core's worth
    # of intra-op parallelism for a convolutional or wide step.
    variants: tuple = (Variant(), Variant(holds_replay=True),
                       Variant(holds_replay=True, learner_threads=2))
    rounds: int = 6  # runs of the two leaders (the other systems run once)
    extra: tuple = ()  # bindings of this workload's runs, all systems alike


# SAC Pendulum: 12,000 env steps between the budgets (about 40 s); eight rounds of its leaders
# (about 3 minutes each) so that the ratio's interval is narrower than its few percent of
# margin. DQN CartPole's margin is wide: three rounds.
WORKLOADS = [
    Workload('SAC Pendulum', 'configs/sac_pendulum.gin', 'configs/sac_pendulum_distributed.gin',
             (3_000, 15_000), (1_500, 2_500), 0.95, rounds=8),
    Workload('DQN CartPole', 'configs/dqn_cartpole.gin', 'configs/dqn_cartpole.gin',
             (10_000, 40_000), (3_000, 6_000), 0.8, rounds=3),
]
# Pong: 20,000 random steps fill the replay first (the config's min_replay_history), so the
# budgets both lie past them; six rounds of its leaders (about 5 minutes each: with four, the
# ratio's interval was about as wide as its margin over the bar). Frames stay on the server (a
# learner holding the replay keeps vector observations only). Pong's learner sets the pace (the
# rate limiter holds the collector), hence the variant that nices the other roles.
PONG = [Workload('DQN Pong', 'configs/dqn_atari.gin', 'configs/dqn_atari.gin',
                 (22_000, 34_000), (20_500, 21_500), 0.95, rounds=6,
                 # the one final eval episode of the one-process runs, kept short
                 extra=('eval/atari_env.max_episode_frames=400',),
                 variants=(Variant(), Variant(learner_threads=2),
                           Variant(learner_threads=2, niceness=19)))]
ONE_PROCESS = ('one process', 'one process, overlap_collection')
ONE_COLLECTOR = 'distributed, 1 collector'


def distributed_command(config, variant, extra=()):
    def build(env_steps, root_dir):
        cmd = [timing.python(), '-m', 'app.launch', f'--gin_file={config}',
               f'--collectors={variant.collectors}', '--no_eval', '--quiet',
               f'--root_dir={root_dir}', f'--gin_bindings=run.num_env_steps={env_steps}']
        return cmd + [f'--gin_bindings={b}' for b in COMMON + harness.NO_PERIODIC_CHECKPOINTS +
                      list(extra) + variant.bindings()]
    return build


def parse_distributed(result, budget):
    """Env steps are the replay table's inserted transitions (collectors overshoot a little)."""
    metrics = harness.final_metrics(result)
    replay, learner = metrics.get('replay') or {}, metrics.get('learner') or {}
    if metrics['interrupted'] or metrics['restarts'] or replay.get('inserted', 0) < budget:
        raise timing.BenchError(f'{result.label}: incomplete run {metrics}')
    return replay['inserted'], learner.get('train_steps', 0)


def systems(workload):
    single = [harness.train_system(f'{workload.name}: {name}', workload.single_config,
                                   ['run.export_final_policy=False'] + COMMON + mode +
                                   list(workload.extra), cpus='all')
              for name, mode in zip(ONE_PROCESS, ([], OVERLAP))]
    return single + [harness.System(
        f'{workload.name}: {variant.label()}',
        distributed_command(workload.distributed_config, variant, workload.extra),
        parse_distributed, cpus='all')
        for variant in workload.variants]


def is_one_process(system):
    return system.name.split(': ')[1] in ONE_PROCESS


def measure(workload, opts):
    """[[Measured] per system]: every system once, then the first round's fastest one process
    and fastest distributed system in turns until each has `workload.rounds` runs."""
    budgets = workload.quick_budgets if opts.quick else workload.budgets
    every = systems(workload)
    first = harness.measure(every, budgets, opts, 'distributed-')
    runs = {item.system.name: [item] for item in first}
    leaders = [max((item for item in first if is_one_process(item.system) == one),
                   key=lambda item: item.rate.rate).system for one in (True, False)]
    for round_ in range(1, 1 if opts.quick else workload.rounds):
        for item in harness.measure(leaders[::-1] if round_ % 2 else leaders, budgets, opts,
                                    'distributed-'):
            runs[item.system.name].append(item)
    return [runs[system.name] for system in every]


def summary(runs):
    """{rates, median, low, high, grad_median} of one system's runs (env, gradient steps/s)."""
    rates = [item.rate.rate for item in runs]
    grads = [(item.grads[1] - item.grads[0]) / item.rate.delta_s for item in runs]
    return {'rates': rates, 'median': statistics.median(rates), 'low': min(rates),
            'high': max(rates), 'grad_median': statistics.median(grads)}


def ratio_interval(rates, best_rates, seed=0):
    """The INTERVAL bootstrap interval of median(rates) / median(best_rates), each system's runs
    resampled with replacement; None with fewer than 3 runs of either."""
    if min(len(rates), len(best_rates)) < 3:
        return None
    rng = random.Random(seed)
    draws = sorted(statistics.median(rng.choices(rates, k=len(rates))) /
                   statistics.median(rng.choices(best_rates, k=len(best_rates)))
                   for _ in range(BOOTSTRAP_DRAWS))
    tail = (1 - INTERVAL) / 2
    return draws[int(tail * BOOTSTRAP_DRAWS)], draws[int((1 - tail) * BOOTSTRAP_DRAWS) - 1]


def interval_text(interval):
    """'low–high×', rounded outwards to two decimals: an interval that reaches below a bar never
    prints as touching it (0.947 is '0.94', not '0.95')."""
    low = math.floor(round(interval[0] * 100, 6)) / 100  # round(): 0.57 * 100 is 56.99...
    high = math.ceil(round(interval[1] * 100, 6)) / 100
    return f'{low:.2f}–{high:.2f}×'


def verdict(ratio, interval, bar):
    """PASS when the ratio's interval clears the bar (the median alone with one run)."""
    if ratio < bar:
        return f'FAIL (≥ {bar:.2f}×)'
    if interval is None:
        return f'PASS (≥ {bar:.2f}×, one run)'
    if interval[0] >= bar:
        return f'PASS (≥ {bar:.2f}×)'
    return f'median only (≥ {bar:.2f}×; interval reaches below)'


def section(opts):
    return render([(workload, measure(workload, opts)) for workload in WORKLOADS], opts)


def section_pong(opts):
    return render([(workload, measure(workload, opts)) for workload in PONG], opts,
                  title='## Distributed against one process, end to end: DQN Pong (LZ4 frames)')


def render(results, opts, title='## Distributed against one process, end to end'):
    out = [title, '',
           'Every run may use all CPUs of this machine (distributed runs are several '
           'processes). No evaluation and no periodic checkpoints in the timed runs '
           '(every process writes its final one). **env steps/s = Δ env steps / Δ wall '
           'time** of two whole runs, so start-up and shutdown cancel out; the distributed '
           'runs hold the single-process replay ratio with the rate limiter (SAC Pendulum: 256 '
           'samples per inserted transition; DQN CartPole: 32; DQN Pong: 8). Every system ran '
           'once; then the fastest one process and the fastest distributed system of that '
           'round ran again, taking turns (reversed every other round so that a drift of the '
           'machine touches both alike). A rate is the median of its runs, "range" the lowest '
           'and highest. The ratio is the median against the better one-process median, '
           f'"{INTERVAL:.0%} interval" its bootstrap interval over the two systems\' runs '
           '(each resampled with replacement); a bar (the issue\'s) is met when the whole '
           'interval clears it, i.e. the margin is larger than the run-to-run noise it rests '
           'on.', '']
    rows, flat, first = [], [], []
    for workload, per_system in results:
        stats = [summary(runs) for runs in per_system]
        best = max((s for s, runs in zip(stats, per_system) if is_one_process(runs[0].system)),
                   key=lambda s: s['median'])
        for runs, s in zip(per_system, stats):
            kind = runs[0].system.name.split(': ')[1]
            ratio = s['median'] / best['median']
            interval = None if s is best else ratio_interval(s['rates'], best['rates'])
            spread = (s['high'] - s['low']) / 2 / s['median']
            rows.append([
                workload.name, kind, f'{len(runs)}', f"{s['median']:,.0f}",
                f"{s['low']:,.0f}–{s['high']:,.0f} (±{spread:.0%})" if len(runs) > 1 else '',
                f"{s['grad_median']:,.0f}", f'{ratio:.2f}×',
                interval_text(interval) if interval else '',
                verdict(ratio, interval, workload.bar)
                if kind.startswith(ONE_COLLECTOR) else ''])
            flat += runs
            first.append(runs[0])
    out += [timing.markdown_table(
        ['workload', 'system', 'runs', 'env steps/s', 'range', 'gradient steps/s',
         'ratio vs best one process', f'{INTERVAL:.0%} interval', 'bar'], rows, 'llrrrrrrl'),
        '']
    out += harness.runs_section(
        flat, opts, 'Distributed env steps are the replay table\'s inserted transitions '
        '(collectors overshoot the budget by at most a chunk each).', commands_of=first)
    if opts.quick:
        out += [harness.QUICK_NOTE, '']
    return '\n'.join(out)
