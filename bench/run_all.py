"""Runs every benchmark and regenerates docs/benchmarks.md (`make bench`).

    .venv/bin/python -m bench.run_all            # full: ~55 min if quiet; writes docs/benchmarks.md
    .venv/bin/python -m bench.run_all --quick    # shrunk budgets, to test the harness
    make bench ARGS='--cpus=all'                 # don't pin to one core
    make bench TORCH_PYTHON=/tmp/torchvenv/bin/python   # measure the PyTorch SAC peer too

Method. Every measurement is a whole training process launched as a
subprocess and timed from start to exit. A system runs twice, with step
budgets N1 < N2, and its rate is

    env steps/s = (env steps of run 2 - env steps of run 1)
                  / (wall time of run 2 - wall time of run 1),

so everything that does not scale with the budget -- interpreter and TF
start-up, tracing and XLA compilation, initial random collection, the one
eval each system always does, final checkpoint and process exit -- cancels.
Only what happens per step (collection, training, summaries, periodic
checkpoints) is left. Runs are pinned to one core (`taskset -c 0`) by
default because the reference numbers are per core; the machine should be
otherwise quiet. The same runs also give the process exit latency: the time
from the last line a run prints to its exit, read from time-stamped output.

Sections. `SECTIONS` lists (name, function); each function takes the
parsed options and returns a markdown section. docs/benchmarks.md is the
header plus every section, printed to stdout too, and is written (temp file,
then rename) only by a run of all sections in full mode, unless --output is
given. Add benchmarks as new modules with a `section` function and list
them here.
"""

import argparse
import datetime
import os
import shlex
import shutil
import sys
import tempfile
import time

from bench import (
    atari_replay,
    atari_speed,
    buffers,
    distributed,
    dqn_speed,
    frame_codecs,
    preprocessing_overhead,
    sac_speed,
    timing,
)
from core.rundir import atomic_write_text

SECTIONS = [
    ('dqn_cartpole', dqn_speed.section),
    ('sac_pendulum', sac_speed.section),
    ('preprocessing', preprocessing_overhead.section),
    ('buffers', buffers.section),
    ('frame_codecs', frame_codecs.section),
    ('atari_replay', atari_replay.section),
    ('atari_speed', atari_speed.section),
    ('distributed', distributed.section),
]
DEFAULT_OUTPUT = os.path.join(timing.REPO_ROOT, 'docs', 'benchmarks.md')


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--quick', action='store_true',
                        help='Shrink budgets to test the harness (does not write the doc '
                             'unless --output is given).')
    parser.add_argument('--cpus', default='0',
                        help="CPU list for `taskset -c` (default 0: one core), or 'all'.")
    parser.add_argument('--only', action='append', choices=[name for name, _ in SECTIONS],
                        help='Run only this section (repeatable); the doc is then not written '
                             'unless --output is given.')
    parser.add_argument('--output', default=None,
                        help=f'Markdown file to write (default {os.path.relpath(DEFAULT_OUTPUT)}'
                             ' for a full run of every section).')
    parser.add_argument('--torch_python', default=os.environ.get('TORCH_PYTHON'),
                        help='A Python with torch and gymnasium (e.g. a venv of its own; '
                             'default $TORCH_PYTHON): the SAC section then measures the '
                             'PyTorch peer (bench/pytorch_sac_peer.py) instead of quoting it.')
    parser.add_argument('--sb3_python', default=os.environ.get('SB3_PYTHON'),
                        help='A Python with stable-baselines3, torch and ale-py (default '
                             '$SB3_PYTHON): the Atari section then measures SB3\'s DQN '
                             '(bench/sb3_atari_peer.py).')
    parser.add_argument('--log_dir', default=None,
                        help='Keep every run\'s time-stamped log here (default: a temp dir, '
                             'deleted unless a run fails).')
    opts = parser.parse_args(argv)
    if opts.cpus != 'all':
        try:
            available = os.sched_getaffinity(0)
            wanted = _cpu_set(opts.cpus)
        except ValueError:
            parser.error(f"--cpus={opts.cpus!r}: give a list like 0 or 0-1, or 'all'.")
        if not wanted <= available:
            parser.error(f'--cpus={opts.cpus}: this process may only use CPUs {sorted(available)}.')
    return opts


def _cpu_set(text):
    cpus = set()
    for part in text.split(','):
        low, _, high = part.partition('-')
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def header(argv, started):
    command = shlex.join([os.path.relpath(sys.executable, timing.REPO_ROOT),
                          '-m', 'bench.run_all', *argv])
    load = ', '.join(f'{x:.2f}' for x in os.getloadavg())
    busy = os.getloadavg()[0] > 0.5
    return '\n'.join([
        '# Benchmarks', '',
        'Generated by `make bench`; do not edit by hand.', '',
        f'- Command: `{command}` (from the repository root)',
        f'- Date: {started:%Y-%m-%d %H:%M %Z}',
        f'- Machine: {timing.cpu_model()}, {os.cpu_count()} CPUs; load average at start '
        f'{load} (1, 5, 15 min)',
        '',
    ] + (['**The machine was not quiet when this run started (1-minute load average above '
          '0.5): treat the numbers with suspicion.**', ''] if busy else []))


def write_atomically(path, text):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write_text(path, text)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    opts = parse_args(argv)
    started = datetime.datetime.now(datetime.timezone.utc)
    clock = time.perf_counter()
    chosen = [(name, fn) for name, fn in SECTIONS if not opts.only or name in opts.only]
    output = opts.output or (DEFAULT_OUTPUT if not opts.quick and not opts.only else None)

    keep_logs = opts.log_dir is not None
    opts.log_dir = opts.log_dir or tempfile.mkdtemp(prefix='bench-logs-')
    os.makedirs(opts.log_dir, exist_ok=True)
    opts.scratch_dir = None  # sections make their own temp dirs under the default tmp
    parts = [header(argv, started)]
    failed = False
    try:
        for name, section in chosen:
            print(f'== {name} ==', flush=True)
            try:
                parts.append(section(opts))
            except timing.BenchError as error:
                failed = True
                print(f'error: {error}', file=sys.stderr, flush=True)
                parts.append(f'## {name}\n\nFAILED: {str(error).splitlines()[0]}\n')
    finally:
        if not keep_logs and not failed:
            shutil.rmtree(opts.log_dir, ignore_errors=True)
        elif failed:
            print(f'Run logs kept in {opts.log_dir}', file=sys.stderr, flush=True)
    minutes = (time.perf_counter() - clock) / 60
    load = ', '.join(f'{x:.2f}' for x in os.getloadavg())
    parts.append(f'_Whole run: {minutes:.1f} min; load average at the end {load}._\n')
    text = '\n'.join(parts)
    print('\n' + text, flush=True)
    if output and not failed:
        write_atomically(output, text)
        print(f'Wrote {output}', flush=True)
    elif output:
        print(f'Not writing {output}: a section failed.', file=sys.stderr)
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
