"""The Atari-100k results table, made from run directories of configs/dqn_atari100k.gin.

    python -m reports.atari100k_results --runs runs/atari100k [--runs runs/atari100k_distributed]

Every subdirectory of --runs holding a training run is one seed of one game (make_env.env_id
from its config.gin, the seed from a `_s<N>` suffix, the replay codec from
FrameStackedReplay.codec, the Q-network's head from dqn.make_agent.dueling). A distributed run
(app.launch) counts too: its evaluator's directory holds the config and the eval curve, and the
launcher's metrics.json at its root the end-of-run report and the whole run's wall time. Runs
with different heads, or trained distributed, are different rows: each (game, head, mode) gets
its own mean over seeds. Writes docs/atari100k_results.md (the score protocol is in its text)
beside DrQ(eps)'s published mean (Agarwal et al. 2021, 100 runs). Every run it has seen is also
kept in docs/data/atari100k_runs.json (reports.run_archive), so seeds trained on another
machine, or whose run directories are gone, stay in the table.
"""

import argparse
import inspect
import os
import re

import numpy as np

from core.quiet import quiet_startup
from reports import run_archive
from reports.learning_results import find_runs, run_row

# DrQ(eps)'s published Atari-100k means (Agarwal et al. 2021), the issue's bar (60% of it),
# and random play.
PUBLISHED = {'Breakout': (19.8, 12.0, 1.7), 'Boxing': (9.0, 5.4, 0.1)}


def _game(env_id):
    return env_id.split('/')[-1].split('-')[0]


LOSSLESS = ('lz4', 'zlib')  # compressed storage that keeps every frame exact
ARCHIVE = os.path.join('data', 'atari100k_runs.json')  # under --docs


ONE_PROCESS = 'one process'


def run_key(row):
    return (row['env_id'], row['seed'], row['codec'], _head_of(row), _mode_of(row))


def _head_of(row):
    """Runs archived before the dueling option existed all had the plain head."""
    return row.get('head', 'plain')


def _mode_of(row):
    """Runs archived before distributed runs were listed were all single-process runs."""
    return row.get('mode', ONE_PROCESS)


def _described(env_id, seed, run_dir):
    """run_row's record plus the run's replay codec (FrameStackedReplay's default unless
    bound), Q head and best policy's report."""
    row = run_row(env_id, seed, run_dir)
    with open(os.path.join(run_dir, 'config.gin')) as f:
        config = f.read()
    codec = run_archive.binding(config, 'FrameStackedReplay.codec')
    if codec is None:
        from buffers.frames import FrameStackedReplay
        codec = inspect.signature(FrameStackedReplay.__init__).parameters['codec'].default
    row['codec'] = codec.strip('\'"')
    row['head'] = ('dueling' if run_archive.binding(config, 'dqn.make_agent.dueling') == 'True'
                   else 'plain')
    row['best'] = run_archive.metrics(run_dir).get('final_report', {}).get('best')
    row['mode'] = ONE_PROCESS
    return row


def _find_distributed(runs_dir):
    """[(env_id, seed, run_dir)] of the distributed runs under runs_dir: those whose eval/
    role directory is what find_runs recognises as a run."""
    found = []
    for name in sorted(os.listdir(runs_dir)):
        run_dir = os.path.join(runs_dir, name)
        roles = find_runs(run_dir) if os.path.isdir(run_dir) else []
        found += [(env_id, _seed_of(name), run_dir) for env_id, _, role_dir in roles
                  if os.path.basename(role_dir) == 'eval']
    return found


def _seed_of(name):
    found = re.search(r'(?:_s|seed_)(\d+)$', name)
    return int(found.group(1)) if found else name


def _training_wall_time(launched):
    """Seconds from the launcher's start to the learner reaching its budget: what a
    single-process run's wall_time_s counts (up to its final checkpoint, report left out)."""
    if not launched.get('exited_at') or 'budget_reached_at' not in (launched.get('learner') or {}):
        return None
    started = max(launched['exited_at'].values()) - launched['wall_time_s']  # epoch seconds
    return launched['learner']['budget_reached_at'] - started


def _described_distributed(env_id, seed, run_dir):
    """_described on the evaluator's directory, with the launcher's whole-run numbers."""
    row = _described(env_id, seed, os.path.join(run_dir, 'eval'))
    launched = run_archive.metrics(run_dir)  # written by the launcher when the run ends
    report = (launched.get('eval') or {}).get('final_report') or {}
    collectors = launched.get('collectors')
    row.update(run_dir=run_dir, finished=bool(launched) and not launched.get('interrupted'),
               report=report.get('final'), best=report.get('best'),
               wall_time_s=_training_wall_time(launched),
               env_steps=(launched.get('replay') or {}).get('inserted'),
               mode=(f"distributed, {collectors} collector{'s' if collectors != 1 else ''}"
                     if collectors else 'distributed'))
    return row


