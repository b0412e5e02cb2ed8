"""The batch scripts `python -m app.slurm ...` writes (--dry_run), and what it refuses.

Sweeps (sweeps/slurm_array.py, entry and work): the tests named test_sweep_*.
The live-cluster runs of these scripts are in tests/slurm/ (slow).
"""

import fcntl
import os
import shlex
import subprocess
import sys
import threading
import time
import types

import pytest

from core.errors import UserError
from sweeps import slurm_array, trial

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEARCH = """
name: tiny_search
seeds: [0, 1]
search:
  sampler: random
  num_trials: 4
  params:
    dqn.make_agent.learning_rate: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}
"""
GRID = """
name: tiny_grid
seeds: [0, 1]
grid:
  dqn.make_agent.learning_rate: [1.0e-3, 1.0e-2]
"""
PG = 'postgresql://sweeper:secret@db.example:5432/sweeps'


def _sweep_dry_run(tmp_path, capsys, spec_text, *args):
    (tmp_path / 'sweep.yaml').write_text(spec_text)
    summary = slurm_array.main([f'--sweep={tmp_path / "sweep.yaml"}',
                                f'--root_dir={tmp_path / "runs"}',
                                '--gin_file=configs/dqn_cartpole.gin', '--dry_run', *args])
    with open(summary['script']) as f:
        script = f.read()
    assert script in capsys.readouterr().out  # --dry_run prints what it wrote
    return summary['script'], script


def _command(script, marker):
    line = next(line for line in script.splitlines() if marker in line)
    assert line.endswith(' &')  # run in the background, so the batch shell takes the signals
    return shlex.split(line[:-2])


def test_sweep_search_script_is_an_array_that_requeues_each_task_and_passes_flags_on(
        tmp_path, capsys):
    path, script = _sweep_dry_run(
        tmp_path, capsys, SEARCH, f'--storage={PG}', '--array=4', '--time=4:00:00',
        '--partition=gpu', '--warning_s=300', '--cpus_per_task=3', '--sbatch=--constraint=x',
        "--gin_bindings=make_env.env_id='CartPole-v1'", '--force')
    assert path == str(tmp_path / 'runs' / 'slurm' / 'sweep-tiny_search.sbatch')
    assert os.access(path, os.X_OK)
    lines = script.splitlines()
    for line in ('#SBATCH --array=0-3', '#SBATCH --requeue', '#SBATCH --signal=B:USR1@300',
                 '#SBATCH --time=4:00:00', '#SBATCH --partition=gpu',
                 '#SBATCH --cpus-per-task=3', '#SBATCH --constraint=x',
                 '#SBATCH --open-mode=append', '#SBATCH --job-name=sweep-tiny_search',
                 f'#SBATCH --output={tmp_path}/runs/slurm/sweep-%A_%a.out'):
        assert line in lines, line
    assert _command(script, 'sweep.py') == [
        sys.executable, os.path.join(ROOT, 'sweep.py'), f'--sweep={tmp_path}/sweep.yaml',
        f'--root_dir={tmp_path}/runs', f'--storage={PG}', '--workers=1',
        '--gin_file=configs/dqn_cartpole.gin', "--gin_bindings=make_env.env_id='CartPole-v1'",
        '--force']
    # The task requeues itself only: an array task's bare job id can name the whole array.
    assert 'task=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}' in script
    assert 'scontrol requeue "${task:-$SLURM_JOB_ID}"' in script
    assert "trap 'requeue=1;" in script and f'cd {ROOT}' in lines
    assert 'postgresql://sweeper:***@db.example:5432/sweeps' in script  # in the comment


def test_sweep_grid_script_runs_grid_tasks_and_keeps_the_users_workers(tmp_path, capsys):
    _, script = _sweep_dry_run(tmp_path, capsys, GRID, '--array=2', '--max_running=1',
                               '--workers=2', '--job_name=lr')
    assert '#SBATCH --array=0-1%1' in script.splitlines()
    assert '#SBATCH --job-name=lr' in script.splitlines()
    line = next(line for line in script.splitlines() if 'grid_task' in line)
    assert '--task="${SLURM_ARRAY_TASK_ID}"' in line  # bash expands it in each task
    assert shlex.split(line[:-2].replace('"${SLURM_ARRAY_TASK_ID}"', 'K')) == [
        sys.executable, '-m', 'sweeps.slurm_array', 'grid_task', '--task=K', '--tasks=2',
        f'--sweep={tmp_path}/sweep.yaml', f'--root_dir={tmp_path}/runs',
        '--gin_file=configs/dqn_cartpole.gin', '--workers=2']  # the user's, not a second one


def test_sweep_one_task_may_keep_a_search_in_sqlite(tmp_path, capsys):
    _, script = _sweep_dry_run(tmp_path, capsys, SEARCH, '--array=1')
    assert '#SBATCH --array=0-0' in script.splitlines()
    assert '--storage' not in _command(script, 'sweep.py')  # sweep.py's default study.db


def test_sweep_a_gin_file_found_only_from_here_is_made_absolute(tmp_path, capsys, monkeypatch):
    (tmp_path / 'mine.gin').write_text('')
    monkeypatch.chdir(tmp_path)
    _, script = _sweep_dry_run(tmp_path, capsys, GRID, '--array=1', '--gin_file', 'mine.gin')
    assert f'--gin_file={tmp_path}/mine.gin' in _command(script, 'grid_task')


