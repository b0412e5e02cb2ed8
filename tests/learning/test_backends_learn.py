"""DQN reaches the CartPole bar with every replay backend (slow; one seed each)."""

import pytest

from app import cli
from tests.smoke.test_train import ROOT

BACKENDS = ['uniform', 'prioritized', 'reverb_uniform', 'reverb_prioritized']


@pytest.mark.slow
@pytest.mark.parametrize('backend', BACKENDS)
def test_dqn_cartpole_learns_with_backend(backend, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    metrics = cli.train_main([
        '--gin_file=configs/dqn_cartpole.gin',
        f'--gin_file=configs/buffers/{backend}.gin',
        f'--root_dir={tmp_path / "run"}',
        '--gin_bindings=run.stop_at_target_return=True',
        '--gin_bindings=run.export_final_policy=False',
    ])
    assert metrics['steps_to_target'] is not None and metrics['steps_to_target'] <= 50_000, metrics
