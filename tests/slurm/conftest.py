"""A live one-node Slurm cluster for the tests in this folder (scripts/slurm.sh, `make slurm`).

Its jobs come back from a requeue after ~10-30 s (cred_expire=10 and the scheduler's pass), so
the tests wait for Slurm as a user would; releasing a requeued job early races the revocation
of its old credential and Slurm then kills the restart ("Job credential revoked").

Started once per test session in a temporary directory and stopped at its end. Where Slurm is
not installed, it is installed from Debian's packages when this runs as root with apt-get;
otherwise the tests skip with that reason. Every test here is slow (`make test-slow`).
"""

import os
import shutil
import subprocess
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, 'scripts', 'slurm.sh')
LAST_LOGS = '/tmp/rl-slurm-last-logs'  # the last test cluster's daemon logs


def _installed():
    return all(shutil.which(name) or os.path.exists(f'/usr/sbin/{name}')
               for name in ('slurmctld', 'slurmd', 'munged', 'sbatch'))


@pytest.fixture(scope='session')
def slurm_cluster():
    """The cluster's state dir; SLURM_CONF is set in this process (children inherit it)."""
    if not _installed():
        if os.geteuid() != 0 or shutil.which('apt-get') is None:
            pytest.skip('Slurm is not installed and cannot be installed here (needs root and '
                        'apt-get: apt-get install slurm-wlm munge)')
        done = subprocess.run([SCRIPT, 'install'], capture_output=True, text=True, timeout=900)
        if done.returncode != 0 or not _installed():
            pytest.skip(f'Slurm could not be installed: {done.stderr.strip()[-300:]}')
    state = tempfile.mkdtemp(prefix='rl-slurm-', dir='/tmp')
    started = subprocess.run([SCRIPT, 'start', state], capture_output=True, text=True,
                             timeout=180)
    assert started.returncode == 0, started.stderr
    previous = os.environ.get('SLURM_CONF')
    os.environ['SLURM_CONF'] = os.path.join(state, 'slurm.conf')
    try:
        yield state
    finally:
        subprocess.run([SCRIPT, 'stop', state], capture_output=True, timeout=180)
        # The daemons' logs outlive the cluster, for a failure's post-mortem.
        shutil.rmtree(LAST_LOGS, ignore_errors=True)
        shutil.copytree(os.path.join(state, 'log'), LAST_LOGS, dirs_exist_ok=True)
        if previous is None:
            os.environ.pop('SLURM_CONF', None)
        else:
            os.environ['SLURM_CONF'] = previous
        shutil.rmtree(state, ignore_errors=True)


def job_field(job_id, field):
    """One field of `scontrol show job` (e.g. JobState, Restarts), or None once it is gone."""
    done = subprocess.run(['scontrol', 'show', 'job', str(job_id)], capture_output=True,
                          text=True, timeout=30)
    for token in done.stdout.split():
        if token.startswith(f'{field}='):
            return token.split('=', 1)[1]
    return None


def wait_for(predicate, timeout_s, what, poll_s=1.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f'timed out after {timeout_s} s waiting for {what}')
