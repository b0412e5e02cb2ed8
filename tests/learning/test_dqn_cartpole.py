"""DQN learns CartPole-v1 with the shipped config: a real return threshold (slow)."""

import pytest

from app import cli
from tests.smoke.test_train import ROOT


@pytest.mark.slow
@pytest.mark.parametrize('head', ['plain', 'dueling'])
def test_dqn_cartpole_reaches_475_within_50k_env_steps(head, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    metrics = cli.train_main([
        '--gin_file=configs/dqn_cartpole.gin',
        f'--root_dir={tmp_path / "run"}',
        '--seed=0',
        '--gin_bindings=run.stop_at_target_return=True',
        f'--gin_bindings=dqn.make_agent.dueling={head == "dueling"}',
    ])
    assert metrics['best_eval_return'] >= 475.0, metrics
    assert metrics['steps_to_target'] is not None and metrics['steps_to_target'] <= 50_000
