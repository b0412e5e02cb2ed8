"""Sweeps as Slurm job arrays on the live local cluster (tests/slurm/conftest.py).

Trials are a stand-in for train.py (FAKE_TRAIN below): one "env step" every CHUNK_S, a checkpoint
after each, resumed on restart, and on SIGTERM/SIGINT it stops after the step in progress -- what
train.py does with its chunks. It records every start, save and stop with the Slurm task it ran
in, so a test can see that a requeued trial resumed where it stopped.

* A 4-trial Optuna search on a real PostgreSQL server (tests/smoke/test_sweep_postgres.py's
  fixture), as an array of 2 tasks: one task is requeued mid-trial (`scontrol requeue`), the
  study still ends with exactly 4 complete trials, the interrupted one resumed from its last
  checkpoint, and rerunning the submit command adds no trials.
* A 4-trial grid as an array of 2 tasks: one task gets the time-limit warning (USR1 to its batch
  shell) mid-trial, saves, requeues itself -- and only itself, not the whole array -- and every
  trial ends finished once, the interrupted one resumed.
"""

import glob
import json
import os
import subprocess
import textwrap

import optuna
import pytest

from core.errors import UserError
from sweeps import slurm_array
from tests.slurm.conftest import job_field, wait_for
from tests.smoke.test_sweep_postgres import postgres_url  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 40  # run.num_env_steps of every trial: 40 x CHUNK_S = 20 s of "training"
FAKE_TRAIN = textwrap.dedent("""
    # Stands in for train.py: one step per CHUNK_S, a checkpoint after each, resumed on restart;
    # SIGTERM or SIGINT stops it after the step in progress, with metrics.json saying so.
    import argparse, json, os, signal, time
    CHUNK_S = 0.5
    parser = argparse.ArgumentParser()
    parser.add_argument('--gin_file', action='append')
    parser.add_argument('--gin_bindings', action='append', default=[])
    parser.add_argument('--root_dir')
    parser.add_argument('--seed', type=int)
    parser.add_argument('--force', action='store_true')
    args = parser.parse_args()
    bindings = dict(binding.split(' = ', 1) for binding in args.gin_bindings)
    total = int(bindings['run.num_env_steps'])
    lr = float(bindings['dqn.make_agent.learning_rate'])
    stop = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.append(1))
    checkpoint = os.path.join(args.root_dir, 'checkpoint.json')

    def note(event, step):
        record = {'event': event, 'step': step, 'pid': os.getpid(),
                  'array_job': os.environ.get('SLURM_ARRAY_JOB_ID'),
                  'task': os.environ.get('SLURM_ARRAY_TASK_ID'),
                  'restart': os.environ.get('SLURM_RESTART_COUNT', '0')}
        with open(os.path.join(args.root_dir, 'progress.jsonl'), 'a') as f:
            f.write(json.dumps(record) + '\\n')

    step = 0
    if os.path.exists(checkpoint):
        with open(checkpoint) as f:
            step = json.load(f)['step']
    note('start', step)
    while step < total and not stop:
        time.sleep(CHUNK_S)  # the chunk in progress finishes even when a signal arrives
        step += 1
        with open(checkpoint + '.tmp', 'w') as f:
            json.dump({'step': step}, f)
        os.replace(checkpoint + '.tmp', checkpoint)
        note('save', step)
    metrics = {'env_steps': step, 'interrupted': step < total,
               'final_eval_return': 1000 * lr + args.seed, 'best_eval_return': 1000 * lr,
               'steps_to_target': None, 'wall_time_s': step * CHUNK_S}
    with open(os.path.join(args.root_dir, 'metrics.json'), 'w') as f:
        json.dump(metrics, f)
    note('done' if step >= total else 'stopped', step)
""")
SEARCH_SPEC = f"""
name: slurm_search
seeds: [0]
bindings:
  run.num_env_steps: {STEPS}
search:
  sampler: random
  num_trials: 4
  heartbeat_s: 2
  params:
    dqn.make_agent.learning_rate: {{type: float, low: 1.0e-4, high: 1.0e-2, log: true}}
"""
GRID_SPEC = f"""
name: slurm_grid
seeds: [0, 1]
bindings:
  run.num_env_steps: {STEPS}
grid:
  dqn.make_agent.learning_rate: [1.0e-3, 1.0e-2]
"""


