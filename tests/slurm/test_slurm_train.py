"""A single train.py run under Slurm: warned before its time limit, it saves, requeues itself and
resumes, and ends as one continuous run (live local cluster, tests/slurm/conftest.py)."""

import os
import subprocess
import sys

import pytest

from core import tags
from tests.slurm.conftest import ROOT, job_field, wait_for
from tests.smoke.test_train import TINY, read_scalars

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

BUDGET = 150_000
EVAL_INTERVAL = 10_000


def submit(root_dir, *extra):
    done = subprocess.run(
        [sys.executable, '-m', 'app.slurm', 'train', f'--root_dir={root_dir}', *TINY,
         f'--gin_bindings=run.num_env_steps={BUDGET}',
         f'--gin_bindings=run.eval_interval={EVAL_INTERVAL}',
         '--gin_bindings=run.checkpoint_interval=2000',
         '--gin_bindings=run.export_final_policy=False', *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split('Submitted job ')[1].split(':')[0]


def test_a_run_warned_before_its_time_limit_requeues_and_finishes_as_one_curve(
        slurm_cluster, tmp_path):
    root_dir = str(tmp_path / 'run')
    # A 2-minute limit warned 60 s before it: Slurm's periodic check delivers the warning
    # 30-60 s into every start, before this budget is done (~3k env steps/s here).
    job = submit(root_dir, '--time=2', '--warning_s=60', '--cpus_per_task=1')

    def finished():
        return job_field(job, 'JobState') in ('COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT')

    wait_for(finished, 1100, f'job {job} to finish', poll_s=2.0)
    log = open(os.path.join(root_dir, 'slurm', f'train-{job}.out')).read()
    assert job_field(job, 'JobState') == 'COMPLETED', log[-3000:]
    restarts = int(job_field(job, 'Restarts'))
    assert restarts >= 1, log[-3000:]
    assert log.count('time-limit warning: saving, then requeue') == restarts
    assert log.count('Resuming from') == restarts  # every rerun resumed its checkpoint

    scalars = read_scalars(root_dir)
    eval_steps = [step for step, _ in scalars[tags.EVAL_AVERAGE_RETURN]]
    # One continuous curve: every evaluation once, in order, none missing.
    assert eval_steps == list(range(EVAL_INTERVAL, BUDGET + 1, EVAL_INTERVAL)), eval_steps

