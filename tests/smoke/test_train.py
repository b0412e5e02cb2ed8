"""End to end through train.py on a shrunk config: outputs, tags, export, bad input."""

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

from app import cli
from core import tags
from core.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ['--gin_file=configs/dqn_cartpole.gin', '--gin_file=configs/testing/tiny.gin']


def read_scalars(root_dir):
    """{tag: [(step, value), ...]} from every event file under root_dir/tb."""
    scalars = {}
    for path in sorted(glob.glob(os.path.join(root_dir, 'tb', 'events.*'))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == 'scalars':
                    scalars.setdefault(value.tag, []).append(
                        (event.step, float(tf.make_ndarray(value.tensor))))
    return scalars


@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory):
    """One shared tiny training run (tracing TF is the slow part; do it once)."""
    root_dir = str(tmp_path_factory.mktemp('tiny') / 'run')
    os.chdir(ROOT)
    metrics = cli.train_main(TINY + [f'--root_dir={root_dir}', '--seed=3'])
    return root_dir, metrics


def test_returns_final_metrics(tiny_run):
    root_dir, metrics = tiny_run
    assert metrics['env_steps'] == 400
    assert metrics['train_steps'] > 0
    assert metrics['final_eval_return'] is not None and metrics['final_eval_return'] > 0
    assert metrics['buffer_size'] == 400
    with open(os.path.join(root_dir, 'metrics.json')) as f:
        assert json.load(f) == metrics


def test_writes_the_expected_tensorboard_tags(tiny_run):
    root_dir, _ = tiny_run
    scalars = read_scalars(root_dir)
    expected = {
        tags.EVAL_AVERAGE_RETURN, tags.EVAL_AVERAGE_EPISODE_LENGTH, tags.TRAIN_AVERAGE_RETURN,
        tags.TRAIN_AVERAGE_EPISODE_LENGTH, tags.TRAIN_LOSS, tags.TRAIN_MEAN_Q, 'train/epsilon',
        tags.ENV_STEPS_PER_SEC, tags.TRAIN_STEPS_PER_SEC, 'buffer/size', 'buffer/fill_ratio',
        'buffer/capacity', 'buffer/inserted_per_sec', 'buffer/sampled_per_sec',
        'buffer/samples_per_insert', 'buffer/sample_latency_p50_ms',
        'buffer/sample_latency_p99_ms', 'buffer/sampled_age_mean', 'buffer/sample_diversity',
        'buffer/importance_weight_mean',
    }
    assert expected <= set(scalars)
    eval_steps = [step for step, _ in scalars[tags.EVAL_AVERAGE_RETURN]]
    assert eval_steps == [200, 400]  # the env-step count is the summary step
    assert all(weight == 1.0 for _, weight in scalars['buffer/importance_weight_mean'])
    assert all(0 < diversity <= 1 for _, diversity in scalars['buffer/sample_diversity'])


def test_saves_operative_config_and_no_binding_is_unused(tiny_run):
    root_dir, metrics = tiny_run
    with open(os.path.join(root_dir, 'operative_config.gin')) as f:
        operative = f.read()
    assert "make_env.env_id = 'CartPole-v1'" in operative
    assert metrics['unused_bindings'] == []


def test_exported_policy_acts_with_plain_tensorflow(tiny_run):
    root_dir, _ = tiny_run
    policy = tf.saved_model.load(os.path.join(root_dir, 'policy'))
    time_step = ts.TimeStep(
        step_type=tf.constant([0, 1], tf.int32), reward=tf.zeros([2]),
        discount=tf.ones([2]), observation=tf.constant(np.zeros((2, 4), np.float32)))
    action = policy.action(time_step).action.numpy()
    assert action.shape == (2,) and set(action) <= {0, 1}


def test_rerun_of_a_finished_run_resumes_and_changes_nothing(tiny_run):
    root_dir, metrics = tiny_run
    again = cli.train_main(TINY + [f'--root_dir={root_dir}', '--seed=3'])
    assert again['env_steps'] == metrics['env_steps']
    assert again['train_steps'] == metrics['train_steps']
    # Run-level results come back from the checkpoint instead of starting over.
    assert again['best_eval_return'] == metrics['best_eval_return']
    assert again['wall_time_s'] >= metrics['wall_time_s'] > 0


def test_changed_config_is_refused_unless_forced(tiny_run):
    root_dir, _ = tiny_run
    changed = TINY + [f'--root_dir={root_dir}', '--seed=3',
                      '--gin_bindings=run.num_env_steps=480']
    with pytest.raises(UserError, match='different config.*--force'):
        cli.train_main(changed)
    assert cli.train_main(changed + ['--force'])['env_steps'] == 480


@pytest.mark.parametrize('args, message', [
    (['--gin_file=configs/nope.gin'], 'Gin file not found: configs/nope.gin'),
    (TINY + ['--gin_bindings=run.num_env_step=5'], "doesn't have a parameter named 'num_env_step'"),
    (TINY + ['--gin_bindings=nothing.here=5'], "No configurable matching 'nothing'"),
    (TINY + ["--gin_bindings=make_env.env_id='CartPol-v1'"], 'Did you mean: CartPole-v1'),
    (TINY + ['--gin_bindings=run.replay_capacity=0'], 'replay_capacity must be a positive'),
    (TINY + ['--root_dir=/dev/null/run'], 'Cannot write to root_dir'),
])
def test_bad_input_is_one_clear_line(args, message, tmp_path):
    if not any(a.startswith('--root_dir') for a in args):
        args = args + [f'--root_dir={tmp_path / "run"}']
    with pytest.raises(UserError) as error:
        cli.train_main(args)
    assert message in str(error.value)
    assert '\n' not in cli.one_line(error.value)


def test_cli_prints_one_line_and_exits_2(tmp_path):
    result = subprocess.run(
        [sys.executable, 'train.py', '--gin_file=configs/missing.gin'],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        'error: Gin file not found: configs/missing.gin. Check the path (configs are in configs/).']


def test_corrupted_checkpoint_is_reported(tmp_path):
    root_dir = str(tmp_path / 'run')
    cli.train_main(TINY + [f'--root_dir={root_dir}', '--gin_bindings=run.num_env_steps=200',
                       '--gin_bindings=run.export_final_policy=False'])
    for data_file in glob.glob(os.path.join(root_dir, 'checkpoints', 'ckpt-200.data-*')):
        with open(data_file, 'r+b') as f:
            f.truncate(100)
    with pytest.raises(UserError, match='ckpt-200 cannot be restored.*delete'):
        cli.train_main(TINY + [f'--root_dir={root_dir}', '--gin_bindings=run.num_env_steps=200',
                           '--gin_bindings=run.export_final_policy=False'])


def test_small_capacity_warns_once(tmp_path, capsys):
    cli.train_main(TINY + [f'--root_dir={tmp_path / "run"}',
                           '--gin_bindings=run.replay_capacity=40',
                           '--gin_bindings=run.export_final_policy=False'])
    assert capsys.readouterr().out.count('holds fewer than 10 episodes') == 1
