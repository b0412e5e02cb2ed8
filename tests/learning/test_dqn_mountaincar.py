"""DQN with observation normalisation solves MountainCar-v0: eval >= -110 within 120k env steps
on 2 of 3 seeds (slow; the preprocessing issue's bar, docs/preprocessing_results.md)."""

import pytest

from experiment import cli
from tests.smoke.test_train import ROOT


@pytest.mark.slow
def test_normalised_dqn_reaches_minus_110_within_120k_env_steps_on_2_of_3_seeds(tmp_path,
                                                                               monkeypatch):
    monkeypatch.chdir(ROOT)
    solved = {}
    for seed in (0, 1, 2):
        metrics = cli.train_main([
            '--gin_file=configs/dqn_mountaincar.gin',
            f'--root_dir={tmp_path / f"seed_{seed}"}', f'--seed={seed}',
            '--gin_bindings=run.stop_at_target_return=True',
            '--gin_bindings=run.final_video=False',
        ])
        assert metrics['unused_bindings'] == []
        steps = metrics['steps_to_target']
        solved[seed] = (steps is not None and steps <= 120_000, metrics['best_eval_return'])
        if sum(ok for ok, _ in solved.values()) >= 2:
            break
    assert sum(ok for ok, _ in solved.values()) >= 2, solved
