"""End to end through sweep.py: a tiny grid killed and resumed, a shared study, bad input.

Every real trial is a train.py subprocess (~30 s of TF start-up and tracing on
a busy 2-core box), so one 2 x 2 grid is run once for the whole module: it is
killed after its first two trials, resumed, and then every assertion reads
its outputs. The two-worker Optuna test checks the study bookkeeping, so its
trials are a stand-in script that writes metrics.json at once.
"""

import csv
import glob
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import optuna
import pytest
import tensorflow as tf
from tensorboard.plugins.hparams import plugin_data_pb2

from core import tags
from core.errors import UserError
from sweeps import cli as sweep_cli
from sweeps import log

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ['--gin_file=configs/dqn_cartpole.gin', '--gin_file=configs/testing/tiny.gin']
LEARNING_RATES = (0.001, 0.01)
GRID_SPEC = """
name: tiny_grid
seeds: [0, 1]
bindings:
  run.num_env_steps: 200
  run.eval_interval: 100
  run.use_xla: false
  run.export_final_policy: false
  run.target_return: 5.0
grid:
  dqn.make_agent.learning_rate: [1.0e-3, 1.0e-2]
"""


def events(path):
    return list(tf.compat.v1.train.summary_iterator(path))


def event_files(directory):
    return sorted(glob.glob(os.path.join(directory, 'events.out.tfevents.*')))


