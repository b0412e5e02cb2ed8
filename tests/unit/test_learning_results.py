"""reports.learning_results and reports.preprocessing_results build their tables from real run
directories, and keep every run they have seen in an archive so a lost run directory does not
drop a seed."""

import shutil

import pytest

from app import cli
from reports import learning_results, preprocessing_results, run_archive
from tests.smoke.test_train import TINY


@pytest.fixture(scope='module')
def trained_runs(tmp_path_factory):
    """A runs/ directory with one finished tiny CartPole run (seed 3), and a non-run."""
    runs = tmp_path_factory.mktemp('trained') / 'runs'
    cli.train_main(TINY + [f'--root_dir={runs / "cartpole_s3"}', '--seed=3',
                           '--gin_bindings=run.export_final_policy=False'])
    (runs / 'not_a_run').mkdir()
    return runs


def test_a_finished_run_gets_a_row_and_a_curve_and_outlives_its_directory(trained_runs,
                                                                          tmp_path):
    runs, docs = tmp_path / 'runs', tmp_path / 'docs'
    shutil.copytree(trained_runs, runs)
    learning_results.main(['--runs', str(runs), '--docs', str(docs)])
    text = (docs / 'learning_results.md').read_text()
    assert '| CartPole-v1 | 1 of 1 |' in text  # finished: its final eval is in the summary
    assert '| CartPole-v1 | 3 | 400 |' in text and '(in progress)' not in text
    assert (docs / 'img' / 'learning_CartPole.png').stat().st_size > 1000

    archived = run_archive.load(str(docs / 'data' / 'learning_runs.json'))
    shutil.rmtree(runs)  # the machine that trained it is gone
    learning_results.main(['--runs', str(runs), '--docs', str(docs)])
    assert (docs / 'learning_results.md').read_text().split('\n')[3:] == text.split('\n')[3:]
    assert run_archive.load(str(docs / 'data' / 'learning_runs.json')) == archived
    assert archived[0]['curve'] and archived[0]['curve'][-1][0] == 400


def test_a_restarted_run_replaces_its_record_only_once_it_gets_further():
    def key(record):
        return (record['env_id'], record['seed'])

    finished = {'env_id': 'Hopper-v5', 'seed': 1, 'reached': 1_000_000, 'final_eval': 3300.0}
    restarted = dict(finished, reached=200_000, final_eval=900.0)
    other_seed = dict(restarted, seed=2)
    merged = run_archive.merge([finished], [restarted, other_seed], key)
    assert merged == [finished, other_seed]
    caught_up = dict(finished, final_eval=3400.0)
    assert run_archive.merge(merged, [caught_up], key) == [caught_up, other_seed]


def test_preprocessing_results_outlive_their_run_directories(trained_runs, tmp_path):
    runs = tmp_path / 'runs'
    shutil.copytree(trained_runs, runs)
    output, archive = tmp_path / 'pre.md', str(tmp_path / 'pre.json')
    args = ['--runs', str(runs), '--output', str(output), '--archive', archive]
    preprocessing_results.main(args)
    text = output.read_text()
    assert '| cartpole | 3 | 400 |' in text and '| cartpole | CartPole-v1 | `[]` |' in text
    shutil.rmtree(runs)
    preprocessing_results.main(args)
    assert output.read_text().split('\n')[3:] == text.split('\n')[3:]
    assert [record['seed'] for record in run_archive.load(archive)] == [3]
