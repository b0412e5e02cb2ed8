"""Distributed against one process, end to end: SAC Pendulum and DQN CartPole, repeated.

For each workload, on this machine's CPUs (every process may use all of them), four systems
at equal learning work: one process as configured, one process with
`run.overlap_collection` (collection on a second thread and core), and the distributed
launcher with 1 and 2 collectors, whose rate limiter holds the single-process replay ratio.
Each system runs the two-budget method (bench/harness.py) `REPEATS` times, the systems taking
turns within each repeat so that a drift of the machine touches all of them alike; a rate is
the median of its repeats, the spread the range of them. The ratio is against the better of
the two one-process systems ("the best single-process configuration").
"""

import dataclasses
import statistics

from bench import harness, timing

COMMON = harness.NO_EXTRA_WORK + ['run.checkpoint_interval=1000000']
OVERLAP = ['run.overlap_collection=True', 'run.tf_threads=2']
REPEATS = 3


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    single_config: str
    distributed_config: str
    budgets: tuple
    quick_budgets: tuple
    bar: float  # distributed with 1 collector / the best one process, at least


WORKLOADS = [
    Workload('SAC Pendulum', 'configs/sac_pendulum.gin', 'configs/sac_pendulum_distributed.gin',
             (3_000, 9_000), (1_500, 2_500), 0.95),
    Workload('DQN CartPole', 'configs/dqn_cartpole.gin', 'configs/dqn_cartpole.gin',
             (10_000, 40_000), (3_000, 6_000), 0.8),
]
ONE_PROCESS = ('one process', 'one process, overlap_collection')
ONE_COLLECTOR = 'distributed, 1 collector'


def distributed_command(config, collectors):
    def build(env_steps, root_dir):
        cmd = [timing.python(), '-m', 'app.launch', f'--gin_file={config}',
               f'--collectors={collectors}', '--no_eval', '--quiet', f'--root_dir={root_dir}',
               f'--gin_bindings=run.num_env_steps={env_steps}']
        return cmd + [f'--gin_bindings={b}' for b in COMMON]
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
                                   ['run.export_final_policy=False'] + COMMON + extra,
                                   cpus='all')
              for name, extra in zip(ONE_PROCESS, ([], OVERLAP))]
    return single + [harness.System(
        f"{workload.name}: distributed, {count} collector{'s' * (count > 1)}",
        distributed_command(workload.distributed_config, count), parse_distributed, cpus='all')
        for count in (1, 2)]


def measure(workload, opts):
    """[[Measured] per system, one per repeat]."""
    budgets = workload.quick_budgets if opts.quick else workload.budgets
    repeats = [harness.measure(systems(workload), budgets, opts, 'distributed-')
               for _ in range(1 if opts.quick else REPEATS)]
    return [list(runs) for runs in zip(*repeats)]


def summary(runs):
    """{median, low, high, grad_median} of one system's repeats (env and gradient steps/s)."""
    rates = [item.rate.rate for item in runs]
    grads = [(item.grads[1] - item.grads[0]) / item.rate.delta_s for item in runs]
    return {'median': statistics.median(rates), 'low': min(rates), 'high': max(rates),
            'grad_median': statistics.median(grads)}


def section(opts):
    return render([(workload, measure(workload, opts)) for workload in WORKLOADS], opts)


def render(results, opts):
    out = ['## Distributed against one process, end to end', '',
           'Every run may use all CPUs of this machine (distributed runs are several '
           'processes). No evaluation in the timed runs. **env steps/s = Δ env steps / Δ wall '
           'time** of two whole runs, so start-up and shutdown cancel out; the distributed '
           'runs hold the single-process replay ratio with the rate limiter (SAC Pendulum: 256 '
           'samples per inserted transition; DQN CartPole: 32). '
           f'Each system measured {1 if opts.quick else REPEATS} time(s), the systems taking '
           'turns; the rate is the median, "range" the lowest and highest. The ratio is the '
           'median against the better one-process median; the bar is the issue\'s.', '']
    rows, flat, first = [], [], []
    for workload, per_system in results:
        stats = [summary(runs) for runs in per_system]
        best = max(s['median'] for s, runs in zip(stats, per_system)
                   if runs[0].system.name.split(': ')[1] in ONE_PROCESS)
        for runs, s in zip(per_system, stats):
            kind = runs[0].system.name.split(': ')[1]
            verdict = ''
            if kind == ONE_COLLECTOR:
                verdict = ('PASS' if s['median'] / best >= workload.bar else 'FAIL') + \
                    f' (≥ {workload.bar:.2f}×)'
            spread = (s['high'] - s['low']) / 2 / s['median']
            rows.append([workload.name, kind, f"{s['median']:,.0f}",
                         f"{s['low']:,.0f}–{s['high']:,.0f} (±{spread:.0%})",
                         f"{s['grad_median']:,.0f}", f"{s['median'] / best:.2f}×", verdict])
            flat += runs
            first.append(runs[0])
    out += [timing.markdown_table(
        ['workload', 'system', 'env steps/s', 'range', 'gradient steps/s',
         'ratio vs best one process', 'bar'], rows, 'llrrrrl'), '']
    out += harness.runs_section(
        flat, opts, 'Distributed env steps are the replay table\'s inserted transitions '
        '(collectors overshoot the budget by at most a chunk each).', commands_of=first)
    if opts.quick:
        out += [harness.QUICK_NOTE, '']
    return '\n'.join(out)
