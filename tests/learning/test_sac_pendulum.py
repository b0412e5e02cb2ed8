"""SAC learns Pendulum-v1 with the shipped config: a real return threshold (slow)."""

import pytest

from app import cli
from tests.learning.seeds import seeds_reaching_target
from tests.smoke.test_train import ROOT


@pytest.mark.slow
def test_sac_pendulum_reaches_minus_200_within_20k_env_steps(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    metrics = cli.train_main([
        '--gin_file=configs/sac_pendulum.gin',
        f'--root_dir={tmp_path / "run"}',
        '--seed=0',
        '--gin_bindings=run.stop_at_target_return=True',
    ])
    assert metrics['best_eval_return'] >= -200.0, metrics
    assert metrics['steps_to_target'] is not None and metrics['steps_to_target'] <= 20_000


@pytest.mark.slow
def test_sac_pendulum_with_prioritized_replay_reaches_minus_200_on_2_of_3_seeds(
        tmp_path, monkeypatch):
    """SAC feeds the critics' TD errors back as priorities (agents/sac.py), and still learns."""
    monkeypatch.chdir(ROOT)
    solved = seeds_reaching_target('configs/sac_pendulum.gin', tmp_path, 20_000,
                                   mixins=['configs/buffers/prioritized.gin'])
    assert sum(ok for ok, _ in solved.values()) >= 2, solved
