"""The trial launcher with stand-in train scripts: finish, skip, crash, changed config."""

import os
import textwrap

import pytest

from sweeps import log, trial, validate

SCRIPT = textwrap.dedent("""
    import argparse, json, os, sys
    parser = argparse.ArgumentParser()
    parser.add_argument('--gin_file', action='append')
    parser.add_argument('--gin_bindings', action='append', default=[])
    parser.add_argument('--root_dir')
    parser.add_argument('--seed', type=int)
    parser.add_argument('--force', action='store_true')
    args = parser.parse_args()
    if os.environ.get('FAKE_CRASH'):
        print('step 10/200')
        print('error: Something the user can fix.')
        sys.exit(2)
    with open(os.path.join(args.root_dir, 'config.gin'), 'w') as f:
        f.write('config A')
    with open(os.path.join(args.root_dir, 'metrics.json'), 'w') as f:
        json.dump({'env_steps': 200, 'interrupted': False, 'seed': args.seed,
                   'force': args.force}, f)
""")


@pytest.fixture
def setup(tmp_path):
    script = tmp_path / 'fake_train.py'
    script.write_text(SCRIPT)
    event_log = log.EventLog(str(tmp_path))

    def launcher(force=False):
        return trial.Launcher(['x.gin'], event_log, train_script=str(script), force=force,
                              echo=lambda _: None)

    def make(config_str='config A', budget=200):
        config = validate.TrialConfig(num_env_steps=budget, stop_at_target_return=False,
                                      config_str=config_str)
        return trial.Trial(label='lr=1', params=(('a.lr', 1),), seed=3, bindings=('a.lr = 1',),
                           root_dir=trial.trial_dir(str(tmp_path), 'lr=1', 3), config=config)
    return tmp_path, launcher(), make, launcher


def events(tmp_path):
    return [e['event'] for e in log.read(str(tmp_path))]


def test_a_finished_trial_is_skipped_on_rerun(setup):
    tmp_path, launcher, make, _ = setup
    first = launcher.run(make())
    assert first.status == 'finished' and first.metrics['seed'] == 3
    assert launcher.run(make()).status == 'skipped'
    assert events(tmp_path) == ['start', 'finish', 'skip']


def test_a_trial_short_of_its_budget_runs_again(setup):
    tmp_path, launcher, make, _ = setup
    launcher.run(make())
    assert launcher.run(make(budget=400)).status == 'crashed'  # the script stops at 200
    assert events(tmp_path) == ['start', 'finish', 'start', 'crash']


def test_a_crash_names_the_error_line_and_the_log(setup, monkeypatch):
    tmp_path, launcher, make, _ = setup
    monkeypatch.setenv('FAKE_CRASH', '1')
    outcome = launcher.run(make())
    assert outcome.status == 'crashed'
    assert outcome.detail.startswith('exit status 2: error: Something the user can fix.')
    assert os.path.join('lr=1', 'seed_3', 'train.log') in outcome.detail
    assert launcher.crashed == ['lr=1/seed_3']


def test_a_run_of_another_config_is_not_reused_unless_forced(setup):
    tmp_path, launcher, make, new_launcher = setup
    launcher.run(make())
    outcome = launcher.run(make(config_str='config B'))
    assert outcome.status == 'crashed' and 'pass --force' in outcome.detail
    forced = new_launcher(force=True).run(make(config_str='config B'))
    assert forced.status == 'finished' and forced.metrics['force'] is True