def submit_args(tmp_path, spec_text, *extra):
    (tmp_path / 'fake_train.py').write_text(FAKE_TRAIN)
    (tmp_path / 'sweep.yaml').write_text(spec_text)
    return [f'--sweep={tmp_path / "sweep.yaml"}', '--gin_file=configs/dqn_cartpole.gin',
            f'--root_dir={tmp_path / "runs"}', f'--train_script={tmp_path / "fake_train.py"}',
            '--array=2', '--cpus_per_task=1', '--time=15', *extra]


def progress(trial_dir):
    path = os.path.join(trial_dir, 'progress.jsonl')
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def a_trial_mid_run(sweep_dir, task_id=None):
    """(trial dir, its records) of a trial a few checkpoints in and far from done (run by that
    array task, if given), else None."""
    for trial_dir in sorted(glob.glob(os.path.join(sweep_dir, '*', 'seed_*'))):
        records = progress(trial_dir)
        if records and records[-1]['event'] == 'save' and 4 <= records[-1]['step'] <= STEPS - 12 \
                and task_id in (None, records[-1]['task']):
            return trial_dir, records
    return None


def queued(array_job):
    """squeue's lines for the array's tasks still pending, running or completing."""
    done = subprocess.run(['squeue', '-h', '-j', str(array_job), '-o', '%i %T'],
                          capture_output=True, text=True, timeout=30)
    return [line for line in done.stdout.splitlines() if line.strip()]


def restarted(task):
    """True once the requeued task runs again (Slurm starts it once its old credential has
    expired: ~10-30 s on the test cluster)."""
    state = job_field(task, 'JobState')
    return int(job_field(task, 'Restarts') or 0) >= 1 and state in (
        'RUNNING', 'COMPLETING', 'COMPLETED')


def slurm_logs(root_dir):
    text = ''
    for path in sorted(glob.glob(os.path.join(root_dir, 'slurm', '*.out'))):
        with open(path, errors='replace') as f:
            text += f'==> {path}\n{f.read()[-2500:]}\n'
    return text


def interrupt_mid_trial(sweep_dir, signal_task, task_id=None):
    """Waits for a trial mid-run, signals its task (signal_task(task id)), waits until the task
    runs again. Returns (trial dir, step saved before, the task)."""
    found = wait_for(lambda: a_trial_mid_run(sweep_dir, task_id), 400, 'a trial mid-run',
                     poll_s=0.5)
    trial_dir, records = found
    task = f"{records[-1]['array_job']}_{records[-1]['task']}"
    signal_task(task)
    wait_for(lambda: restarted(task), 180, f'task {task} to be requeued and run again',
             poll_s=1.0)
    return trial_dir, records[-1]['step'], task


def assert_resumed(trial_dir, saved_before):
    """The trial stopped once after the chunk in progress and resumed from that checkpoint."""
    records = progress(trial_dir)
    starts = [i for i, r in enumerate(records) if r['event'] == 'start']
    assert len(starts) == 2, records
    stopped = records[starts[1] - 1]
    assert stopped['event'] == 'stopped', records  # it saved and exited, not killed
    assert stopped['step'] >= saved_before
    assert records[starts[1]]['step'] == stopped['step'] > 0  # resumed, not from step 0
    assert [r['step'] for r in records if r['event'] == 'save'] == list(range(1, STEPS + 1))
    assert records[-1] == {**records[-1], 'event': 'done', 'step': STEPS}


