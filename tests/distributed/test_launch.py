"""The launcher end to end: a whole tiny run ends by itself; Ctrl-C stops every role cleanly.

Both run the launcher as a user would (in its private network namespace when
this machine has other interfaces), so they are slow-ish: marked `slow`.
The SAC Pendulum learning run (>= -200) is in test_learning.py.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.distributed.conftest import FAST, GIN_FILES, ROOT

pytestmark = [pytest.mark.reverb, pytest.mark.slow, pytest.mark.timeout(900)]


def _launch(root_dir, *bindings, collectors=2):
    cmd = [sys.executable, '-m', 'app.launch', f'--root_dir={root_dir}',
           f'--collectors={collectors}']
    cmd += [f'--gin_file={f}' for f in GIN_FILES]
    cmd += [f'--gin_bindings={b}' for b in [*FAST, *bindings]]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def _finish(proc, timeout_s):
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        for pid in _role_pids(output):  # each role runs in its own session: not in the group
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        raise AssertionError(f'the launcher did not finish in {timeout_s} s:\n{output[-3000:]}')
    return output


def _role_pids(output):
    return [int(pid) for pid in re.findall(r'^\s+\S+\s+pid (\d+)', output, re.MULTILINE)]


def _gone(pids):
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return False
    return True


def _metrics(output):
    line = next(line for line in output.splitlines() if line.startswith('final metrics: '))
    return json.loads(line.split(': ', 1)[1])


def test_a_tiny_run_ends_by_itself_with_every_role_stopped(tmp_path):
    proc = _launch(tmp_path / 'run', 'run.num_env_steps = 400')
    output = _finish(proc, 600)
    assert proc.returncode == 0, output[-3000:]
    metrics = _metrics(output)
    assert json.loads((tmp_path / 'run' / 'metrics.json').read_text()) == metrics
    assert not metrics['interrupted'] and not metrics['restarts']
    assert set(metrics['exit_codes'].values()) == {0}, metrics['exit_codes']
    assert metrics['eval']['last_eval_env_step'] >= 400
    assert metrics['learner']['train_steps'] == 168  # (400 - 64) x 4 / 8
    assert metrics['replay']['inserted'] >= 400
    assert _gone(_role_pids(output))
    # The evaluator keeps the run's best policy, as a single process does.
    best = json.loads((tmp_path / 'run' / 'policy_best' / 'best.json').read_text())
    assert metrics['eval']['best_policy'] == best and best['env_step'] >= 200
    # ...and ends with its end-of-run report on the final weights (tiny_run.gin: 4 episodes).
    report = json.loads((tmp_path / 'run' / 'evaluation.json').read_text())
    assert len(report['final']['returns']) == 4
    assert metrics['eval']['final_report']['final']['mean'] == report['final']['mean']


def test_ctrl_c_stops_every_role_and_the_learner_checkpoints(tmp_path):
    root = tmp_path / 'run'
    proc = _launch(root, 'run.num_env_steps = 1000000')
    checkpoints = root / 'learner' / 'checkpoints'
    deadline = time.monotonic() + 300
    while not (checkpoints.is_dir() and any(checkpoints.glob('ckpt-*.index'))):
        assert proc.poll() is None and time.monotonic() < deadline, 'no learner checkpoint'
        time.sleep(1)
    proc.send_signal(signal.SIGINT)  # what a terminal's Ctrl-C sends the launcher
    output = _finish(proc, 180)
    assert proc.returncode == 0, output[-3000:]
    metrics = _metrics(output)
    assert metrics['interrupted']
    assert metrics['learner']['interrupted'] and metrics['learner']['train_steps'] > 0
    assert metrics['exit_codes']['replay'] == 0 and metrics['exit_codes']['learner'] == 0
    assert _gone(_role_pids(output))
    assert any((root / 'replay' / 'reverb').glob('*/DONE'))