def markdown(rows, command):
    lines = ['# Atari-100k results', '',
             run_archive.generated_by(command, 'atari100k_runs.json') +
             'Score: the final policy\'s end-of-run report, '
             '100 seeded whole-game episodes with evaluation epsilon 0.001, raw game score '
             '(configs/dqn_atari100k.gin: 100k agent steps = 400k frames).', '',
             '| game | Q head | trained | seeds finished | mean over seeds | DrQ(ε) published '
             '| bar (60% of it) | random |',
             '| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |']
    by_agent = run_archive.group(
        rows, lambda row: (_game(row['env_id']), _head_of(row), _mode_of(row)))
    for (game, head, mode), game_rows in sorted(by_agent.items()):
        done = [row['report']['mean'] for row in game_rows
                if row['finished'] and row['report'] and row['codec'] in LOSSLESS]
        published = [f'{value}' for value in PUBLISHED.get(game, ('—',) * 3)]
        mean = f'{np.mean(done):.1f}' if done else 'in progress'
        lines.append(f"| {game} | {head} | {mode} | {len(done)} | {mean} | "
                     f"{' | '.join(published)} |")
    lines += ['', 'Means over seeds use lossless compressed storage (LZ4, the default, or zlib); '
              'runs with raw or JPEG storage are listed below for the storage comparison. '
              'DrQ(ε) has a dueling head (Dopamine\'s DrQ_eps.gin); the plain head is '
              'TF-Agents\' QNetwork. Wall time is training only (the end-of-run report left '
              'out): a single-process run\'s up to its final checkpoint, a distributed run\'s '
              'from the launcher\'s start to the learner reaching its budget.', '',
              '## Every run', '',
              '| game | Q head | trained | seed | replay codec | env steps | '
              'final policy (100 episodes) | best policy | wall time |',
              '| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: |']
    for row in rows:
        report, best, wall = row['report'], row['best'], row['wall_time_s']
        final_text = f"{report['mean']:.1f} ± {report['std']:.1f}" if report else '—'
        best_text = f"{best['mean']:.1f}" if best else '—'
        wall_text = f'{wall / 60:.0f} min' if wall else '—'
        progress = '' if row['finished'] else ' (in progress)'
        lines.append(f"| {_game(row['env_id'])} | {_head_of(row)} | {_mode_of(row)} | "
                     f"{row['seed']} | "
                     f"{row['codec']} | "
                     f"{row['reached']:,}{progress} | {final_text} | {best_text} | {wall_text} |")
    return '\n'.join(lines + _storage_comparison(rows)) + '\n'


CODEC_ORDER = ('lz4', 'zlib', 'none', 'jpeg')


def _storage_comparison(rows):
    """Seeds trained with more than one codec, side by side (same game, head and seed)."""
    by_seed = {}
    for row in rows:
        if row['finished'] and row['report'] and _mode_of(row) == ONE_PROCESS:
            key = (_game(row['env_id']), _head_of(row), row['seed'])
            by_seed.setdefault(key, {})[row['codec']] = row['report']
    compared = {key: codecs for key, codecs in by_seed.items() if len(codecs) > 1}
    if not compared:
        return []
    codecs = [c for c in CODEC_ORDER if any(c in found for found in compared.values())]
    lines = ['', '## Storage comparison', '',
             'The same game, head and seed trained with each replay codec (final policy, 100 '
             'episodes). Lossless codecs store identical frames; JPEG is lossy. Runs of one '
             'seed still differ once one of them was stopped and resumed: a resumed run '
             'starts fresh episodes (docs/training.md). Read the codecs\' gap against the '
             'spread between seeds of one codec in the table above.', '',
             f"| game | Q head | seed | {' | '.join(codecs)} |",
             f"| --- | --- | ---: |{' ---: |' * len(codecs)}"]
    for (game, head, seed), found in sorted(compared.items()):
        cells = [f"{found[c]['mean']:.1f} ± {found[c]['std']:.1f}" if c in found else '—'
                 for c in codecs]
        lines.append(f"| {game} | {head} | {seed} | {' | '.join(cells)} |")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--runs', required=True, action='append',
                        help='Directory holding the run directories; repeatable.')
    parser.add_argument('--docs', default='docs')
    args = parser.parse_args(argv)
    quiet_startup()
    present = [runs for runs in args.runs if os.path.isdir(runs)]
    fresh = [_described(*found) for runs in present for found in find_runs(runs)]
    fresh += [_described_distributed(*found) for runs in present
              for found in _find_distributed(runs)]
    command = 'python -m reports.atari100k_results ' + ' '.join(
        f'--runs {runs}' for runs in args.runs)
    archive = os.path.join(args.docs, ARCHIVE)
    rows = run_archive.update(archive, fresh, run_key, command, ', '.join(args.runs))
    run_archive.write_report(os.path.join(args.docs, 'atari100k_results.md'),
                             markdown(rows, command), archive, fresh, rows)


if __name__ == '__main__':
    main()