def test_a_search_array_requeued_mid_trial_completes_exactly_its_trials(
        slurm_cluster, postgres_url, tmp_path):  # noqa: F811  (the fixture)
    args = submit_args(tmp_path, SEARCH_SPEC, f'--storage={postgres_url}')
    root_dir = str(tmp_path / 'runs')
    sweep_dir = os.path.join(root_dir, 'slurm_search')
    job = slurm_array.main(args)['job_id']
    with pytest.raises(UserError, match=f'sweep-slurm_search is already queued or running as '
                                        f'job {job}'):
        slurm_array.main(args)  # a second array of the same sweep would only double up

    def requeue(task):
        subprocess.run(['scontrol', 'requeue', task], check=True, timeout=30)

    trial_dir, saved_before, task = interrupt_mid_trial(sweep_dir, requeue)
    wait_for(lambda: not queued(job), 600, f'array {job} to finish', poll_s=2.0)
    logs = slurm_logs(root_dir)
    assert int(job_field(task, 'Restarts')) == 1, logs
    for one in ('0', '1'):
        assert job_field(f'{job}_{one}', 'JobState') == 'COMPLETED', logs

    study = optuna.load_study(study_name='slurm_search', storage=postgres_url)
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) == 4, (states, logs)
    assert not {optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING} & set(states)
    assert_resumed(trial_dir, saved_before)
    label = os.path.basename(os.path.dirname(trial_dir))
    assert [t.user_attrs['config'] for t in study.trials
            if t.state == optuna.trial.TrialState.COMPLETE].count(label) == 1
    assert len(glob.glob(os.path.join(sweep_dir, '*', 'seed_0', 'metrics.json'))) == 4
    with open(os.path.join(sweep_dir, 'results.csv')) as f:
        assert len(f.read().strip().splitlines()) == 1 + 4  # the last task's table has all 4

    # Rerunning the command resubmits; the study is complete, so no task adds a trial.
    count = len(study.trials)
    again = slurm_array.main(args)['job_id']
    wait_for(lambda: not queued(again), 300, f'array {again} to finish', poll_s=2.0)
    for one in ('0', '1'):
        assert job_field(f'{again}_{one}', 'JobState') == 'COMPLETED', slurm_logs(root_dir)
    study = optuna.load_study(study_name='slurm_search', storage=postgres_url)
    assert len(study.trials) == count
    assert [t.state for t in study.trials].count(optuna.trial.TrialState.COMPLETE) == 4


def test_a_grid_array_task_warned_before_its_time_limit_requeues_only_itself(
        slurm_cluster, tmp_path):
    args = submit_args(tmp_path, GRID_SPEC)
    root_dir = str(tmp_path / 'runs')
    sweep_dir = os.path.join(root_dir, 'slurm_grid')
    job = slurm_array.main(args)['job_id']

    def warn(task):  # what Slurm sends warning_s before the time limit (--signal=B:USR1@...)
        subprocess.run(['scancel', '--batch', '--signal=USR1', task], check=True, timeout=30)

    # Warn the task whose own job id is the array's: `scontrol requeue <that id>` would requeue
    # every task of the array, so the script must name it <array id>_<task id>.
    wait_for(lambda: all(job_field(f'{job}_{one}', 'JobState') == 'RUNNING' for one in (0, 1)),
             120, f'both tasks of array {job} to run', poll_s=0.5)
    namesake = next(one for one in ('0', '1') if job_field(f'{job}_{one}', 'JobId') == job)
    trial_dir, saved_before, task = interrupt_mid_trial(sweep_dir, warn, namesake)
    wait_for(lambda: not queued(job), 600, f'array {job} to finish', poll_s=2.0)
    logs = slurm_logs(root_dir)
    other = f'{job}_{1 - int(task.split("_")[1])}'
    assert int(job_field(task, 'Restarts')) == 1, logs
    assert int(job_field(other, 'Restarts')) == 0, logs  # the requeue named this task only
    assert 'time-limit warning: saving, then requeue' in logs
    for one in (task, other):
        assert job_field(one, 'JobState') == 'COMPLETED', logs
    assert_resumed(trial_dir, saved_before)
    trial_dirs = glob.glob(os.path.join(sweep_dir, '*', 'seed_*'))
    assert len(trial_dirs) == 4
    for one in trial_dirs:
        assert json.load(open(os.path.join(one, 'metrics.json')))['env_steps'] == STEPS
        if one != trial_dir:
            assert [r['event'] for r in progress(one)].count('start') == 1, one
    with open(os.path.join(sweep_dir, 'results.csv')) as f:
        assert len(f.read().strip().splitlines()) == 1 + 2  # 2 configurations x 2 seeds

