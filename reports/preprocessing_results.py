"""The preprocessing stage's learning results, made from run directories.

    python -m reports.preprocessing_results --runs runs/bench14 [--runs runs/bench15] \\
        [--at_step Hopper-v5=300000]

Every subdirectory of a --runs directory that holds a training run (config.gin + tb/) is one
seed of one variant: the directory name without its `_s<N>` suffix is the variant; whether
the run normalised observations is read from its config.gin (`run.preprocessing`). Writes
docs/preprocessing_results.md: per run, the first env step whose periodic eval reached the
config's target return, the best periodic eval, the eval at --at_step for that env (where a
run is compared at a fixed budget), the end-of-run report of the best and the final policy
(100 seeded episodes) and wall time; per variant, how many seeds reached the target.
Every run it has seen is also kept in docs/data/preprocessing_runs.json (reports.run_archive),
so a run whose directory is gone stays in the table.
"""

import argparse
import os
import re

from core.quiet import quiet_startup
from reports import run_archive
from reports.learning_results import find_runs
from sweeps import curves

ARCHIVE = os.path.join('docs', 'data', 'preprocessing_runs.json')


def describe(run_dir, env_id, seed, at_steps):
    with open(os.path.join(run_dir, 'config.gin')) as f:
        config = f.read()
    stage = run_archive.binding(config, 'run.preprocessing') or '[]'
    target = run_archive.binding(config, 'run.target_return')
    target = None if target in (None, 'None') else float(target)
    curve = curves.read_scalar(run_dir)
    metrics = run_archive.metrics(run_dir)
    reached = next((step for step, value in curve if target is not None and value >= target),
                   None)
    at_step = at_steps.get(env_id)
    at_value = next((value for step, value in curve if at_step is not None and step >= at_step),
                    None)
    report = metrics.get('final_report', {})
    return {
        'variant': re.sub(r'_s\d+$', '', os.path.basename(run_dir)), 'env_id': env_id,
        'seed': seed, 'stage': stage, 'target': target, 'reached_at': reached,
        'best_eval': max((value for _, value in curve), default=None),
        'last_step': curve[-1][0] if curve else 0, 'reached': curve[-1][0] if curve else 0,
        'at_step': at_step, 'at_value': at_value, 'curve': curve,
        'final_report': report.get('final'), 'best_report': report.get('best'),
        'wall_time_s': metrics.get('wall_time_s'), 'finished': bool(metrics)
        and not metrics.get('interrupted'), 'env_steps_per_sec': metrics.get('env_steps_per_sec'),
    }


def run_key(row):
    return (row['variant'], row['env_id'], row['seed'])


def _fmt(value, digits=1):
    return '—' if value is None else f'{value:,.{digits}f}'


def _report(report):
    return '—' if not report else f"{report['mean']:,.1f} ± {report['std']:,.1f}"


def markdown(rows, command):
    lines = ['# Preprocessing: learning results', '',
             run_archive.generated_by(command, 'preprocessing_runs.json') +
             'Periodic eval: the greedy policy on '
             '`run.num_eval_episodes` episodes every `run.eval_interval` env steps. Report: '
             'the end-of-run evaluation of the final and the best policy on the same 100 '
             'seeded episodes (evaluation.json).', '',
             '## Per variant', '',
             '| variant | env | observation stage | seeds reaching the target | target |',
             '| --- | --- | --- | ---: | ---: |']
    variants = run_archive.group(rows, lambda row: row['variant'])
    for variant, group in sorted(variants.items()):
        first = group[0]
        hits = sum(row['reached_at'] is not None for row in group)
        lines.append(f"| {variant} | {first['env_id']} | `{first['stage']}` | "
                     f"{hits} of {len(group)} | {_fmt(first['target'])} |")
    lines += ['', '## Every run', '',
              '| variant | seed | env steps | first eval ≥ target at | best periodic eval | '
              'eval at fixed step | final policy (report) | best policy (report) | wall time | '
              'env steps/s |', '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: '
              '| ---: |']
    for row in sorted(rows, key=lambda r: (r['variant'], str(r['seed']))):
        at = ('—' if row['at_step'] is None
              else f"{_fmt(row['at_value'])} at {row['at_step']:,}")
        wall = row['wall_time_s']
        lines.append(
            f"| {row['variant']} | {row['seed']} | {row['last_step']:,}"
            f"{'' if row['finished'] else ' (in progress)'} | "
            f"{'—' if row['reached_at'] is None else format(row['reached_at'], ',')} | "
            f"{_fmt(row['best_eval'])} | {at} | {_report(row['final_report'])} | "
            f"{_report(row['best_report'])} | {(_fmt(wall / 60) + ' min') if wall else '—'} | "
            f"{_fmt(row['env_steps_per_sec'], 0)} |")
    return '\n'.join(lines) + '\n'


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--runs', action='append', required=True,
                        help='A directory holding run directories (repeatable).')
    parser.add_argument('--at_step', action='append', default=[],
                        help='ENV_ID=STEP: also report each run of ENV_ID at this env step.')
    parser.add_argument('--output', default='docs/preprocessing_results.md')
    parser.add_argument('--archive', default=ARCHIVE)
    args = parser.parse_args(argv)
    at_steps = {}
    for item in args.at_step:
        env_id, _, step = item.partition('=')
        if not step.isdigit():
            parser.error(f'--at_step={item!r}: give ENV_ID=STEP, e.g. Hopper-v5=300000.')
        at_steps[env_id] = int(step)
    quiet_startup()  # reading event files imports TensorFlow
    fresh = [describe(run_dir, env_id, seed, at_steps) for runs in args.runs
             if os.path.isdir(runs) for env_id, seed, run_dir in find_runs(runs)]
    command = ' '.join(['python -m reports.preprocessing_results']
                       + [f'--runs {runs}' for runs in args.runs]
                       + [f'--at_step {item}' for item in args.at_step])
    rows = run_archive.update(args.archive, fresh, run_key, command, args.runs)
    run_archive.write_report(args.output, markdown(rows, command), args.archive, fresh, rows)


if __name__ == '__main__':
    main()
