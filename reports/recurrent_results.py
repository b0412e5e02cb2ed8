"""Recurrent agents on partially observed tasks: the results table, made from run directories.

    python -m reports.recurrent_results --runs runs/recurrent

Every directory under --runs (at any depth) that holds a training run (config.gin + tb/) is one
seed of one variant. The variant is read from its config.gin: the agent, recurrent or
feed-forward, and for recurrent agents the state each stored sequence is unrolled from
(`initial_state`) and the burn-in. A seed counts as reaching the task's bar when its best
policy's end-of-run report (100 seeded episodes, evaluation.json) is at or above it
(BARS; --bar ENV_ID=RETURN overrides). Writes docs/recurrent_results.md; every run it has seen is
kept in docs/data/recurrent_runs.json (reports.run_archive), so a run whose directory is gone
stays in the table.
"""

import argparse
import os
import re

from core.quiet import quiet_startup
from reports import run_archive
from reports.preprocessing_results import describe

ARCHIVE = os.path.join('docs', 'data', 'recurrent_runs.json')
# The bars of the issue that asked for recurrent agents: the best policy's report mean.
BARS = {'CartPole-v1': 450.0, 'Pendulum-v1': -250.0}


def find_runs(runs_dir):
    """[(env_id, seed, run_dir)] of every run directory at any depth under runs_dir."""
    found = []
    for directory, subdirectories, files in sorted(os.walk(runs_dir)):
        if 'config.gin' in files and 'tb' in subdirectories:
            with open(os.path.join(directory, 'config.gin')) as f:
                env = re.search(r"^make_env\.env_id\s*=\s*['\"]([^'\"]+)['\"]", f.read(), re.M)
            seed = re.search(r'(?:_s|seed_)(\d+)$', directory)
            found.append((env.group(1) if env else '?',
                          int(seed.group(1)) if seed else os.path.basename(directory),
                          directory))
            subdirectories[:] = []
    return found


def variant(config_text):
    """'R2D2, stored state + 10 burn-in' or 'DQN, feed-forward', from a run's config.gin."""
    def value(name, default):
        found = run_archive.binding(config_text, name)
        return default if found in (None, 'None') else found.strip("'\"")

    agent = 'SAC' if 'sac.make_agent' in (run_archive.binding(config_text, 'run.make_agent')
                                          or '') else 'DQN'
    scope = 'sac.make_agent' if agent == 'SAC' else 'dqn.make_agent'
    if value(f'{scope}.lstm_size', None) is None:
        return f'{agent}, feed-forward'
    state = value(f'{scope}.initial_state', 'stored')
    burn_in = int(value(f'{scope}.burn_in_steps', '10'))
    name = 'R2D2' if agent == 'DQN' else 'recurrent SAC'
    return f"{name}, {state} state" + (f" + {burn_in} burn-in" if burn_in else ', no burn-in')


def row_of(env_id, seed, run_dir):
    row = describe(run_dir, env_id, seed, {})
    with open(os.path.join(run_dir, 'config.gin')) as f:
        row['variant'] = variant(f.read())
    return row


def run_key(row):
    return (row['variant'], row['env_id'], row['seed'])


def _report(report):
    return '—' if not report else f"{report['mean']:,.1f} ± {report['std']:,.1f}"


def markdown(rows, command, bars):
    lines = ['# Recurrent agents on partially observed tasks', '',
             run_archive.generated_by(command, 'recurrent_runs.json') +
             'Tasks: CartPole-v1 with both velocities hidden (observation [x, θ]) and '
             'Pendulum-v1 with the angular velocity hidden (observation [cos θ, sin θ]); see '
             '[recurrent agents](recurrent.md). Report: the end-of-run evaluation of the final '
             'and the best policy on the same 100 seeded episodes (evaluation.json). A seed '
             'reaches the bar when its best policy\'s report mean is at or above it. Wall time is '
             'what a run took where it ran, often beside other runs on the same cores: not a '
             'speed measurement.', '',
             '## Per variant', '',
             '| task | variant | seeds reaching the bar | bar | best policy (report), per seed '
             '| final policy (report), per seed |',
             '| --- | --- | ---: | ---: | --- | --- |']
    groups = run_archive.group(rows, lambda row: (row['env_id'], row['variant']))
    for (env_id, name), group in sorted(groups.items()):
        bar = bars.get(env_id)
        finished = [row for row in group if row['finished']]
        hits = sum(bar is not None and row['best_report'] is not None
                   and row['best_report']['mean'] >= bar for row in finished)
        def per_seed(which):
            return ', '.join(f"{row[which]['mean']:,.1f}" if row[which] else '—'
                             for row in sorted(group, key=lambda r: str(r['seed'])))

        lines.append(f"| {env_id} | {name} | {hits} of {len(finished)}"
                     f"{'' if len(finished) == len(group) else ' (+ runs in progress)'} | "
                     f"{'—' if bar is None else f'{bar:g}'} | {per_seed('best_report')} | "
                     f"{per_seed('final_report')} |")
    lines += ['', '## Every run', '',
              '| task | variant | seed | env steps | best periodic eval | final policy (report) '
              '| best policy (report) | wall time |', '| --- | --- | ---: | ---: | ---: | ---: '
              '| ---: | ---: |']
    for row in sorted(rows, key=lambda r: (r['env_id'], r['variant'], str(r['seed']))):
        wall = row['wall_time_s']
        best = '—' if row['best_eval'] is None else f"{row['best_eval']:,.1f}"
        lines.append(
            f"| {row['env_id']} | {row['variant']} | {row['seed']} | {row['last_step']:,}"
            f"{'' if row['finished'] else ' (in progress)'} | {best} | "
            f"{_report(row['final_report'])} | {_report(row['best_report'])} | "
            f"{f'{wall / 60:.1f} min' if wall else '—'} |")
    return '\n'.join(lines) + '\n'


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--runs', action='append', required=True,
                        help='A directory holding run directories at any depth (repeatable).')
    parser.add_argument('--bar', action='append', default=[],
                        help='ENV_ID=RETURN: the bar of ENV_ID (defaults: BARS).')
    parser.add_argument('--output', default='docs/recurrent_results.md')
    parser.add_argument('--archive', default=ARCHIVE)
    args = parser.parse_args(argv)
    bars = dict(BARS)
    for item in args.bar:
        env_id, _, value = item.partition('=')
        try:
            bars[env_id] = float(value)
        except ValueError:
            parser.error(f'--bar={item!r}: give ENV_ID=RETURN, e.g. CartPole-v1=450.')
    quiet_startup()  # reading event files imports TensorFlow
    fresh = [row_of(env_id, seed, run_dir) for runs in args.runs if os.path.isdir(runs)
             for env_id, seed, run_dir in find_runs(runs)]
    command = ' '.join(['python -m reports.recurrent_results']
                       + [f'--runs {runs}' for runs in args.runs]
                       + [f'--bar {item}' for item in args.bar])
    rows = run_archive.update(args.archive, fresh, run_key, command, args.runs)
    run_archive.write_report(args.output, markdown(rows, command, bars), args.archive, fresh,
                             rows)


if __name__ == '__main__':
    main()
