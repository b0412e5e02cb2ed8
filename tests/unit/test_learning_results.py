"""bench.learning_results builds its table and curve from real run directories, and keeps
every run it has seen in its archive so a lost run directory does not drop a seed."""

import shutil

from bench import learning_results, run_archive
from experiment import cli
from tests.smoke.test_train import TINY


def test_a_finished_run_gets_a_row_and_a_curve_and_outlives_its_directory(tmp_path):
    runs, docs = tmp_path / 'runs', tmp_path / 'docs'
    cli.train_main(TINY + [f'--root_dir={runs / "cartpole_s3"}', '--seed=3',
                           '--gin_bindings=run.export_final_policy=False'])
    (runs / 'not_a_run').mkdir()
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