def wait_for_finishes(process, sweep_dir, count, timeout_s=400):
    """Polls the sweep log until `count` trials finished (or the sweep exited)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        if sum(e['event'] == 'finish' for e in log.read(sweep_dir)) >= count:
            return
        time.sleep(0.5)
    assert process.poll() is not None, 'the sweep did not finish its first trials in time'


@pytest.fixture(scope='module')
def grid_sweep(tmp_path_factory):
    """Runs the tiny grid, SIGKILLs it (and its trials) mid-way, then reruns it to the end."""
    os.chdir(ROOT)
    tmp = tmp_path_factory.mktemp('sweep')
    spec_path = tmp / 'tiny_grid.yaml'
    spec_path.write_text(GRID_SPEC)
    args = TINY + [f'--sweep={spec_path}', f'--root_dir={tmp / "runs"}', '--workers', '2']
    sweep_dir = str(tmp / 'runs' / 'tiny_grid')
    with open(tmp / 'first.log', 'w') as output:
        first = subprocess.Popen([sys.executable, 'sweep.py'] + args, cwd=ROOT, stdout=output,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        wait_for_finishes(first, sweep_dir, count=2)
        time.sleep(1.0)  # let the workers start the next two trials, then kill everything
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    before = log.read(sweep_dir)
    finished_before = {e['trial'] for e in before if e['event'] == 'finish'}
    mtimes = {name: os.stat(os.path.join(sweep_dir, name, 'metrics.json')).st_mtime_ns
              for name in finished_before}
    summary = sweep_cli.main(args)
    return {'dir': sweep_dir, 'args': args, 'summary': summary, 'before': before,
            'finished_before': finished_before, 'mtimes': mtimes,
            'after': log.read(sweep_dir)[len(before):]}


def trial_metrics(sweep_dir, lr, seed):
    with open(os.path.join(sweep_dir, f'learning_rate={lr}', f'seed_{seed}', 'metrics.json')) as f:
        return json.load(f)


def test_table_matches_the_trials_metrics(grid_sweep):
    summary = grid_sweep['summary']
    assert not summary['failed'] and not summary['interrupted']
    with open(os.path.join(grid_sweep['dir'], 'results.csv')) as f:
        rows = {row['config']: row for row in csv.DictReader(f)}
    assert set(rows) == {f'learning_rate={lr}' for lr in LEARNING_RATES}
    for lr in LEARNING_RATES:
        row = rows[f'learning_rate={lr}']
        seeds = [trial_metrics(grid_sweep['dir'], lr, seed) for seed in (0, 1)]
        assert all(m['env_steps'] == 200 and not m['interrupted'] for m in seeds)
        assert (row['learning_rate'], row['seeds_done']) == (str(lr), '2')
        for key in ('final_eval_return', 'best_eval_return', 'steps_to_target', 'wall_time_s'):
            values = [m[key] for m in seeds]
            assert float(row[f'{key}_mean']) == pytest.approx(np.mean(values)), key
            assert float(row[f'{key}_std']) == pytest.approx(np.std(values)), key
    markdown = open(os.path.join(grid_sweep['dir'], 'results.md')).read()
    assert markdown == summary['markdown']
    first = trial_metrics(grid_sweep['dir'], 0.001, 0), trial_metrics(grid_sweep['dir'], 0.001, 1)
    mean = np.mean([m['final_eval_return'] for m in first])
    std = np.std([m['final_eval_return'] for m in first])
    assert f'| learning_rate=0.001 | 2 | {mean:.2f} ± {std:.2f} |' in markdown


def test_curves_match_the_event_files(grid_sweep):
    with open(os.path.join(grid_sweep['dir'], 'curves.csv')) as f:
        rows = list(csv.DictReader(f))
    for lr in LEARNING_RATES:
        per_seed = []
        for seed in (0, 1):
            tb_dir = os.path.join(grid_sweep['dir'], f'learning_rate={lr}', f'seed_{seed}', 'tb')
            per_seed.append({e.step: float(tf.make_ndarray(v.tensor))
                             for path in event_files(tb_dir) for e in events(path)
                             for v in e.summary.value if v.tag == tags.EVAL_AVERAGE_RETURN})
        curve = [r for r in rows if r['config'] == f'learning_rate={lr}']
        assert [int(r['env_steps']) for r in curve] == sorted(per_seed[0]) == sorted(per_seed[1])
        for r in curve:
            values = [seed_curve[int(r['env_steps'])] for seed_curve in per_seed]
            assert float(r['eval_return_mean']) == pytest.approx(np.mean(values))
            assert float(r['eval_return_std']) == pytest.approx(np.std(values))
    with open(os.path.join(grid_sweep['dir'], 'curves.png'), 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'


def hparams_data(directory):
    for path in event_files(directory):
        for event in events(path):
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == 'hparams':
                    yield plugin_data_pb2.HParamsPluginData.FromString(
                        value.metadata.plugin_data.content)


def test_hparams_summaries_for_tensorboard(grid_sweep):
    (experiment,) = [d.experiment for d in hparams_data(grid_sweep['dir'])
                     if d.HasField('experiment')]
    assert [h.name for h in experiment.hparam_infos] == ['learning_rate']
    assert {m.name.tag for m in experiment.metric_infos} >= {'final_eval_return',
                                                            'best_eval_return'}
    for lr in LEARNING_RATES:
        trial_dir = os.path.join(grid_sweep['dir'], f'learning_rate={lr}', 'seed_1')
        (session,) = [d.session_start_info for d in hparams_data(os.path.join(trial_dir,
                                                                              'hparams'))
                      if d.HasField('session_start_info')]
        assert session.hparams['learning_rate'].number_value == pytest.approx(lr)
        finals = [float(tf.make_ndarray(v.tensor))
                  for path in event_files(os.path.join(trial_dir, 'hparams'))
                  for e in events(path) for v in e.summary.value if v.tag == 'final_eval_return']
        assert finals == [trial_metrics(grid_sweep['dir'], lr, 1)['final_eval_return']]


def test_killed_sweep_reruns_only_what_was_left(grid_sweep):
    finished_before = grid_sweep['finished_before']
    assert len(finished_before) >= 2
    started_after = [e['trial'] for e in grid_sweep['after'] if e['event'] == 'start']
    all_trials = {f'learning_rate={lr}/seed_{seed}' for lr in LEARNING_RATES for seed in (0, 1)}
    assert set(started_after) == all_trials - finished_before
    assert len(started_after) == len(set(started_after))  # nothing ran twice in the rerun
    finishes = [e['trial'] for e in grid_sweep['before'] + grid_sweep['after']
                if e['event'] == 'finish']
    assert sorted(finishes) == sorted(all_trials)  # every trial finished exactly once
    for name, mtime in grid_sweep['mtimes'].items():
        assert os.stat(os.path.join(grid_sweep['dir'], name, 'metrics.json')).st_mtime_ns == mtime


def test_rerunning_a_finished_sweep_runs_nothing(grid_sweep):
    count = len(log.read(grid_sweep['dir']))
    summary = sweep_cli.main(grid_sweep['args'])
    new = log.read(grid_sweep['dir'])[count:]
    assert [e['event'] for e in new].count('skip') == 4
    assert 'start' not in [e['event'] for e in new]
    assert summary['results'] == grid_sweep['summary']['results']


def test_edited_sweep_file_is_refused_before_anything_runs(grid_sweep, tmp_path):
    edited = tmp_path / 'tiny_grid.yaml'
    edited.write_text(GRID_SPEC.replace('run.eval_interval: 100', 'run.eval_interval: 50'))
    args = [f'--sweep={edited}' if arg.startswith('--sweep=') else arg
            for arg in grid_sweep['args']]
    count = len(log.read(grid_sweep['dir']))
    with pytest.raises(UserError, match=r'4 trial dir\(s\) hold runs of another config.*--force'):
        sweep_cli.main(args)
    assert len(log.read(grid_sweep['dir'])) == count


@pytest.mark.parametrize('grid, message', [
    ('dqn.make_agent.learnin_rate: [0.1]',
     "learnin_rate = 0.1 in .* is refused: .*doesn't have a parameter named 'learnin_rate'"),
    ('nothing.here: [1]', "nothing.here = 1 in .* is refused: .*No configurable matching"),
    ('dqn.make_agent.learning_rate: [0.1, fast]',
     "learning_rate = 'fast' in .* has the wrong type: expected float"),
    ('run.num_env_steps: [100.5]', 'run.num_env_steps = 100.5 in .* has the wrong type'),
])
def test_bad_bindings_are_refused_before_any_trial_starts(tmp_path, grid, message):
    os.chdir(ROOT)
    spec_path = tmp_path / 'bad.yaml'
    spec_path.write_text(f'name: bad\ngrid:\n  {grid}\n')
    with pytest.raises(UserError, match=message) as error:
        sweep_cli.main(TINY + [f'--sweep={spec_path}', f'--root_dir={tmp_path / "runs"}'])
    assert '\n' not in str(error.value)
    assert not os.path.exists(tmp_path / 'runs')  # nothing was started, not even the log


def test_cli_prints_one_line_and_exits_2(tmp_path):
    spec_path = tmp_path / 'empty.yaml'
    spec_path.write_text('name: empty\nseeds: [0]\n')
    for path, message in [(tmp_path / 'missing.yaml', 'Sweep file not found'),
                          (spec_path, "has neither of 'grid' and 'search'")]:
        result = subprocess.run([sys.executable, 'sweep.py', f'--sweep={path}'] + TINY, cwd=ROOT,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith('error: ') and message in lines[0]


FAKE_TRAIN = textwrap.dedent("""
    # Stands in for train.py: takes its flags, writes a finished metrics.json.
    import argparse, json, os, time
    parser = argparse.ArgumentParser()
    parser.add_argument('--gin_file', action='append')
    parser.add_argument('--gin_bindings', action='append', default=[])
    parser.add_argument('--root_dir')
    parser.add_argument('--seed', type=int)
    args = parser.parse_args()
    bindings = dict(binding.split(' = ', 1) for binding in args.gin_bindings)
    lr = float(bindings['dqn.make_agent.learning_rate'])
    time.sleep(0.3)
    metrics = {'env_steps': int(bindings['run.num_env_steps']), 'interrupted': False,
               'final_eval_return': 1000 * lr + args.seed, 'best_eval_return': 1000 * lr,
               'steps_to_target': None, 'wall_time_s': 0.3}
    with open(os.path.join(args.root_dir, 'metrics.json'), 'w') as f:
        json.dump(metrics, f)
