"""Sweeps across machines: two sweep.py workers share one Optuna study on a real PostgreSQL server.

A throwaway server (scripts/postgres.sh, what `make postgres` runs) holds the
study; one worker is SIGKILLed with its trials mid-study, and the other still
completes exactly `num_trials` (the killed trial's heartbeat goes stale, it is
failed and its configuration re-queued). Slow (a server start and a search):
`make test-slow`. Skipped with the reason where no PostgreSQL server is installed.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import optuna
import pytest

from tests.smoke.test_sweep import FAKE_TRAIN, ROOT, SEARCH_SPEC

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
SCRIPT = os.path.join(ROOT, 'scripts', 'postgres.sh')


def _free_port():
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return probe.getsockname()[1]


@pytest.fixture
def postgres_url():
    if not (shutil.which('pg_ctl') or any(os.path.exists(f'/usr/lib/postgresql/{v}/bin/pg_ctl')
                                          for v in range(10, 20))):
        pytest.skip('no PostgreSQL server installed here (apt-get install postgresql)')
    # The server may run as the 'postgres' user: its directory must be reachable by it.
    parent = tempfile.mkdtemp(prefix='rl-pg-', dir='/tmp')
    os.chmod(parent, 0o755)
    data_dir = os.path.join(parent, 'data')
    started = subprocess.run([SCRIPT, 'start', data_dir, str(_free_port())],
                             capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    try:
        yield started.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([SCRIPT, 'stop', data_dir], capture_output=True, timeout=120)
        shutil.rmtree(parent, ignore_errors=True)


def test_a_killed_worker_leaves_a_shared_postgresql_study_complete(tmp_path, postgres_url):
    (tmp_path / 'fake_train.py').write_text(FAKE_TRAIN.replace('time.sleep(0.3)',
                                                               'time.sleep(2.0)'))
    (tmp_path / 'search.yaml').write_text(SEARCH_SPEC)

    def worker(name):
        command = [sys.executable, 'sweep.py', f'--sweep={tmp_path / "search.yaml"}',
                   f'--root_dir={tmp_path / name}', f'--storage={postgres_url}',
                   f'--train_script={tmp_path / "fake_train.py"}',
                   '--gin_file=configs/dqn_cartpole.gin']
        return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)

    doomed, survivor = worker('a'), worker('b')
    started_log = tmp_path / 'a' / 'shared' / 'sweep.log'
    deadline = time.monotonic() + 180
    while not (started_log.exists() and '"start"' in started_log.read_text()):
        assert doomed.poll() is None, doomed.stdout.read()
        assert time.monotonic() < deadline, 'worker a never started a trial'
        time.sleep(0.2)
    os.killpg(doomed.pid, signal.SIGKILL)  # the worker and the trial it runs
    doomed.wait(timeout=30)
    output = survivor.communicate(timeout=400)[0]
    assert survivor.returncode == 0, output

    study = optuna.load_study(study_name='shared', storage=postgres_url)
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) == 4, states
    assert optuna.trial.TrialState.RUNNING not in states
    killed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL
              and t.user_attrs.get('sweep_outcome') != 'surplus']
    assert killed, 'the killed worker left no failed (stale) trial to retry'
