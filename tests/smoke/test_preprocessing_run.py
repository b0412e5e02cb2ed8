"""The preprocessing stage through train.py: statistics checkpointed and continued on resume,
written to TensorBoard, and baked into the exported policy."""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

from app import cli
from core.errors import UserError
from tests.smoke.test_train import ROOT, TINY, read_scalars

STAGE = ['--gin_bindings=run.preprocessing = [@preprocess.ObservationNormalization(), '
         '@preprocess.RewardScaling(), @preprocess.GaussianNoise()]']


def _statistics(root_dir):
    checkpoint = tf.train.latest_checkpoint(os.path.join(root_dir, 'checkpoints'))
    return {name: tf.train.load_variable(checkpoint, name)
            for name, _ in tf.train.list_variables(checkpoint) if name.startswith('preprocess/')}


def test_statistics_resume_tensorboard_and_export(tmp_path):
    os.chdir(ROOT)
    root_dir = str(tmp_path / 'run')
    first = cli.train_main(TINY + STAGE + [f'--root_dir={root_dir}',
                                           '--gin_bindings=run.num_env_steps=200'])
    assert first['env_steps'] == 200 and first['unused_bindings'] == []
    count = 'preprocess/transforms/0/stats/count/.ATTRIBUTES/VARIABLE_VALUE'
    assert _statistics(root_dir)[count] == 200  # one per collected observation, warm-up included
    # A longer budget resumes the same run: the statistics go on from the checkpoint's.
    second = cli.train_main(TINY + STAGE + [f'--root_dir={root_dir}', '--force',
                                            '--gin_bindings=run.num_env_steps=400'])
    assert second['env_steps'] == 400
    statistics = _statistics(root_dir)
    assert statistics[count] == 400  # 200 restored + 200 new: nothing lost, nothing twice
    reward_scale = read_scalars(root_dir)['preprocess/reward_scale']
    assert len(reward_scale) >= 3 and all(value > 0 for _, value in reward_scale)
    histograms = set()
    for path in glob.glob(os.path.join(root_dir, 'tb', 'events.*')):
        for event in tf.compat.v1.train.summary_iterator(path):
            histograms.update(value.tag for value in event.summary.value
                              if value.metadata.plugin_data.plugin_name == 'histograms')
    assert {'preprocess/obs_mean', 'preprocess/obs_std'} <= histograms
    # The exported policy normalises raw observations with the run's final statistics.
    policy = tf.saved_model.load(os.path.join(root_dir, 'policy'))
    mean = statistics['preprocess/transforms/0/stats/mean/.ATTRIBUTES/VARIABLE_VALUE']
    saved = [v.numpy() for v in policy.model_variables if v.name == 'mean:0' and v.shape == (4,)]
    assert len(saved) == 1
    np.testing.assert_array_equal(saved[0], mean)
    observation = tf.constant([[0.01, -0.2, 0.03, 0.3]], tf.float32)
    action = policy.action(ts.TimeStep(step_type=tf.constant([1]), reward=tf.constant([0.0]),
                                       discount=tf.constant([1.0]), observation=observation))
    assert action.action.numpy()[0] in (0, 1)


@pytest.mark.parametrize('config', ['configs/dqn_mountaincar.gin',
                                    'configs/dqn_cartpole_features.gin'])
def test_preprocessing_configs_train_with_every_binding_used(config, tmp_path):
    os.chdir(ROOT)
    metrics = cli.train_main([f'--gin_file={config}', '--gin_file=configs/testing/tiny.gin',
                              f'--root_dir={tmp_path}/run'])
    assert metrics['env_steps'] == 400 and metrics['unused_bindings'] == []
    assert any(name.startswith('preprocess/') for name in _statistics(f'{tmp_path}/run'))


def test_initialize_from_brings_the_statistics_and_refuses_a_mismatched_stage(tmp_path):
    os.chdir(ROOT)
    source = str(tmp_path / 'source')
    cli.train_main(TINY + STAGE + [f'--root_dir={source}', '--gin_bindings=run.num_env_steps=200'])
    count = 'preprocess/transforms/0/stats/count/.ATTRIBUTES/VARIABLE_VALUE'
    started = str(tmp_path / 'started')
    metrics = cli.train_main(TINY + STAGE + [
        f'--root_dir={started}', '--gin_bindings=run.num_env_steps=200',
        f'--gin_bindings=run.initialize_from="{source}"'])
    assert metrics['env_steps'] == 200
    assert _statistics(started)[count] == 400  # the source's 200, then its own 200
    with pytest.raises(UserError, match='trained with a preprocessing stage'):
        cli.train_main(TINY + [f'--root_dir={tmp_path}/bare',
                               f'--gin_bindings=run.initialize_from="{source}"'])
