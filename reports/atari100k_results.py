"""The Atari-100k results table, made from run directories of configs/dqn_atari100k.gin.

    python -m reports.atari100k_results --runs runs/atari100k

Every subdirectory of --runs holding a training run is one seed of one game (make_env.env_id
from its config.gin, the seed from a `_s<N>` suffix, the replay codec from
FrameStackedReplay.codec, the Q-network's head from dqn.make_agent.dueling). Runs with different
heads are different agents: each (game, head) gets its own mean over seeds. Writes
docs/atari100k_results.md (the score protocol is in its text) beside DrQ(eps)'s published
mean (Agarwal et al. 2021, 100 runs). Every run it has seen is also kept in
docs/data/atari100k_runs.json (reports.run_archive), so seeds trained on another machine, or
whose run directories are gone, stay in the table.
"""

import argparse
import inspect
import os

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


def run_key(row):
    return (row['env_id'], row['seed'], row['codec'], _head_of(row))


def _head_of(row):
    """Runs archived before the dueling option existed all had the plain head."""
    return row.get('head', 'plain')


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
    return row


def markdown(rows, command):
    lines = ['# Atari-100k results', '',
             run_archive.generated_by(command, 'atari100k_runs.json') +
             'Score: the final policy\'s end-of-run report, '
             '100 seeded whole-game episodes with evaluation epsilon 0.001, raw game score '
             '(configs/dqn_atari100k.gin: 100k agent steps = 400k frames).', '',
             '| game | Q head | seeds finished | mean over seeds | DrQ(ε) published '
             '| bar (60% of it) | random |',
             '| --- | --- | ---: | ---: | ---: | ---: | ---: |']
    by_agent = run_archive.group(rows, lambda row: (_game(row['env_id']), _head_of(row)))
    for (game, head), game_rows in sorted(by_agent.items()):
        done = [row['report']['mean'] for row in game_rows
                if row['finished'] and row['report'] and row['codec'] in LOSSLESS]
        published = [f'{value}' for value in PUBLISHED.get(game, ('—',) * 3)]
        mean = f'{np.mean(done):.1f}' if done else 'in progress'
        lines.append(f"| {game} | {head} | {len(done)} | {mean} | {' | '.join(published)} |")
    lines += ['', 'Means over seeds use lossless compressed storage (LZ4, the default, or zlib); '
              'runs with raw or JPEG storage are listed below for the storage comparison. '
              'DrQ(ε) has a dueling head (Dopamine\'s DrQ_eps.gin); the plain head is '
              'TF-Agents\' QNetwork.', '',
              '## Every run', '',
              '| game | Q head | seed | replay codec | env steps | final policy (100 episodes) | '
              'best policy | wall time |',
              '| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |']
    for row in rows:
        report, best, wall = row['report'], row['best'], row['wall_time_s']
        final_text = f"{report['mean']:.1f} ± {report['std']:.1f}" if report else '—'
        best_text = f"{best['mean']:.1f}" if best else '—'
        wall_text = f'{wall / 60:.0f} min' if wall else '—'
        progress = '' if row['finished'] else ' (in progress)'
        lines.append(f"| {_game(row['env_id'])} | {_head_of(row)} | {row['seed']} | "
                     f"{row['codec']} | "
                     f"{row['reached']:,}{progress} | {final_text} | {best_text} | {wall_text} |")
    return '\n'.join(lines + _storage_comparison(rows)) + '\n'


CODEC_ORDER = ('lz4', 'zlib', 'none', 'jpeg')


def _storage_comparison(rows):
    """Seeds trained with more than one codec, side by side (same game, head and seed)."""
    by_seed = {}
    for row in rows:
        if row['finished'] and row['report']:
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
    parser.add_argument('--runs', required=True, help='Directory holding the run directories.')
    parser.add_argument('--docs', default='docs')
    args = parser.parse_args(argv)
    quiet_startup()
    fresh = [_described(*found)
             for found in (find_runs(args.runs) if os.path.isdir(args.runs) else [])]
    command = f'python -m reports.atari100k_results --runs {args.runs}'
    archive = os.path.join(args.docs, ARCHIVE)
    rows = run_archive.update(archive, fresh, run_key, command, args.runs)
    run_archive.write_report(os.path.join(args.docs, 'atari100k_results.md'),
                             markdown(rows, command), archive, fresh, rows)


if __name__ == '__main__':
    main()
