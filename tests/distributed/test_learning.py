"""Distributed SAC on Pendulum learns to the single-process bar (slow: several minutes)."""

import json
import subprocess
import sys

import pytest

from tests.distributed.conftest import ROOT

pytestmark = [pytest.mark.reverb, pytest.mark.slow, pytest.mark.timeout(3600)]


def test_two_collectors_reach_minus_200_within_the_budget(tmp_path):
    cmd = [sys.executable, '-m', 'app.launch',
           '--gin_file=configs/sac_pendulum_distributed.gin', '--collectors=2',
           f'--root_dir={tmp_path / "run"}', '--gin_bindings=run.stop_at_target_return=True']
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith('final metrics: '))
    metrics = json.loads(line.split(': ', 1)[1])
    evaluation = metrics['eval']
    assert evaluation['steps_to_target'] is not None, evaluation
    assert evaluation['steps_to_target'] <= 20_000 and evaluation['best_eval_return'] >= -200
    assert set(metrics['exit_codes'].values()) == {0}, metrics['exit_codes']
