"""What the preprocessing stage costs: DQN CartPole (configs/dqn_cartpole.gin) with and without it.

The stage's per-step work is a statistics update per collected batch (an
observer of the compiled collect loop), the transform inside the collect
policy, and the transform of every sampled batch inside the train chunk.
Each variant's rate comes from the two-budget method (bench/harness.py); the
variants alternate over several rounds so a slow minute of the machine hits
both. Without the stage nothing is added to any graph
(experiment/staged_agent.py returns the agent itself), so "off" is the
application as it was.
"""

import statistics

from bench import harness, timing

CONFIG = 'configs/dqn_cartpole.gin'
COMMON = harness.NO_EXTRA_WORK + ['run.export_final_policy=False']
STAGE = ('run.preprocessing=[@preprocess.ObservationNormalization(), '
         '@preprocess.RewardScaling()]')
VARIANTS = [('stage off (run.preprocessing = [])', []),
            ('stage on (ObservationNormalization + RewardScaling)', [STAGE])]
FULL = {'budgets': (5_000, 45_000), 'rounds': 3}
QUICK = {'budgets': (2_000, 6_000), 'rounds': 1}
LIMIT = 0.05  # the bar: <= 5% of env steps/s


def section(opts):
    plan = QUICK if opts.quick else FULL
    systems = [harness.train_system(name, CONFIG, COMMON + extra, uses_xla=True)
               for name, extra in VARIANTS]
    rates = {name: [] for name, _ in VARIANTS}
    for _ in range(plan['rounds']):
        for item in harness.measure(systems, plan['budgets'], opts, 'preprocessing-'):
            rates[item.system.name].append(item.rate.rate)
    return render(rates, plan, opts)


def render(rates, plan, opts):
    (off_name, _), (on_name, on_extra) = VARIANTS
    off, on = statistics.median(rates[off_name]), statistics.median(rates[on_name])
    cost = 1.0 - on / off
    out = ['## The preprocessing stage: cost on DQN CartPole', '',
           f'`{CONFIG}` as shipped (0.5 gradient steps per env step, XLA on), with the stage off '
           f'and on; {plan["rounds"]} round(s) alternating the two, each rate Δ env steps / Δ '
           f'wall time between budgets {plan["budgets"][0]:,} and {plan["budgets"][1]:,}; '
           f'every run {timing.describe_pinning(opts.cpus)}.', '']
    rows = [[name, ', '.join(f'{r:,.0f}' for r in rates[name]),
             f'{statistics.median(rates[name]):,.0f}'] for name, _ in VARIANTS]
    out += [timing.markdown_table(['variant', 'env steps/s per round', 'median'], rows), '']
    verdict = 'PASS' if cost <= LIMIT else 'FAIL'
    out += [f'**Cost of the stage: {cost:+.1%} of env steps/s** (median on / median off = '
            f'{on / off:.3f}; requirement ≤ {LIMIT:.0%}: {verdict}). Off adds nothing to any '
            'graph: `staged_agent.build_agent` returns the bare agent.', '',
            'Stage binding: `' + on_extra[0].replace('run.preprocessing=', 'run.preprocessing = ')
            + '`', '']
    if opts.quick:
        out += ['**Quick mode: budgets shrunk to test the harness; not a benchmark.**', '']
    return '\n'.join(out)
