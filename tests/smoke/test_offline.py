"""Offline RL end to end: make a dataset, train CQL-SAC on it, continue online with a mix."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from app import cli
from core.errors import UserError
from tests.smoke.test_train import ROOT, read_scalars

TINY_SAC = ['--gin_file=configs/sac_pendulum.gin', '--gin_file=configs/testing/tiny_sac.gin']
TINY_CQL = ['--gin_file=configs/cql_sac_pendulum_offline.gin',
            '--gin_file=configs/testing/tiny_cql.gin']


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
    os.chdir(ROOT)
    return tmp_path_factory.mktemp('offline')


@pytest.fixture(scope='module')
def sac_run(workdir):
    """A tiny SAC run with policy snapshots that also records its experience."""
    root_dir = str(workdir / 'sac')
    metrics = cli.train_main(TINY_SAC + [f'--root_dir={root_dir}',
                                     '--gin_bindings=run.num_env_steps=404',
                                     '--gin_bindings=run.policy_snapshot_interval=200',
                                     '--gin_bindings=run.snapshot_collect_policy=True',
                                     '--gin_bindings=run.record_dataset=True'])
    return root_dir, metrics


@pytest.fixture(scope='module')
def random_dataset(workdir):
    path = str(workdir / 'random')
    metadata = cli.make_dataset_main(['--gin_file=configs/datasets/pendulum_random.gin',
                                  '--gin_bindings=make_dataset.num_steps=2000',
                                  '--gin_bindings=make_env.num_envs=4', f'--output_dir={path}'])
    return path, metadata


def test_random_dataset_holds_whole_episodes(random_dataset):
    _, metadata = random_dataset
    # Pendulum episodes are 200 steps + the final observation; 4 copies finish together.
    assert metadata['num_episodes'] == 12 and metadata['num_steps'] == 12 * 201
    assert metadata['num_terminal_episodes'] == 0  # Pendulum only truncates
    assert -1800 < metadata['average_return'] < -700


def test_training_run_records_a_replay_dataset_and_snapshots(sac_run):
    root_dir, metrics = sac_run
    with open(os.path.join(root_dir, 'dataset', 'collection.json')) as f:
        recorded = json.load(f)
    # 404 env steps over 2 copies = 202 rows each: one whole 201-step episode per copy.
    assert recorded['kind'] == 'replay' and recorded['num_episodes'] == 2
    assert recorded['num_steps'] == 2 * 201
    snapshots = sorted(os.listdir(os.path.join(root_dir, 'policies')))
    assert snapshots == ['step_200', 'step_400']


@pytest.fixture(scope='module')
def medium_dataset(sac_run, workdir):
    """A 'medium' dataset from the tiny run's step-200 snapshot, played as D4RL's are."""
    root_dir, _ = sac_run
    with open(os.path.join(root_dir, 'policies', 'step_200', 'snapshot.json')) as f:
        target = json.load(f)['eval_return']
    path = f'{workdir}/medium'
    metadata = cli.make_dataset_main(
        ['--gin_file=configs/datasets/pendulum_medium.gin', f'--output_dir={path}',
         f'--gin_bindings=make_dataset.run_dir="{root_dir}"',
         f'--gin_bindings=make_dataset.target_return={target}',
         '--gin_bindings=make_dataset.num_steps=400', '--gin_bindings=make_env.num_envs=2',
         "--gin_bindings=make_dataset.behaviour_policy='collect'",
         '--gin_bindings=make_dataset.action_noise_stddev=0.0'])
    return path, metadata


def test_medium_dataset_uses_the_snapshot_closest_to_the_target(medium_dataset):
    _, metadata = medium_dataset
    assert 'step_200' in metadata['source'] and metadata['num_steps'] == 2 * 201
    assert metadata['behaviour_policy'] == 'collect'


def test_snapshots_export_the_collect_policy_that_samples(sac_run):
    from tf_agents.trajectories import time_step as ts

    from rlds_io.behaviour import load_saved_policy, snapshot_policy_dir
    snapshot = os.path.join(sac_run[0], 'policies', 'step_200')
    with open(os.path.join(snapshot, 'snapshot.json')) as f:
        assert json.load(f)['collect_policy'] is True
    time_step = ts.TimeStep(step_type=np.ones(64, np.int32), reward=np.zeros(64, np.float32),
                            discount=np.ones(64, np.float32),
                            observation=np.tile(np.float32([[1.0, 0.0, 0.0]]), (64, 1)))
    greedy = load_saved_policy(snapshot_policy_dir(snapshot, 'greedy'))(time_step)
    collect = load_saved_policy(snapshot_policy_dir(snapshot, 'collect'))(time_step)
    assert np.ptp(greedy) == 0 and np.ptp(collect) > 0.1  # the same state, sampled actions
    with pytest.raises(UserError, match="holds no collect policy: train its run with "
                                        "run.snapshot_collect_policy=True"):
        snapshot_policy_dir(os.path.join(snapshot, 'collect'), 'collect')
    with pytest.raises(UserError, match="behaviour_policy must be one of greedy, collect"):
        snapshot_policy_dir(snapshot, 'mean')


def test_offline_comparison_plays_behaviour_sac_and_cql_on_the_same_episodes(medium_dataset,
                                                                              workdir):
    """reports/offline_hopper.py's table, on a tiny Pendulum 'medium' dataset."""
    from reports import offline_hopper
    path, metadata = medium_dataset
    runs = workdir / 'compare'
    data = f'--gin_bindings=train_offline.dataset_dir="{path}"'
    cli.train_main(TINY_CQL + [f'--root_dir={runs / "cql_s0"}', data])
    cli.train_main(TINY_CQL + [f'--root_dir={runs / "sac_s0"}', data,
                               '--gin_bindings=train_offline.make_agent=@sac.make_agent',
                               '--gin_bindings=sac.make_agent.actor_fc_layer_params=(8, 8)',
                               '--gin_bindings=sac.make_agent.critic_joint_fc_layer_params=(8, 8)'])
    (runs / 'cql_s1').mkdir()  # a seed still training
    output, archive = workdir / 'offline.md', str(workdir / 'offline_runs.json')
    offline_hopper.main(['--runs', str(runs), '--dataset', path, '--episodes', '3',
                         '--output', str(output), '--archive', archive])
    text = output.read_text()
    row = next(line for line in text.splitlines() if line.startswith('| 0 |'))
    cells = [cell.strip() for cell in row.strip('|').split('|')]
    behaviour, sac, cql, greedy = (float(cells[index].replace(',', '')) for index in (1, 2, 3, 6))
    returns = (behaviour, sac, cql, greedy)
    assert -1800 < min(returns) and max(returns) < 0  # Pendulum returns
    assert behaviour != greedy  # the behaviour policy acts with the dataset's noise
    assert f"average return {metadata['average_return']:,.1f}" in text
    assert cells[5] in ('yes', 'no') and '| 1 | in progress |' in text
    # Neither the runs nor the dataset survive the machine: the archived comparison does.
    offline_hopper.main(['--runs', str(workdir / 'gone'), '--dataset', str(workdir / 'gone'),
                         '--episodes', '3', '--output', str(output), '--archive', archive])
    assert row in output.read_text().splitlines()


