"""Recurrent agents end to end through train.py: both configs with their tiny mixins, the
exported policy in evaluate.py's comparison, resume after SIGKILL, refused pairings."""

import json
import os
import signal
import subprocess
import sys

import pytest

from app import cli
from core.errors import UserError
from experiment.evaluation import compare_policies
from tests.smoke.test_resume import latest_checkpoint_step, signal_after_checkpoint_beyond
from tests.smoke.test_train import ROOT, read_scalars

R2D2 = ['--gin_file=configs/r2d2_cartpole_pomdp.gin', '--gin_file=configs/testing/tiny.gin']
RECURRENT_SAC = ['--gin_file=configs/sac_recurrent_pendulum_pomdp.gin',
                 '--gin_file=configs/testing/tiny.gin']


@pytest.fixture(scope='module')
def r2d2_run(tmp_path_factory):
    root_dir = str(tmp_path_factory.mktemp('r2d2') / 'run')
    os.chdir(ROOT)
    return root_dir, cli.train_main(R2D2 + [f'--root_dir={root_dir}', '--seed=2'])


def test_r2d2_config_trains_with_the_tiny_mixin(r2d2_run):
    root_dir, metrics = r2d2_run
    assert metrics['env_steps'] == 400 and metrics['train_steps'] > 0
    assert metrics['unused_bindings'] == []
    scalars = read_scalars(root_dir)
    assert {'train/loss', 'train/mean_q', 'buffer/size', 'train/epsilon'} <= set(scalars)
    with open(os.path.join(root_dir, 'evaluation.json')) as f:
        report = json.load(f)
    assert len(report['final']['returns']) == 4


def test_exported_recurrent_policy_plays_in_evaluate(r2d2_run, tmp_path):
    """evaluate.py's comparison steps the exported policies with their state; the final
    policy replays the same seeded episodes identically when it is given twice."""
    root_dir, _ = r2d2_run
    policy = os.path.join(root_dir, 'policy')
    result = compare_policies([policy, policy], env_id='CartPole-v1', episodes=3, seed=4,
                              report_path=str(tmp_path / 'report.json'))
    first, second = result['policies']
    assert first['returns'] == second['returns'] and min(first['returns']) > 0


def test_recurrent_sac_config_trains_with_the_tiny_mixin(tmp_path):
    """With tiny.gin itself (its run settings shrink any agent's run); its one DQN binding, the
    network size, goes unused and is reported (configs/testing/tiny_sac.gin has SAC's)."""
    root_dir = str(tmp_path / 'run')
    metrics = cli.train_main(RECURRENT_SAC + [f'--root_dir={root_dir}'])
    assert metrics['env_steps'] == 400 and metrics['train_steps'] > 0
    assert metrics['unused_bindings'] == ['dqn.make_agent.fc_layer_params']
    assert {'train/alpha', 'train/mean_q'} <= set(read_scalars(root_dir))


def test_sigkill_resume_restores_the_sequences_and_restarts_episodes(tmp_path):
    """A resumed run restarts its episodes (zero state, as the network has at FIRST) and keeps
    its stored sequences and their start states."""
    root_dir = str(tmp_path / 'run')
    args = R2D2 + ['--gin_bindings=run.checkpoint_interval=200',
                   '--gin_bindings=run.export_final_policy=False', f'--root_dir={root_dir}']
    process = subprocess.Popen(
        [sys.executable, 'train.py', *args, '--gin_bindings=run.num_env_steps=50000'],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    signal_after_checkpoint_beyond(process, root_dir, 0, signal.SIGKILL)
    killed_at = latest_checkpoint_step(root_dir)
    metrics = cli.train_main(args + [f'--gin_bindings=run.num_env_steps={killed_at + 200}',
                                     '--force'])
    assert metrics['env_steps'] == killed_at + 200
    sizes = [size for step, size in read_scalars(root_dir)['buffer/size'] if step > killed_at]
    assert sizes and min(sizes) > min(killed_at, 1000) - 1


@pytest.mark.parametrize('bindings, message', [
    (R2D2 + ['--gin_bindings=run.replay_backend=@UniformReplay'], 'is recurrent'),
    (['--gin_file=configs/dqn_cartpole.gin', '--gin_file=configs/testing/tiny.gin',
      '--gin_bindings=run.replay_backend=@SequenceReplay'], 'stores sequences'),
    (R2D2 + ['--gin_bindings=run.frame_stack=4'], 'frame_stack'),
])
def test_backends_that_cannot_work_with_the_agent_are_refused(bindings, message, tmp_path):
    with pytest.raises(UserError, match=message):
        cli.train_main(bindings + [f'--root_dir={tmp_path / "run"}'])


def test_r2d2_trains_on_reverb_sequence_replay_behind_the_preprocessing_stage(tmp_path):
    """The same config on Reverb's prioritized sequence table, in one process, with
    observation normalisation in front of the recurrent agent."""
    root_dir = str(tmp_path / 'run')
    metrics = cli.train_main(R2D2 + [
        '--gin_bindings=run.replay_backend=@ReverbPrioritizedSequenceReplay',
        '--gin_bindings=run.preprocessing=[@preprocess.ObservationNormalization()]',
        f'--root_dir={root_dir}'])
    assert metrics['env_steps'] == 400 and metrics['train_steps'] > 0
    assert metrics['unused_bindings'] == []
    scalars = read_scalars(root_dir)
    assert scalars['buffer/size'][-1][1] == 400
    with open(os.path.join(root_dir, 'operative_config.gin')) as f:
        assert 'ObservationNormalization' in f.read()
