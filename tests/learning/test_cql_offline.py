"""CQL-SAC learns from a medium Pendulum dataset, then improves online (slow).

The full recipe of docs/offline_rl.md on a smaller budget: a short SAC run leaves policy
snapshots, the one nearest -700 makes a 'medium' dataset (20k steps, made here,
its behaviour return measured), CQL-SAC trains on it offline only, and must
beat the behaviour policy by 100; then offline-to-online must improve on the
offline result, both final policies played on the same seeded episodes.
"""

import os

import pytest

from app import cli
from experiment.evaluation import compare_policies
from tests.smoke.test_train import ROOT


@pytest.mark.slow
def test_cql_beats_the_behaviour_policy_then_improves_online(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    expert_dir = str(tmp_path / 'sac')
    cli.train_main(['--gin_file=configs/sac_pendulum.gin', f'--root_dir={expert_dir}',
                '--gin_bindings=run.num_env_steps=5000',
                '--gin_bindings=run.policy_snapshot_interval=500'])
    dataset = str(tmp_path / 'medium')
    behaviour = cli.make_dataset_main([
        '--gin_file=configs/datasets/pendulum_medium.gin', f'--output_dir={dataset}',
        f'--gin_bindings=make_dataset.run_dir="{expert_dir}"',
        '--gin_bindings=make_dataset.num_steps=20000'])['average_return']
    assert -900 <= behaviour <= -400, behaviour

    offline_dir = str(tmp_path / 'cql')
    offline = cli.train_main(['--gin_file=configs/cql_sac_pendulum_offline.gin',
                          f'--root_dir={offline_dir}',
                          f'--gin_bindings=train_offline.dataset_dir="{dataset}"',
                          '--gin_bindings=train_offline.num_train_steps=10000',
                          '--gin_bindings=train_offline.eval_interval=2500'])
    assert offline['best_eval_return'] >= behaviour + 100, offline

    online_dir = str(tmp_path / 'online')
    cli.train_main(['--gin_file=configs/cql_sac_pendulum_online.gin', f'--root_dir={online_dir}',
                    f'--gin_bindings=run.initialize_from="{offline_dir}"',
                    f'--gin_bindings=run.logged_dataset="{dataset}"'])
    # The two final policies on the same 50 seeded episodes (not the best of many online
    # evaluations against one offline one): online must improve on offline, paired.
    compared = compare_policies([os.path.join(offline_dir, 'policy'),
                                 os.path.join(online_dir, 'policy')],
                                env_id='Pendulum-v1', episodes=50, seed=123)
    offline_mean, online_mean = (report['mean'] for report in compared['policies'])
    assert online_mean > offline_mean, compared['differences']