@pytest.mark.parametrize('spec_text, args, message', [
    (SEARCH, ['--array=2'], 'error: search sweep tiny_search with --array=2 has no --storage '
                            '(the default is SQLite)'),
    (SEARCH, ['--array=2', '--storage=sqlite:////shared/study.db'],
     'error: search sweep tiny_search with --array=2 has storage sqlite:////shared/study.db'),
    (SEARCH.replace('num_trials: 4', 'num_trials: 4\n  sampler_seed: 3'),
     ['--array=2', f'--storage={PG}'], 'sets sampler_seed: with --array=2 every task would '
                                       'propose the same configurations'),
    (SEARCH, ['--array=5', f'--storage={PG}'], 'error: --array=5 but sweep tiny_search has 4 '
                                               'trial(s): give --array=4 or fewer'),
    (GRID, ['--array=5'], 'error: --array=5 but sweep tiny_grid has 4 trial(s)'),
    (GRID, ['--array=0'], 'error: --array must be at least 1 task, got 0.'),
    (GRID, ['--array=2', '--max_running=0'], 'error: --max_running must be at least 1'),
    (GRID, ['--array=2', '--cpus_per_task=0'], 'error: --cpus_per_task must be >= 1, got 0.'),
    (GRID, ['--array=2', '--gin_file=configs/no_such.gin'],
     'error: --gin_file=configs/no_such.gin: no such file'),
    ('name: x\nseeds: [0]\n', ['--array=1'], "has neither of 'grid' and 'search'"),
])
def test_sweep_bad_input_is_refused_in_one_line_and_writes_nothing(tmp_path, spec_text, args,
                                                                    message):
    (tmp_path / 'sweep.yaml').write_text(spec_text)
    done = subprocess.run(
        [sys.executable, '-m', 'sweeps.slurm_array', f'--sweep={tmp_path / "sweep.yaml"}',
         f'--root_dir={tmp_path / "runs"}', '--gin_file=configs/dqn_cartpole.gin', '--dry_run',
         *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert message in done.stderr
    assert not (tmp_path / 'runs').exists()


def test_sweep_is_a_subcommand_of_app_slurm(tmp_path):
    (tmp_path / 'sweep.yaml').write_text(GRID)
    done = subprocess.run(
        [sys.executable, '-m', 'app.slurm', 'sweep', f'--sweep={tmp_path / "sweep.yaml"}',
         f'--root_dir={tmp_path / "runs"}', '--gin_file=configs/dqn_cartpole.gin', '--array=2',
         '--dry_run'], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert '#SBATCH --array=0-1' in done.stdout.splitlines()


def test_sweep_without_array_is_refused():
    with pytest.raises(SystemExit):  # argparse: --array is required
        slurm_array.main(['--sweep=configs/sweeps/dqn_lr.yaml', '--root_dir=/tmp/x'])


class _FakeLauncher:
    """Launcher.run's contract: lock the trial dir, run it, write a finished metrics.json."""

    def __init__(self):
        self.stop_requested = False
        self.ran = []

    def run(self, one):
        with open(os.path.join(one.root_dir, '.sweep.lock'), 'a') as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.ran.append(os.path.basename(one.root_dir))
            with open(os.path.join(one.root_dir, 'metrics.json'), 'w') as f:
                f.write('{"env_steps": 10, "interrupted": false}')
        return trial.Outcome('finished')


def test_sweep_grid_task_skips_trials_another_task_holds_and_waits_for_them(tmp_path):
    config = types.SimpleNamespace(num_env_steps=10, stop_at_target_return=False, config_str='')
    trials = [types.SimpleNamespace(root_dir=str(tmp_path / f't{i}'), config=config)
              for i in range(4)]
    for one in trials:
        os.makedirs(one.root_dir)
    (tmp_path / 't0' / 'metrics.json').write_text('{"env_steps": 10, "interrupted": false}')
    held = open(tmp_path / 't2' / '.sweep.lock', 'a')  # "another task" runs t2
    fcntl.flock(held, fcntl.LOCK_EX)
    launcher = _FakeLauncher()
    claims = slurm_array._Claims(trials, launcher, start=1, poll_s=0.05)
    worker = threading.Thread(target=claims.work)
    worker.start()
    deadline = time.monotonic() + 10
    while launcher.ran != ['t1', 't3'] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert launcher.ran == ['t1', 't3']  # t0 finished, t2 held: skipped, not waited on
    assert worker.is_alive()  # waits for t2 ...
    held.close()  # ... whose task died (or was requeued) without finishing it
    worker.join(timeout=10)
    assert launcher.ran == ['t1', 't3', 't2']  # so this task resumes it


def test_sweep_refusals_are_user_errors(tmp_path):
    (tmp_path / 'sweep.yaml').write_text(SEARCH)
    with pytest.raises(UserError, match='need a database server'):
        slurm_array.main([f'--sweep={tmp_path / "sweep.yaml"}', f'--root_dir={tmp_path}/r',
                          '--array=3', '--dry_run'])
