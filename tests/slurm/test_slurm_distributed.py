"""A distributed run as one Slurm job, on the live one-node cluster (tests/slurm/conftest.py):
SAC Pendulum with 1 learner, 2 collectors, 1 evaluator and 2 replay shards, every role an srun
step (`python -m app.slurm distributed`). It learns to the single-process bar; the time-limit
warning stops every role in order, requeues the job, and the requeued job resumes every role
from its checkpoint; `scancel` stops every role cleanly (each saves) and leaves none running."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.slurm.conftest import ROOT, job_field, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

CONFIG = 'configs/sac_pendulum_distributed.gin'
ROLES = ['replay_0', 'replay_1', 'learner', 'collector_0', 'collector_1', 'eval']
DONE_STATES = {'COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'NODE_FAIL', 'OUT_OF_MEMORY'}
KILL_WAIT_S = 30  # scripts/slurm.sh's KillWait


def _submit(root, *flags):
    done = subprocess.run(
        [sys.executable, '-m', 'app.slurm', 'distributed', f'--gin_file={CONFIG}',
         f'--root_dir={root}', '--collectors=2', '--replay_shards=2', '--time=30', *flags],
        cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return re.search(r'Submitted job (\d+)', done.stdout).group(1)


def _job_log(root, job):
    try:
        return open(os.path.join(root, 'slurm', f'distributed-{job}.out')).read()
    except OSError:
        return ''


def _role_log(root, name, run=-1):
    """The role's log since its `run`-th start (-1: the latest)."""
    try:
        text = open(os.path.join(root, 'logs', f'{name}.log')).read()
    except OSError:
        return ''
    return text.split(f'starting {name} ===')[run] if f'starting {name} ===' in text else ''


def _steps(job):
    done = subprocess.run(['squeue', '-h', '-s', '-j', str(job), '-o', '%j'],
                          capture_output=True, text=True, timeout=30)
    return set(done.stdout.split())


def _all_up(root, job, starts):
    """Every role runs as a step, `starts` times started, and the learner trains."""
    logs = [open(os.path.join(root, 'logs', f'{name}.log')).read()
            if os.path.exists(os.path.join(root, 'logs', f'{name}.log')) else ''
            for name in ROLES]
    return (set(ROLES) <= _steps(job)
            and all(log.count(f'starting {name} ===') >= starts
                    for name, log in zip(ROLES, logs))
            and 'traced the train function' in _role_log(root, 'learner'))


def _pgrep(root):
    done = subprocess.run(['pgrep', '-f', str(root)], capture_output=True, text=True, timeout=30)
    return done.stdout.split()


def _failure(root, job):
    tails = '\n'.join(f'--- {name}\n{_role_log(root, name)[-1500:]}' for name in ROLES)
    return f'job log:\n{_job_log(root, job)[-3000:]}\n{tails}'


def test_sac_pendulum_job_reaches_minus_200_within_20k_env_steps(slurm_cluster, tmp_path):
    root = tmp_path / 'run'
    job = _submit(root, '--gin_bindings=run.stop_at_target_return=True')
    try:
        wait_for(lambda: job_field(job, 'JobState') in DONE_STATES, 1200, f'job {job} to end',
                 poll_s=5)
    except AssertionError:
        subprocess.run(['scancel', job], timeout=30)
        raise AssertionError(_failure(root, job)) from None
    assert job_field(job, 'JobState') == 'COMPLETED', _failure(root, job)
    log = _job_log(root, job)
    line = next(line for line in log.splitlines() if line.startswith('final metrics: '))
    metrics = json.loads(line.split(': ', 1)[1])
    evaluation = metrics['eval']
    # Read as tests/distributed/test_learning.py reads a launcher's run.
    assert evaluation['steps_to_target'] is not None, evaluation
    assert evaluation['steps_to_target'] <= 20_000, evaluation
    assert evaluation['best_eval_return'] >= -200, evaluation
    assert metrics['exit_codes'] == {name: 0 for name in ROLES}, metrics['exit_codes']
    assert len(metrics['replay']) == 2 and all(s['inserted'] > 0 for s in metrics['replay'])
    # Every role ran as its own step and logged into the run directory.
    for name in ROLES:
        assert f'--job-name={name} ' in log, name
        assert f'[{name}]' in _role_log(root, name), name
    print(f"eval {evaluation['best_eval_return']:.1f} at env step "
          f"{evaluation['steps_to_target']:,}; roles ran {metrics['wall_time_s']:.0f} s")


