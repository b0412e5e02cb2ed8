"""SAC end to end through train.py on the tiny SAC config: metrics, tags, greedy export."""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

from app import cli
from core import tags
from tests.smoke.test_train import ROOT, read_scalars

TINY_SAC = ['--gin_file=configs/sac_pendulum.gin', '--gin_file=configs/testing/tiny_sac.gin']


@pytest.fixture(scope='module')
def tiny_sac_run(tmp_path_factory):
    """One shared tiny SAC run (tracing TF is the slow part; do it once)."""
    root_dir = str(tmp_path_factory.mktemp('tiny_sac') / 'run')
    os.chdir(ROOT)
    metrics = cli.train_main(TINY_SAC + [f'--root_dir={root_dir}', '--seed=3'])
    return root_dir, metrics


def test_returns_final_metrics_and_uses_every_binding(tiny_sac_run):
    _, metrics = tiny_sac_run
    assert metrics['env_steps'] == 400
    assert metrics['train_steps'] > 0
    # Pendulum rewards are negative: a finite, negative return means episodes were evaluated.
    assert -50 * 17 <= metrics['final_eval_return'] < 0
    assert metrics['unused_bindings'] == []


def test_writes_alpha_and_batch_diagnostics(tiny_sac_run):
    root_dir, _ = tiny_sac_run
    scalars = read_scalars(root_dir)
    assert {'train/alpha', 'train/entropy', tags.TRAIN_MEAN_Q, tags.TRAIN_LOSS,
            tags.EVAL_AVERAGE_RETURN} <= set(scalars)
    # Automatic entropy tuning moved the temperature away from its initial 1.0.
    assert all(0 < alpha < 1.0 for _, alpha in scalars['train/alpha'])


def test_exported_policy_is_greedy_and_in_bounds(tiny_sac_run):
    root_dir, _ = tiny_sac_run
    policy = tf.saved_model.load(os.path.join(root_dir, 'policy'))
    time_step = ts.TimeStep(
        step_type=tf.constant([0, 1], tf.int32), reward=tf.zeros([2]), discount=tf.ones([2]),
        observation=tf.constant(np.array([[1, 0, 0], [0, 1, 2]], np.float32)))
    first = policy.action(time_step).action.numpy()
    assert first.shape == (2, 1) and np.all(np.abs(first) <= 2.0)
    np.testing.assert_array_equal(policy.action(time_step).action.numpy(), first)


def test_prioritized_replay_takes_sac_priorities_and_writes_their_histogram(tmp_path):
    """SAC with configs/buffers/prioritized.gin: the critics' TD errors reach the buffer.

    Every window enters at the max priority (1.0 until a larger one was given), so a
    mean priority of exactly 1.0 would mean no feedback at all, as it was before SAC
    gave per-sample priorities.
    """
    root_dir = str(tmp_path / 'run')
    os.chdir(ROOT)
    metrics = cli.train_main(TINY_SAC + [
        '--gin_file=configs/buffers/prioritized.gin', f'--root_dir={root_dir}', '--seed=3',
        '--gin_bindings=run.eval_interval=0', '--gin_bindings=run.export_final_policy=False'])
    assert metrics['unused_bindings'] == []
    scalars = read_scalars(root_dir)
    _, mean = scalars[tags.BUFFER_PREFIX + 'priority_mean'][-1]
    _, largest = scalars[tags.BUFFER_PREFIX + 'priority_max'][-1]
    assert abs(mean - 1.0) > 1e-3 and largest > 1.0, (mean, largest)
    histograms = set()
    for path in glob.glob(os.path.join(root_dir, 'tb', 'events.*')):
        for event in tf.compat.v1.train.summary_iterator(path):
            histograms.update(value.tag for value in event.summary.value
                              if value.metadata.plugin_data.plugin_name == 'histograms')
    assert tags.BUFFER_PREFIX + 'priority' in histograms
