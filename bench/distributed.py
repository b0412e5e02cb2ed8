"""Distributed SAC on Pendulum: env steps/s with 1 and 2 collectors against one process.

The distributed runs (configs/sac_pendulum_distributed.gin) hold configs/sac_pendulum.gin's
replay ratio with a rate limiter, so this measures the whole system at equal learning work,
not unthrottled collection. Two-budget method (bench/harness.py); several processes per run,
so every system may use all CPUs.
"""

from bench import harness, timing

SINGLE_CONFIG = 'configs/sac_pendulum.gin'
DISTRIBUTED_CONFIG = 'configs/sac_pendulum_distributed.gin'
COMMON = harness.NO_EXTRA_WORK + ['run.checkpoint_interval=1000000']
FULL_BUDGETS = (3_000, 9_000)
QUICK_BUDGETS = (1_500, 2_500)


def distributed_command(collectors):
    def build(env_steps, root_dir):
        cmd = [timing.python(), '-m', 'app.launch',
               f'--gin_file={DISTRIBUTED_CONFIG}', f'--collectors={collectors}', '--no_eval',
               '--quiet', f'--root_dir={root_dir}',
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


def systems():
    single = harness.train_system('one process, train.py', SINGLE_CONFIG,
                                  ['run.export_final_policy=False'] + COMMON, cpus='all')
    return [single] + [harness.System(f"distributed, {count} collector{'s' * (count > 1)}",
                                      distributed_command(count), parse_distributed, cpus='all')
                       for count in (1, 2)]


def section(opts):
    """Runs the three systems; returns the markdown section."""
    budgets = QUICK_BUDGETS if opts.quick else FULL_BUDGETS
    return render(harness.measure(systems(), budgets, opts, 'distributed-'), opts)


def render(measured, opts):
    reference = measured[0].rate.rate
    out = ['## Distributed SAC on Pendulum: env steps/s with 1 and 2 collectors', '',
           'SAC Pendulum-v1 (4 env copies per collector, batch 256, 256×256 networks, 1 '
           'gradient step per env step, held by the rate limiter in the distributed runs: '
           '256 samples per inserted transition). No evaluation in the timed runs. Every run '
           'may use all CPUs of this machine (distributed runs are several processes). '
           '**env steps/s = Δ env steps / Δ wall time** of two whole runs, so start-up and '
           'shutdown cancel out.', '']
    rows = []
    for item in measured:
        rate, grads = item.rate, item.grads
        grad_rate = (grads[1] - grads[0]) / rate.delta_s if rate.delta_s > 0 else float('nan')
        rows.append([item.system.name, f'{rate.delta_steps:,}', f'{rate.delta_s:.1f}',
                     f'{rate.rate:,.0f}', f'{grad_rate:,.0f}', f'{rate.rate / reference:.2f}x'])
    out += [timing.markdown_table(
        ['system', 'Δ env steps', 'Δ seconds', 'env steps/s', 'gradient steps/s',
         'ratio vs one process'], rows), '']
    out += harness.runs_section(
        measured, opts, 'Distributed env steps are the replay table\'s inserted transitions '
        '(collectors overshoot the budget by at most a chunk each).')
    if opts.quick:
        out += [harness.QUICK_NOTE, '']
    return '\n'.join(out)
