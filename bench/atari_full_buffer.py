"""Peak memory of a configs/dqn_atari.gin run whose 1M-transition compressed replay is full.

    .venv/bin/python -m bench.atari_full_buffer --output docs/atari_full_buffer.md

Runs train.py on Pong with the config's 1M LZ4 replay, fills it with 1M random-policy
transitions (run.initial_collect_steps = 1M: the fastest way to a full buffer), then trains
for a few thousand steps and writes the final checkpoint (the whole buffer included), and
reports the process's peak RSS (VmHWM) and the checkpoint's size. About 15 minutes on one core.
"""

import datetime
import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench import inprocess, timing

CAPACITY = 1_000_000
TRAIN_STEPS = 4_000


def measure(root_dir, capacity):
    cmd = [sys.executable, 'train.py', '--gin_file=configs/dqn_atari.gin',
           f'--root_dir={root_dir}', f'--gin_bindings=run.replay_capacity={capacity}',
           f'--gin_bindings=run.initial_collect_steps={capacity}',
           f'--gin_bindings=run.num_env_steps={capacity + TRAIN_STEPS}',
           '--gin_bindings=run.eval_interval=0', '--gin_bindings=run.num_eval_episodes=1',
           '--gin_bindings=run.final_eval_episodes=0', '--gin_bindings=run.best_policy_episodes=0',
           '--gin_bindings=run.final_video=False', '--gin_bindings=run.checkpoint_interval=0',
           '--gin_bindings=eval/atari_env.max_episode_frames=400']
    start = time.time()
    # Its output goes to a file: a pipe nobody reads would fill up and stall the run.
    log = tempfile.TemporaryFile('w+')
    process = subprocess.Popen(cmd, cwd=timing.REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                               text=True)
    peak = 0
    while process.poll() is None:
        peak = max(peak, inprocess.peak_rss_bytes(process.pid) or 0)
        time.sleep(1.0)
    log.seek(0)
    output = log.read()
    if process.returncode:
        raise timing.BenchError(f'train.py failed:\n{output[-3000:]}')
    checkpoint_bytes = sum(os.path.getsize(os.path.join(d, f))
                           for d, _, files in os.walk(os.path.join(root_dir, 'checkpoints'))
                           for f in files)
    return {'peak_rss': peak, 'checkpoint_bytes': checkpoint_bytes,
            'wall_s': time.time() - start, 'command': ' '.join(cmd[1:])}


def render(result, capacity):
    return '\n'.join([
        '## A full 1M-transition compressed replay (dqn_atari.gin, Pong)', '',
        f'Written by `python -m bench.atari_full_buffer` on {datetime.date.today().isoformat()}; '
        'do not edit by hand. train.py filled the config\'s LZ4 replay with '
        f'{capacity:,} random-policy transitions, trained {TRAIN_STEPS:,} env steps and wrote its '
        'final checkpoint (buffer included); peak RSS is the process\'s VmHWM, sampled every '
        'second. The bar is < 3 GB.', '',
        '| peak RSS | final checkpoint on disk | wall time |', '| ---: | ---: | ---: |',
        f"| {result['peak_rss'] / 2**30:.2f} GiB | {result['checkpoint_bytes'] / 2**30:.2f} GiB | "
        f"{result['wall_s'] / 60:.1f} min |", '',
        f"Command: `python {result['command']}`", ''])


def section(opts):
    root_dir = tempfile.mkdtemp(prefix='atari-1m-')
    try:
        return render(measure(os.path.join(root_dir, 'run'), opts.capacity), opts.capacity)
    finally:
        shutil.rmtree(root_dir, ignore_errors=True)


def main(argv=None):
    def capacity(parser):
        parser.add_argument('--capacity', type=int, default=CAPACITY)
    return timing.standalone_main(section, __doc__, argv, capacity)


if __name__ == '__main__':
    sys.exit(main())
