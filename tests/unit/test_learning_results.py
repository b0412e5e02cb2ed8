"""bench.learning_results builds its table and curve from real run directories."""

from bench import learning_results
from experiment import cli
from tests.smoke.test_train import TINY


def test_a_finished_run_gets_a_row_and_a_curve(tmp_path):
    runs = tmp_path / 'runs'
    cli.train_main(TINY + [f'--root_dir={runs / "cartpole_s3"}', '--seed=3',
                           '--gin_bindings=run.export_final_policy=False'])
    (runs / 'not_a_run').mkdir()
    learning_results.main(['--runs', str(runs), '--docs', str(tmp_path / 'docs')])
    text = (tmp_path / 'docs' / 'learning_results.md').read_text()
    assert '| CartPole-v1 | 1 of 1 |' in text  # finished: its final eval is in the summary
    assert '| CartPole-v1 | 3 | 400 |' in text and '(in progress)' not in text
    assert (tmp_path / 'docs' / 'img' / 'learning_CartPole.png').stat().st_size > 1000