def test_offline_cql_then_offline_to_online(random_dataset, workdir):
    path, metadata = random_dataset
    offline_dir = str(workdir / 'cql')
    offline = cli.train_main(TINY_CQL + [f'--root_dir={offline_dir}',
                                     f'--gin_bindings=train_offline.dataset_dir="{path}"'])
    assert offline['train_steps'] == 200
    assert offline['dataset_steps'] == metadata['num_steps']
    assert offline['behaviour_return'] == pytest.approx(metadata['average_return'])
    assert offline['final_eval_return'] < 0 and offline['unused_bindings'] == []
    scalars = read_scalars(offline_dir)
    assert {'train/cql_alpha', 'train/alpha', 'eval/AverageReturn'} <= set(scalars)
    assert [step for step, _ in scalars['eval/AverageReturn']] == [0, 100, 200]
    # An offline run keeps its best policy on the train-step axis, and reports both.
    assert offline['best_policy']['train_step'] in (0, 100, 200)
    assert os.path.isfile(os.path.join(offline_dir, 'policy_best', 'saved_model.pb'))
    assert set(offline['final_report']) == {'final', 'best', 'best_minus_final'}

    online_dir = str(workdir / 'online')
    online = cli.train_main(
        ['--gin_file=configs/cql_sac_pendulum_online.gin',
         '--gin_file=configs/testing/tiny_run.gin',
         '--gin_file=configs/testing/tiny_cql_online.gin',
         f'--gin_bindings=run.logged_dataset="{path}"', '--gin_bindings=run.logged_fraction=0.25',
         f'--gin_bindings=run.initialize_from="{offline_dir}"', f'--root_dir={online_dir}'])
    assert online['env_steps'] == 400
    fraction = read_scalars(online_dir)['buffer/logged_fraction_sampled']
    assert all(value == pytest.approx(0.25) for _, value in fraction)
    # It started from the offline checkpoint: the agent's step counter went on from there,
    # and its starting point was evaluated at env step 0.
    assert online['train_steps'] > offline['train_steps']
    assert read_scalars(online_dir)['eval/AverageReturn'][0][0] == 0


