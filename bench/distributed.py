"""Distributed SAC on Pendulum: env steps/s with 1 and 2 collectors against one process.

Same experiment everywhere (configs/sac_pendulum.gin: 4 env copies per
process, batch 256, 256x256 networks, 1 gradient step per env step); the
distributed runs use configs/sac_pendulum_distributed.gin, whose rate
limiter holds that replay ratio (256 samples per inserted transition), so
the collectors can go no faster than the learner trains: this measures the
whole system's env steps/s at equal learning work, not unthrottled
collection. No evaluator and no periodic eval in the timed runs.

Method as in the other sections: each system runs twice (budgets N1 < N2,
whole process, timed to exit) and its rate is Δ env steps / Δ wall time, so
start-up (four to five TF processes for the distributed runs), tracing, the
initial random collection and shutdown cancel out. Distributed runs need
several processes, so this section never pins to one core: every system
(the single process too) may use all CPUs of the machine.
"""

import json
import shutil
import tempfile

from bench import timing

SINGLE_CONFIG = 'configs/sac_pendulum.gin'
DISTRIBUTED_CONFIG = 'configs/sac_pendulum_distributed.gin'
COMMON = ['run.eval_interval=0', 'run.num_eval_episodes=1', 'run.checkpoint_interval=1000000',
          'run.best_policy_episodes=0', 'run.final_eval_episodes=0', 'run.final_video=False']
FULL_BUDGETS = (3_000, 9_000)
QUICK_BUDGETS = (1_500, 2_500)


def single_command(env_steps, root_dir):
    cmd = [timing.python(), 'train.py', f'--gin_file={SINGLE_CONFIG}', f'--root_dir={root_dir}',
           '--print_metrics', f'--gin_bindings=run.num_env_steps={env_steps}',
           '--gin_bindings=run.export_final_policy=False']
    return cmd + [f'--gin_bindings={b}' for b in COMMON]


def distributed_command(collectors):
    def build(env_steps, root_dir):
        cmd = [timing.python(), '-m', 'app.launch',
               f'--gin_file={DISTRIBUTED_CONFIG}', f'--collectors={collectors}', '--no_eval',
               '--quiet', f'--root_dir={root_dir}',
               f'--gin_bindings=run.num_env_steps={env_steps}']
        return cmd + [f'--gin_bindings={b}' for b in COMMON]
    return build


def _final_metrics(result):
    match = result.last_match(r'^final metrics: ')
    if match is None:
        raise timing.BenchError(f'{result.label}: no "final metrics:" line '
                                f'(log: {result.log_path})')
    return json.loads(match[1].split(':', 1)[1])


def parse_single(result, budget):
    metrics = _final_metrics(result)
    if metrics['env_steps'] < budget:
        raise timing.BenchError(f"{result.label}: stopped at {metrics['env_steps']} env steps")
    return metrics['env_steps'], metrics['train_steps']


def parse_distributed(result, budget):
    metrics = _final_metrics(result)
    replay, learner = metrics.get('replay') or {}, metrics.get('learner') or {}
    if metrics['interrupted'] or metrics['restarts'] or replay.get('inserted', 0) < budget:
        raise timing.BenchError(f'{result.label}: incomplete run {metrics}')
    return replay['inserted'], learner.get('train_steps', 0)


SYSTEMS = [
    ('one process, train.py', single_command, parse_single),
    ('distributed, 1 collector', distributed_command(1), parse_distributed),
    ('distributed, 2 collectors', distributed_command(2), parse_distributed),
]


def measure(name, build, parse, budgets, opts, scratch):
    runs, steps, grads = [], [], []
    for budget in budgets:
        root_dir = tempfile.mkdtemp(prefix='run-', dir=scratch)
        result = timing.timed_run(f'{name} N={budget:,}', build(budget, root_dir),
                                  cwd=timing.REPO_ROOT, log_dir=opts.log_dir)
        env_steps, grad_steps = parse(result, budget)
        shutil.rmtree(root_dir, ignore_errors=True)
        runs.append(result)
        steps.append(env_steps)
        grads.append(grad_steps)
    return timing.TwoBudgetRate(runs[0], runs[1], steps[0], steps[1]), grads


def section(opts):
    """Runs the three systems; returns the markdown section."""
    budgets = QUICK_BUDGETS if opts.quick else FULL_BUDGETS
    scratch = tempfile.mkdtemp(prefix='distributed-', dir=opts.scratch_dir)
    try:
        measured = [(name, build, *measure(name, build, parse, budgets, opts, scratch))
                    for name, build, parse in SYSTEMS]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return render(measured, budgets, opts)


def render(measured, budgets, opts):
    reference = measured[0][2].rate
    out = ['## Distributed SAC on Pendulum: env steps/s with 1 and 2 collectors', '',
           'SAC Pendulum-v1 (4 env copies per collector, batch 256, 256×256 networks, 1 '
           'gradient step per env step, held by the rate limiter in the distributed runs: '
           '256 samples per inserted transition). No evaluation in the timed runs. Every run '
           'may use all CPUs of this machine (distributed runs are several processes). '
           '**env steps/s = Δ env steps / Δ wall time** of two whole runs, so start-up and '
           'shutdown cancel out.', '']
    rows = []
    for name, _, rate, grads in measured:
        grad_rate = (grads[1] - grads[0]) / rate.delta_s if rate.delta_s > 0 else float('nan')
        rows.append([name, f'{rate.delta_steps:,}', f'{rate.delta_s:.1f}', f'{rate.rate:,.0f}',
                     f'{grad_rate:,.0f}', f'{rate.rate / reference:.2f}x'])
    out += [timing.markdown_table(
        ['system', 'Δ env steps', 'Δ seconds', 'env steps/s', 'gradient steps/s',
         'ratio vs one process'], rows), '']
    out += ['### Runs', '']
    rows = []
    for name, _, rate, grads in measured:
        for run, steps, grad, budget in zip((rate.small, rate.large),
                                            (rate.small_steps, rate.large_steps), grads, budgets):
            rows.append([name, f'{budget:,}', f'{steps:,}', f'{grad:,}', f'{run.wall_s:.1f}'])
    out += [timing.markdown_table(['system', 'budget', 'env steps', 'gradient steps', 'wall s'],
                                  rows), '',
            'Distributed env steps are the replay table\'s inserted transitions (collectors '
            'overshoot the budget by at most a chunk each).', '', '### Commands', '',
            'N2 runs shown; `ROOT` is a fresh temporary directory per run.', '', '```']
    for name, build, _, _ in measured:
        out += [f'# {name}', timing.shorten(build(budgets[1], 'ROOT'))]
    out += ['```', '']
    if opts.quick:
        out += ['**Quick mode: budgets shrunk to test the harness; these numbers are noisy and '
                'not a benchmark.**', '']
    return '\n'.join(out)