def test_time_limit_warning_requeues_and_resumes_then_scancel_stops_every_role(
        slurm_cluster, tmp_path):
    root = tmp_path / 'run'
    # A run that never ends by itself; checkpoints only when a role is stopped.
    job = _submit(root, '--gin_bindings=run.num_env_steps=1000000',
                  '--gin_bindings=distributed.settings.learner_checkpoint_interval=1000000',
                  '--gin_bindings=distributed.settings.server_checkpoint_interval_s=3600')
    try:
        wait_for(lambda: _all_up(root, job, 1), 300, 'every role up and the learner training')

        # The time-limit warning (what --signal=B:USR1@<warning_s> sends the batch script).
        subprocess.run(['scancel', '--signal=USR1', '--batch', job], check=True, timeout=30)
        wait_for(lambda: job_field(job, 'Restarts') == '1', 240, 'the job to requeue itself')
        for name in ROLES:  # every role stopped by a signal it saved on, none killed
            assert 'Killed' not in _role_log(root, name), (name, _role_log(root, name))
        learner = _role_log(root, 'learner')
        assert 'checkpoint saved at train step' in learner, learner[-2000:]
        assert all('final checkpoint' in _role_log(root, f'replay_{i}') for i in range(2))
        log = _job_log(root, job)
        assert 'time-limit warning' in log and 'requeueing job' in log, log[-3000:]
        stopped = json.loads(next(line for line in log.splitlines()
                                  if line.startswith('final metrics: ')).split(': ', 1)[1])
        assert stopped['interrupted'] and set(stopped['exit_codes'].values()) == {0}, stopped
        learner_stop = stopped['exited_at']['learner']
        assert all(stopped['exited_at'][f'replay_{i}'] >= learner_stop for i in range(2))

        # The requeued job resumes every role from its checkpoint.
        wait_for(lambda: job_field(job, 'JobState') == 'RUNNING', 240,
                 'the requeued job to start')
        wait_for(lambda: _all_up(root, job, 2), 300, 'every role up again after the requeue')
        assert 'resumed from' in _role_log(root, 'learner'), _role_log(root, 'learner')
        for i in range(2):
            assert 'restored' in _role_log(root, f'replay_{i}'), _role_log(root, f'replay_{i}')
        assert 'restart 1' in _job_log(root, job)
    except AssertionError as error:
        subprocess.run(['scancel', job], timeout=30)
        raise AssertionError(f'{error}\n{_failure(root, job)}') from None

    # scancel: every role saves and exits; none is left running.
    assert _pgrep(root), 'the roles should be running before scancel'
    subprocess.run(['scancel', job], check=True, timeout=30)
    wait_for(lambda: not _pgrep(root), KILL_WAIT_S + 15, 'every role process to exit',
             poll_s=0.5)
    assert not set(ROLES) & _steps(job)  # the batch step may still be completing
    learner = _role_log(root, 'learner')
    assert 'SIGTERM' in learner and 'checkpoint saved at train step' in learner, learner[-2000:]
    for i in range(2):
        assert 'final checkpoint' in _role_log(root, f'replay_{i}'), _role_log(root, f'replay_{i}')
    for name in ROLES:  # no role was killed (srun reports a SIGKILLed task as "Killed")
        assert 'Killed' not in _role_log(root, name), (name, _role_log(root, name)[-1500:])
    assert len(list((root / 'learner' / 'checkpoints').glob('*'))) > 0
