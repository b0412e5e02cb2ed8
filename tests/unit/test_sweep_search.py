"""The Optuna search loop against a real SQLite study, with a fake trial launcher.

The launcher stands in for train.py subprocesses, so these tests check the
bookkeeping -- num_trials never overshot, killed and interrupted trials re-run
once, crashes counted -- in a second, not a minute.
"""

import os
import threading
import time

import optuna
import pytest

from sweeps import search, spec, trial

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GIN_FILES = ['configs/dqn_cartpole.gin']
LR = 'dqn.make_agent.learning_rate'


class FakeLauncher:
    """Records the trials it is asked to run and reports a fixed status."""

    def __init__(self, status='finished', stop_on_run=False):
        self.status = status
        self.stop_on_run = stop_on_run
        self.stop_requested = False
        self.crashed = []
        self.runs = []
        self._lock = threading.Lock()

    def run(self, one):
        with self._lock:
            self.runs.append(one)
        time.sleep(0.01)
        if self.stop_on_run:
            self.stop_requested = True
        lr = dict(one.params)[LR]
        return trial.Outcome(self.status, metrics={
            'best_eval_return': 1000 * lr, 'final_eval_return': lr, 'steps_to_target': None,
            'wall_time_s': 1.0, 'env_steps': 10, 'interrupted': self.status == 'interrupted'})

    def lrs(self):
        return [dict(one.params)[LR] for one in self.runs]


@pytest.fixture
def sweep(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # Gin resolves the configs' includes from the repo root

    def make(num_trials, seeds=(0,), heartbeat_s=10):
        parsed = spec.parse({
            'name': 'study', 'seeds': list(seeds),
            'search': {'sampler': 'random', 'num_trials': num_trials, 'heartbeat_s': heartbeat_s,
                       'params': {LR: {'type': 'float', 'low': 1e-4, 'high': 1e-2, 'log': True}}},
        }, 'test.yaml')
        sweep_dir = str(tmp_path / 'study')
        return parsed, sweep_dir, search.storage_url(parsed, sweep_dir)
    return make


def run(parsed, sweep_dir, url, launcher, workers=1):
    search.run(parsed, GIN_FILES, [], sweep_dir, launcher, workers, url, echo=lambda _: None)
    study, _ = search.open_study(parsed, url)
    return study.get_trials()


def states(trials):
    return sorted(t.state.name for t in trials)


def test_parallel_workers_run_exactly_num_trials(sweep):
    parsed, sweep_dir, url = sweep(num_trials=4, seeds=(0, 1))
    launcher = FakeLauncher()
    trials = run(parsed, sweep_dir, url, launcher, workers=3)
    complete = [t for t in trials if t.state.name == 'COMPLETE']
    assert len(complete) == 4
    assert all(t.user_attrs.get(search.OUTCOME) == 'surplus'
               for t in trials if t.state.name != 'COMPLETE')
    assert len(launcher.runs) == 8  # 4 configurations x 2 seeds, none twice
    assert len({(one.label, one.seed) for one in launcher.runs}) == 8
    results = search.collect(parsed, url, sweep_dir)
    assert [len(result.runs) for result in results] == [2, 2, 2, 2]
    objectives = [result.runs[0].metrics['best_eval_return'] for result in results]
    assert objectives == sorted(objectives, reverse=True)  # maximize: best first
    # A rerun of a finished study asks nothing.
    assert len(run(parsed, sweep_dir, url, FakeLauncher())) == len(trials)


def test_killed_trial_is_retried_once_and_not_counted_twice(sweep):
    parsed, sweep_dir, url = sweep(num_trials=2, heartbeat_s=1)
    study, storage = search.open_study(parsed, url)
    killed = study.ask(search.distributions(parsed.search))  # its worker then "dies"
    storage.record_heartbeat(killed._trial_id)
    time.sleep(4.5)  # past the 3 x heartbeat grace period (SQLite clocks tick in seconds)
    launcher = FakeLauncher()
    trials = run(parsed, sweep_dir, url, launcher)
    assert states(trials) == ['COMPLETE', 'COMPLETE', 'FAIL']
    assert launcher.lrs().count(killed.params[LR]) == 1
    assert len(launcher.runs) == 2


def test_interrupted_trial_is_requeued_with_its_configuration(sweep):
    parsed, sweep_dir, url = sweep(num_trials=2)
    first = FakeLauncher(status='interrupted', stop_on_run=True)
    trials = run(parsed, sweep_dir, url, first)
    assert states(trials) == ['FAIL', 'WAITING']
    second = FakeLauncher()
    trials = run(parsed, sweep_dir, url, second)
    assert states(trials) == ['COMPLETE', 'COMPLETE', 'FAIL']
    assert second.lrs()[0] == first.lrs()[0]  # the interrupted configuration resumes first


def test_crashed_trials_count_and_stop_the_search(sweep):
    parsed, sweep_dir, url = sweep(num_trials=2, seeds=(0, 1))
    launcher = FakeLauncher(status='crashed')
    trials = run(parsed, sweep_dir, url, launcher)
    assert states(trials) == ['FAIL', 'FAIL']
    assert all(t.user_attrs[search.OUTCOME] == 'crashed' for t in trials)
    assert len(launcher.runs) == 2  # the second seed of a crashed configuration is not run


def test_objective_counts_an_unreached_target_as_the_steps_run():
    seed_metrics = [{'steps_to_target': 300, 'env_steps': 1000},
                    {'steps_to_target': None, 'env_steps': 1000}]
    assert search.objective('steps_to_target', seed_metrics) == 650.0


def test_non_scalar_choices_round_trip_through_optuna():
    parsed = spec.parse({'name': 'x', 'search': {'num_trials': 1, 'params': {
        'dqn.make_agent.fc_layer_params': {'type': 'categorical', 'choices': [[64, 64], [100]]}}}})
    distribution = search.distributions(parsed.search)['dqn.make_agent.fc_layer_params']
    assert distribution.choices == ('(64, 64)', '(100,)')
    assert search.params_of(parsed.search, {'dqn.make_agent.fc_layer_params': '(100,)'}) == (
        ('dqn.make_agent.fc_layer_params', [100]),)


def test_unreachable_storage_is_one_line(sweep, tmp_path):
    parsed, _, _ = sweep(num_trials=1)
    with pytest.raises(Exception) as error:
        search.open_study(parsed, f'sqlite:///{tmp_path}/no/such/dir/study.db')
    assert 'Cannot open the Optuna storage' in str(error.value)
    assert '\n' not in str(error.value)
    assert optuna.__version__
