"""What clusters and users do to a run: SIGTERM, a double launch, divergence, damaged files."""

import glob
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from app import cli
from core.errors import UserError
from core.runlock import RunLock
from tests.smoke.test_resume import ARGS, BUDGET, latest_checkpoint_step
from tests.smoke.test_train import ROOT, TINY, read_scalars


def _start(root_dir, *extra):
    return subprocess.Popen([sys.executable, 'train.py', *ARGS, *extra, f'--root_dir={root_dir}'],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for_checkpoint(process, root_dir, timeout=240):
    deadline = time.time() + timeout
    while latest_checkpoint_step(root_dir) == 0:
        assert process.poll() is None, process.stdout.read()
        assert time.time() < deadline, 'no checkpoint appeared'
        time.sleep(0.05)


def test_sigterm_checkpoints_at_the_current_step_and_the_rerun_loses_nothing(tmp_path):
    root_dir = str(tmp_path / 'run')
    run = _start(root_dir)
    _wait_for_checkpoint(run, root_dir)
    sent = time.monotonic()
    run.send_signal(signal.SIGTERM)
    output, _ = run.communicate(timeout=60)
    assert run.returncode == 0, output
    assert time.monotonic() - sent < 30  # well inside a scheduler's grace period
    stopped_at = int(output.split('Interrupted at env step ')[1].split(':')[0].replace(',', ''))
    assert latest_checkpoint_step(root_dir) == stopped_at
    metrics = cli.train_main(ARGS + [f'--root_dir={root_dir}'])
    assert metrics['env_steps'] == BUDGET and not metrics['interrupted']


def test_a_second_launch_on_the_same_root_dir_is_refused_in_one_line(tmp_path):
    root_dir = str(tmp_path / 'run')
    first = _start(root_dir)
    try:
        _wait_for_checkpoint(first, root_dir)
        second = subprocess.run([sys.executable, 'train.py', *ARGS, f'--root_dir={root_dir}'],
                                cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr
        error = second.stderr.strip().splitlines()
        assert len(error) == 1 and f'PID {first.pid}' in error[0], second.stderr
        assert 'is in use by' in error[0]
    finally:
        first.kill()
        first.wait(timeout=60)
    # The lock died with its (killed) holder: the rerun resumes.
    metrics = cli.train_main(ARGS + [f'--root_dir={root_dir}'])
    assert metrics['env_steps'] == BUDGET


def test_the_lock_is_held_and_released_in_process(tmp_path):
    lock = RunLock(str(tmp_path)).acquire()
    with pytest.raises(UserError, match=f'PID {os.getpid()}'):
        RunLock(str(tmp_path)).acquire()
    lock.release()
    RunLock(str(tmp_path)).acquire().release()


def _all_finite(checkpoint):
    reader = tf.train.load_checkpoint(checkpoint)
    for name, _ in tf.train.list_variables(checkpoint):
        value = reader.get_tensor(name)
        if isinstance(value, np.ndarray) and value.dtype.kind == 'f' and \
                not np.all(np.isfinite(value)):
            return False
    return True


# Without XLA, TF-Agents' own check_numerics on DQN's loss raises inside the chunk first.
@pytest.mark.parametrize('use_xla', [True, False])
def test_divergence_stops_at_once_and_never_saves_nonfinite_weights(tmp_path, use_xla):
    root_dir = str(tmp_path / 'run')
    diverging = TINY + [f'--root_dir={root_dir}', '--gin_bindings=run.num_env_steps=4000',
                        f'--gin_bindings=run.use_xla={use_xla}',
                        '--gin_bindings=run.checkpoint_interval=100',
                        '--gin_bindings=dqn.make_agent.learning_rate=1e30',
                        '--gin_bindings=dqn.make_agent.gradient_clipping=None']
    with pytest.raises(UserError, match='Training diverged: train/.* not finite at env step'):
        cli.train_main(diverging)
    checkpoints = sorted(glob.glob(os.path.join(root_dir, 'checkpoints', 'ckpt-*.index')))
    assert all(_all_finite(path[:-len('.index')]) for path in checkpoints)
    assert not os.path.exists(os.path.join(root_dir, 'policy'))
    assert not os.path.exists(os.path.join(root_dir, 'metrics.json'))


def test_warn_trains_on_through_nonfinite_values(tmp_path, capsys):
    metrics = cli.train_main(TINY + [f'--root_dir={tmp_path / "run"}',
                                     '--gin_bindings=run.export_final_policy=False',
                                     '--gin_bindings=run.on_nonfinite="warn"',
                                     '--gin_bindings=dqn.make_agent.learning_rate=1e30',
                                     '--gin_bindings=dqn.make_agent.gradient_clipping=None'])
    assert metrics['env_steps'] == 400
    assert capsys.readouterr().out.count('not finite at env step') == 1


def test_a_truncated_event_file_does_not_stop_the_resume(tmp_path):
    root_dir = str(tmp_path / 'run')
    args = TINY + [f'--root_dir={root_dir}', '--gin_bindings=run.export_final_policy=False']
    cli.train_main(args)
    (events,) = glob.glob(os.path.join(root_dir, 'tb', 'events.out.tfevents.*'))
    with open(events, 'r+b') as f:  # what a full disk or a kill mid-write leaves
        f.truncate(os.path.getsize(events) - 7)
    metrics = cli.train_main(args + ['--gin_bindings=run.num_env_steps=600', '--force'])
    assert metrics['env_steps'] == 600
    steps = [step for step, _ in read_scalars(root_dir)['eval/AverageReturn']]
    assert steps == sorted(set(steps)) and steps[-1] == 600


def _mount_tmpfs(path, size):
    os.makedirs(path, exist_ok=True)
    try:
        done = subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', str(path)],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _fill(directory):
    """Writes a file until the filesystem is full."""
    with open(os.path.join(directory, 'filler'), 'wb') as filler:
        try:
            while True:
                filler.write(b'\0' * (1 << 16))
                filler.flush()
        except OSError:
            pass


def test_a_full_disk_is_one_line_and_the_run_resumes_once_space_is_freed(tmp_path):
    disk = tmp_path / 'disk'
    if not _mount_tmpfs(disk, '64m'):
        pytest.skip('cannot mount a tmpfs here (needs root); the file-state tests above still '
                    'cover resuming after the damage a full disk leaves')
    try:
        root_dir = str(disk / 'run')
        run = _start(root_dir)
        _wait_for_checkpoint(run, root_dir)
        _fill(disk)
        output, _ = run.communicate(timeout=240)
        assert run.returncode == 2, output
        errors = [line for line in output.splitlines() if line.startswith('error:')]
        assert len(errors) == 1 and 'Could not write' in errors[0], output
        assert root_dir in errors[0] and 'rerun the same command' in errors[0]
        assert 'Traceback' not in output
        os.remove(disk / 'filler')
        metrics = cli.train_main(ARGS + [f'--root_dir={root_dir}'])
        assert metrics['env_steps'] == BUDGET
    finally:
        subprocess.run(['umount', '-l', str(disk)], capture_output=True, timeout=30)


def test_a_checkpoint_with_missing_files_falls_back_to_the_previous_one(tmp_path, capsys):
    root_dir = str(tmp_path / 'run')
    args = TINY + [f'--root_dir={root_dir}', '--gin_bindings=run.checkpoint_interval=100',
                   '--gin_bindings=run.export_final_policy=False']
    cli.train_main(args)
    kept = tf.train.get_checkpoint_state(os.path.join(root_dir, 'checkpoints'))
    latest, previous = kept.model_checkpoint_path, kept.all_model_checkpoint_paths[-2]
    for data_file in glob.glob(latest + '.data-*'):  # the index names a file that is gone
        os.remove(data_file)
    capsys.readouterr()
    metrics = cli.train_main(args)
    output = capsys.readouterr().out
    assert f'fell back to {os.path.basename(previous)}' in output
    assert f'Resuming from {previous}' in output
    assert metrics['env_steps'] == 400


def test_an_emptied_config_record_does_not_stop_the_resume(tmp_path):
    root_dir = str(tmp_path / 'run')
    args = TINY + [f'--root_dir={root_dir}', '--gin_bindings=run.export_final_policy=False']
    first = cli.train_main(args)
    open(os.path.join(root_dir, 'config.gin'), 'w').close()  # what a power loss can leave
    open(os.path.join(root_dir, 'metrics.json'), 'w').close()
    again = cli.train_main(args)
    assert again['env_steps'] == first['env_steps'] and again['train_steps'] == \
        first['train_steps']
