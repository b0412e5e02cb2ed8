"""The benchmark-scale learning table and curves, made from run directories (issue: SAC on MuJoCo).

    python -m reports.learning_results --runs runs/bench15

Every subdirectory of --runs that holds a training run (config.gin + tb/) is one seed of one
environment (`make_env.env_id` from its config.gin; the seed from a `_s<N>` or `seed_<N>`
suffix). Writes docs/learning_results.md (final eval per env: mean ± std over seeds, beside
the published 1M-step values of TF-Agents' README and RL-Zoo's benchmark.md; wall time and env
steps/s of every run) and docs/img/learning_<env>.png (mean ± std band over seeds, published
values as reference lines). Runs still in progress are listed with the step they reached, so
the table can be regenerated after every sitting of a run that resumes across sessions.

Every run it has seen is also kept in docs/data/learning_runs.json (reports.run_archive), so a
seed whose run directory is gone (another machine, a wiped runs/) stays in the table.
"""

import argparse
import os
import re

import numpy as np

from core.quiet import quiet_startup
from reports import run_archive
from sweeps import curves

# Published final (1M env steps) evaluation returns of SAC.
PUBLISHED = {
    'HalfCheetah': {'TF-Agents README': 12_096, 'RL-Zoo (v3 envs)': 9_535},
    'Hopper': {'TF-Agents README': 3_323, 'RL-Zoo (v3 envs)': 2_326},
    'Walker2d': {'TF-Agents README': 4_966, 'RL-Zoo (v3 envs)': 3_863},
}
RL_ZOO_SPREAD = {'HalfCheetah': 100, 'Hopper': 1_130, 'Walker2d': 254}
ARCHIVE = os.path.join('data', 'learning_runs.json')  # under --docs


def run_key(row):
    return (row['env_id'], row['seed'])


def find_runs(runs_dir):
    """[(env_id, seed, run_dir)] of every run directory under runs_dir."""
    found = []
    for name in sorted(os.listdir(runs_dir)):
        run_dir = os.path.join(runs_dir, name)
        config = os.path.join(run_dir, 'config.gin')
        if not (os.path.isfile(config) and os.path.isdir(os.path.join(run_dir, 'tb'))):
            continue
        with open(config) as f:
            env = re.search(r"^make_env\.env_id\s*=\s*['\"]([^'\"]+)['\"]", f.read(), re.M)
        seed = re.search(r'(?:_s|seed_)(\d+)$', name)
        found.append((env.group(1) if env else '?', int(seed.group(1)) if seed else name,
                      run_dir))
    return found


def run_row(env_id, seed, run_dir):
    """One run: its curve and, when finished, metrics.json's final numbers."""
    curve = curves.read_scalar(run_dir)
    metrics = run_archive.metrics(run_dir)
    return {'env_id': env_id, 'seed': seed, 'run_dir': run_dir, 'curve': curve,
            'finished': bool(metrics) and not metrics.get('interrupted'),
            'reached': curve[-1][0] if curve else 0,
            'final_eval': curve[-1][1] if curve else None,
            'report': metrics.get('final_report', {}).get('final'),
            'wall_time_s': metrics.get('wall_time_s'), 'env_steps': metrics.get('env_steps')}


def _family(env_id):
    return env_id.split('-')[0]


def _fmt(value, digits=0):
    return '—' if value is None else f'{value:,.{digits}f}'


def markdown(rows, command):
    lines = ['# Learning at benchmark scale', '',
             run_archive.generated_by(command, 'learning_runs.json') +
             'Final eval: the greedy policy, 10 episodes, at the last evaluation (1M env steps '
             'for finished runs); "report" is the end-of-run '
             'report on 100 seeded episodes where the run wrote one.', '',
             '| env | seeds finished | final eval, mean ± std over seeds | TF-Agents (README) '
             '| RL-Zoo (benchmark.md) |', '| --- | ---: | ---: | ---: | ---: |']
    by_env = run_archive.group(rows, lambda row: row['env_id'])
    for env_id, env_rows in sorted(by_env.items()):
        done = [row['final_eval'] for row in env_rows if row['finished']]
        summary = (f'{np.mean(done):,.0f} ± {np.std(done):,.0f}' if done else 'in progress')
        published = PUBLISHED.get(_family(env_id), {})
        zoo = published.get('RL-Zoo (v3 envs)')
        zoo_text = (f"{zoo:,} ± {RL_ZOO_SPREAD[_family(env_id)]:,}" if zoo else '—')
        lines.append(f"| {env_id} | {len(done)} of {len(env_rows)} | {summary} | "
                     f"{_fmt(published.get('TF-Agents README'))} | {zoo_text} |")
    lines += ['', '## Every run', '',
              '| env | seed | env steps reached | last eval | report (100 episodes) | wall time '
              '| env steps/s |', '| --- | ---: | ---: | ---: | ---: | ---: | ---: |']
    for row in rows:
        wall = row['wall_time_s']
        rate = row['env_steps'] / wall if wall and row['env_steps'] else None
        report = row['report']
        lines.append(
            f"| {row['env_id']} | {row['seed']} | {row['reached']:,}"
            f"{'' if row['finished'] else ' (in progress)'} | {_fmt(row['final_eval'])} | "
            f"{(_fmt(report['mean']) + ' ± ' + _fmt(report['std'])) if report else '—'} | "
            f"{(_fmt(wall / 3600, 2) + ' h') if wall else '—'} | {_fmt(rate)} |")
    gone = [row for row in rows if not row['curve']]
    if gone:
        lines += ['', 'Without a curve (only its final numbers were archived before its run '
                  'directory was lost): ' + ', '.join(f"{row['env_id']} seed {row['seed']}"
                                                      for row in gone) + '.']
    plotted = sorted(env for env, env_rows in by_env.items()
                     if any(row['curve'] for row in env_rows))
    lines += ['', 'Curves: ' + ', '.join(f'![{env}](img/learning_{_family(env)}.png)'
                                        for env in plotted), '']
    return '\n'.join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--runs', required=True, help='Directory holding the run directories.')
    parser.add_argument('--docs', default='docs', help='Where the table and the images go.')
    args = parser.parse_args(argv)
    quiet_startup()  # reading event files imports TensorFlow
    command = f'python -m reports.learning_results --runs {args.runs}'
    archive = os.path.join(args.docs, ARCHIVE)
    fresh = ([run_row(*found) for found in find_runs(args.runs)]
             if os.path.isdir(args.runs) else [])
    rows = run_archive.update(archive, fresh, run_key, command, args.runs)
    os.makedirs(os.path.join(args.docs, 'img'), exist_ok=True)
    for env_id in sorted({row['env_id'] for row in rows}):
        env_curves = [row['curve'] for row in rows if row['env_id'] == env_id and row['curve']]
        if env_curves:
            curves.plot({f'ours ({len(env_curves)} seeds)': curves.aggregate(env_curves)},
                        f'SAC {env_id}', os.path.join(args.docs, 'img',
                                                      f'learning_{_family(env_id)}.png'),
                        references=PUBLISHED.get(_family(env_id)))
    run_archive.write_report(os.path.join(args.docs, 'learning_results.md'),
                             markdown(rows, command), archive, fresh, rows)


if __name__ == '__main__':
    main()