def test_bad_dataset_inputs_are_one_line_errors(workdir):
    with pytest.raises(UserError, match='No RLDS dataset at'):
        cli.train_main(TINY_CQL + [f'--root_dir={workdir}/bad',
                               '--gin_bindings=train_offline.dataset_dir="/nonexistent"'])
    with pytest.raises(UserError, match="kind must be one of random, expert, medium"):
        cli.make_dataset_main(['--gin_file=configs/datasets/pendulum_random.gin',
                           '--gin_bindings=make_dataset.kind="replay"',
                           f'--output_dir={workdir}/x'])
    with pytest.raises(UserError, match="picks a 'medium' snapshot's policy, but "
                                        "make_dataset.kind is 'random'"):
        cli.make_dataset_main(['--gin_file=configs/datasets/pendulum_random.gin',
                               "--gin_bindings=make_dataset.behaviour_policy='collect'",
                               f'--output_dir={workdir}/y'])


def test_offline_normalisation_learns_the_dataset_statistics_and_exports_them(random_dataset,
                                                                             workdir):
    """Offline there is no collection: the statistics follow the sampled dataset batches."""
    path, _ = random_dataset
    root_dir = str(workdir / 'cql_normalized')
    metrics = cli.train_main(TINY_CQL + [
        f'--root_dir={root_dir}', f'--gin_bindings=train_offline.dataset_dir="{path}"',
        '--gin_bindings=train_offline.preprocessing = '
        '[@preprocess.ObservationNormalization()]'])
    assert metrics['train_steps'] == 200 and metrics['unused_bindings'] == []
    checkpoint = tf.train.latest_checkpoint(os.path.join(root_dir, 'checkpoints'))
    stats = {name.split('/')[-3]: tf.train.load_variable(checkpoint, name)
             for name, _ in tf.train.list_variables(checkpoint)
             if name.startswith('preprocess/') and '/stats/' in name}
    # Pendulum's observation is (cos, sin, angular velocity): the velocity varies most.
    assert stats['count'] >= 200 * 16
    assert stats['var'][2] > stats['var'][0] and np.all(np.abs(stats['mean'][:2]) <= 1.0)
    with pytest.raises(UserError, match='RewardScaling tracks returns while collecting'):
        cli.train_main(TINY_CQL + [
            f'--root_dir={workdir}/cql_reward_scaled',
            f'--gin_bindings=train_offline.dataset_dir="{path}"',
            '--gin_bindings=train_offline.preprocessing = [@preprocess.RewardScaling()]'])


@pytest.mark.parametrize('config, agent', [('configs/cql_sac_hopper_offline.gin', 'cql_sac'),
                                           ('configs/sac_hopper_offline.gin', 'sac')])
def test_the_hopper_offline_configs_train_with_every_binding_used(config, agent, workdir):
    """Issue #15's comparison configs, shrunk: strict parsing, no stray online settings."""
    path = str(workdir / f'hopper_random_{agent}')
    cli.make_dataset_main(['--gin_file=configs/datasets/pendulum_random.gin',
                           "--gin_bindings=make_env.env_id='Hopper-v5'",
                           '--gin_bindings=make_dataset.num_steps=300',
                           '--gin_bindings=make_env.num_envs=2', f'--output_dir={path}'])
    shrink = {'train_offline.dataset_dir': f'"{path}"', 'train_offline.num_train_steps': 20,
              'train_offline.train_steps_per_iteration': 10, 'train_offline.batch_size': 16,
              'train_offline.eval_interval': 0, 'train_offline.num_eval_episodes': 1,
              'train_offline.best_policy_episodes': 0, 'train_offline.final_eval_episodes': 2,
              'train_offline.final_video': False, 'train_offline.export_final_policy': False,
              f'{agent}.make_agent.actor_fc_layer_params': (8, 8),
              f'{agent}.make_agent.critic_joint_fc_layer_params': (8, 8)}
    metrics = cli.train_main([f'--gin_file={config}', f'--root_dir={workdir}/{agent}_hopper']
                             + [f'--gin_bindings={name}={value}'
                                for name, value in shrink.items()])
    assert metrics['train_steps'] == 20 and metrics['unused_bindings'] == []