""")
SEARCH_SPEC = """
name: shared
seeds: [0, 1]
bindings:
  run.num_env_steps: 200
search:
  sampler: random
  num_trials: 4
  heartbeat_s: 2
  params:
    dqn.make_agent.learning_rate: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}
"""


def test_two_sweep_processes_share_one_sqlite_study(tmp_path):
    (tmp_path / 'fake_train.py').write_text(FAKE_TRAIN)
    (tmp_path / 'search.yaml').write_text(SEARCH_SPEC)
    command = [sys.executable, 'sweep.py', f'--sweep={tmp_path / "search.yaml"}',
               f'--root_dir={tmp_path / "runs"}', f'--train_script={tmp_path / "fake_train.py"}',
               '--gin_file=configs/dqn_cartpole.gin']
    workers = [subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [worker.communicate(timeout=300)[0] for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], outputs
    sweep_dir = tmp_path / 'runs' / 'shared'
    study = optuna.load_study(study_name='shared', storage=f'sqlite:///{sweep_dir}/study.db')
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 4
    assert all(t.user_attrs.get('sweep_outcome') == 'surplus'
               for t in study.trials if t.state != optuna.trial.TrialState.COMPLETE)
    assert len({t.params['dqn.make_agent.learning_rate'] for t in complete}) == 4
    starts = [e['trial'] for e in log.read(sweep_dir) if e['event'] == 'start']
    assert len(starts) == len(set(starts)) == 8  # 4 configurations x 2 seeds, none twice
    with open(sweep_dir / 'results.csv') as f:
        assert len(list(csv.DictReader(f))) == 4
