"""Kill a run (SIGKILL, then SIGINT) and rerun it: it continues with no gap or duplicate."""

import glob
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import tensorflow as tf

from app import cli
from experiment.run_session import RunSession
from experiment.trainer import Trainer
from tests.smoke.test_train import ROOT, TINY, read_scalars

BUDGET = 12_000
ARGS = TINY + [
    f'--gin_bindings=run.num_env_steps={BUDGET}',
    '--gin_bindings=run.checkpoint_interval=400',
    '--gin_bindings=run.eval_interval=2000',
    '--gin_bindings=run.export_final_policy=False',
]
# tiny.gin: 2 env copies, 64 initial random steps, 8 env steps and 4 gradient steps per chunk.
INITIAL, CHUNK, TRAIN_PER_CHUNK, SUMMARY_INTERVAL, CAPACITY = 64, 8, 4, 100, 1000


def latest_checkpoint_step(root_dir):
    state = tf.train.get_checkpoint_state(os.path.join(root_dir, 'checkpoints'))
    if state is None:
        return 0
    return int(state.model_checkpoint_path.rsplit('-', 1)[1])


def _start(root_dir):
    return subprocess.Popen([sys.executable, 'train.py', *ARGS, f'--root_dir={root_dir}'],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def signal_after_checkpoint_beyond(process, root_dir, step, signum, timeout=240):
    deadline = time.time() + timeout
    while latest_checkpoint_step(root_dir) <= step:
        assert process.poll() is None, process.stdout.read()
        assert time.time() < deadline, 'no new checkpoint appeared'
        time.sleep(0.05)
    process.send_signal(signum)
    output, _ = process.communicate(timeout=120)
    return output


def _expected_summary_steps():
    """Chunk ends that cross a summary interval, as an uninterrupted run writes them."""
    steps = range(INITIAL + CHUNK, BUDGET + 1, CHUNK)
    return [s for s in steps if s // SUMMARY_INTERVAL > (s - CHUNK) // SUMMARY_INTERVAL]


def restored_state_recorder(monkeypatch, directory):
    """Makes the resumed run write what it holds to `directory` (a TF checkpoint of the objects
    `RunSession.restore` restored) as training starts, before its first chunk: a comparison
    with the run's own checkpoint then also catches state reset between the restore and the
    first step (e.g. a target network re-copied from the online one)."""
    original_restore, original_run = RunSession.restore, Trainer.run
    restored = {}

    def restore(session, step_counter, **trackables):
        step = original_restore(session, step_counter, **trackables)
        # The objects as the run's Checkpointer arranges them, so both files name them alike.
        restored['checkpoint'] = tf.train.Checkpoint(
            train_step=session.train_step, run_state=session.run_state, **trackables)
        return step

    def run(trainer, *args, **kwargs):
        restored.pop('checkpoint').write(os.path.join(directory, 'restored'))
        return original_run(trainer, *args, **kwargs)

    monkeypatch.setattr(RunSession, 'restore', restore)
    monkeypatch.setattr(Trainer, 'run', run)
    return os.path.join(directory, 'restored')


def assert_restored_exactly(checkpoint_path, restored_path):
    """Every network weight, target network, optimizer slot and replay row the run saved is
    what the resumed process holds: a resume that re-initialised any of them fails here."""
    saved, restored = tf.train.load_checkpoint(checkpoint_path), \
        tf.train.load_checkpoint(restored_path)
    names = [name for name, _ in tf.train.list_variables(restored_path)
             if name.startswith(('agent/', 'replay/'))]
    kinds = ' '.join(names)
    # The comparison covers what a resume must bring back, not just some variables.
    for part in ('_q_network', '_target_q_network', '_optimizer', '.OPTIMIZER_SLOT'):
        assert part in kinds, f'{part} not in the checkpoint'
    for name in names:
        np.testing.assert_array_equal(restored.get_tensor(name), saved.get_tensor(name),
                                      err_msg=name)


def test_sigkill_then_sigint_then_finish(tmp_path, monkeypatch):
    root_dir = str(tmp_path / 'run')
    killed = _start(root_dir)
    signal_after_checkpoint_beyond(killed, root_dir, 0, signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL
    first_checkpoint = latest_checkpoint_step(root_dir)

    interrupted = _start(root_dir)
    output = signal_after_checkpoint_beyond(interrupted, root_dir, first_checkpoint,
                                             signal.SIGINT)
    assert interrupted.returncode == 0, output
    assert 'Resuming from' in output and 'Interrupted at env step' in output
    # SIGINT saves a checkpoint at the exact step it stopped at.
    stopped_at = int(output.split('Interrupted at env step ')[1].split(':')[0].replace(',', ''))
    assert latest_checkpoint_step(root_dir) == stopped_at > first_checkpoint

    # A copy: the resumed run keeps only its newest checkpoints and deletes this one.
    latest = tf.train.latest_checkpoint(os.path.join(root_dir, 'checkpoints'))
    saved = str(tmp_path / 'saved' / os.path.basename(latest))
    os.makedirs(os.path.dirname(saved))
    for path in glob.glob(latest + '.*'):
        shutil.copy(path, os.path.dirname(saved))
    restored = restored_state_recorder(monkeypatch, str(tmp_path))
    metrics = cli.train_main(ARGS + [f'--root_dir={root_dir}'])
    assert_restored_exactly(saved, restored)
    assert metrics['env_steps'] == BUDGET
    # Every gradient step was taken exactly once across the three processes.
    assert metrics['train_steps'] == (BUDGET - INITIAL) // CHUNK * TRAIN_PER_CHUNK

    scalars = read_scalars(root_dir)
    size_steps = [step for step, _ in scalars['buffer/size']]
    assert sorted(size_steps) == _expected_summary_steps()  # no gap, no duplicate
    # The buffer came back with its contents: its size never drops at a resume.
    for step, size in scalars['buffer/size']:
        assert size == min(step, CAPACITY)


def test_half_written_checkpoint_leaves_the_previous_one_usable(tmp_path):
    root_dir = str(tmp_path / 'run')
    args = TINY + [f'--root_dir={root_dir}', '--gin_bindings=run.export_final_policy=False']
    first = cli.train_main(args)
    # A write killed midway leaves files of a newer checkpoint that the state file never named.
    for suffix in ('.index', '.data-00000-of-00001'):
        with open(os.path.join(root_dir, 'checkpoints', f'ckpt-999{suffix}'), 'wb') as f:
            f.write(b'\x00' * 10)
    again = cli.train_main(args)
    assert again['env_steps'] == first['env_steps']
    assert again['train_steps'] == first['train_steps']


def test_events_newer_than_the_checkpoint_are_dropped_on_resume(tmp_path):
    """The kill-after-flush-before-checkpoint window: a resume rewrites the events first."""
    from experiment.summaries import SummaryWriter
    writer = SummaryWriter(str(tmp_path))
    writer.scalars({'x': 1.0}, 100)
    writer.scalars({'x': 2.0}, 200)
    writer.close()
    SummaryWriter(str(tmp_path), resume_step=100).close()
    assert [step for step, _ in read_scalars(str(tmp_path))['x']] == [100]
