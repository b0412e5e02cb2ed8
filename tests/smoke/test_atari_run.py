"""Pixels end to end through train.py: a tiny Pong run, its exported policy, a SIGKILL resume."""

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys

import gin
import gymnasium
import pytest
import tensorflow as tf

from app import cli
from envs import atari
from experiment.evaluation import compare_policies
from tests.smoke.test_resume import latest_checkpoint_step, signal_after_checkpoint_beyond
from tests.smoke.test_train import ROOT, read_scalars

PIXELS = ['--gin_file=configs/dqn_atari.gin', '--gin_file=configs/testing/tiny_pixels.gin']


@pytest.fixture(scope='module', autouse=True)
def clear_gin_afterwards():
    """The pixel configs' bindings (a CNN) must not reach tests run later in this process."""
    yield
    gin.clear_config()


@pytest.fixture(scope='module')
def pixel_run(tmp_path_factory):
    root_dir = str(tmp_path_factory.mktemp('pixels') / 'run')
    os.chdir(ROOT)
    metrics = cli.train_main(PIXELS + [f'--root_dir={root_dir}', '--seed=1'])
    return root_dir, metrics


def test_trains_on_single_frames(pixel_run):
    root_dir, metrics = pixel_run
    assert metrics['env_steps'] == 400 and metrics['train_steps'] > 0
    assert metrics['buffer_size'] == 400  # transitions, one frame each
    assert metrics['uses_xla'] is False
    assert read_scalars(root_dir)['Metrics/AverageReturn']
    # Pong scores are whole-game sums of +-1 rewards: every report episode's return is a
    # whole number in [-21, 21] (the env's rewards, never clipped, scaled or normalised).
    with open(os.path.join(root_dir, 'evaluation.json')) as f:
        final = json.load(f)['final']
    for score in (final['min'], final['max']):
        assert float(score).is_integer() and -21 <= score <= 21, final


class Scoreboard(gymnasium.Wrapper):
    """Reads each finished Pong game's score off the emulator's own scoreboard (RAM 14: the
    agent's points, RAM 13: the opponent's), whatever the wrappers did to the rewards."""

    def __init__(self, env, scores):
        super().__init__(env)
        self._scores = scores

    def step(self, action):
        observation, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            ram = self.env.unwrapped.ale.getRAM()
            self._scores.append(float(ram[14]) - float(ram[13]))
        return observation, reward, terminated, truncated, info


def test_exported_policy_takes_frame_stacks_and_evaluate_stacks_for_it(pixel_run, monkeypatch):
    root_dir, _ = pixel_run
    scores = []
    make_atari = atari.atari_env
    monkeypatch.setattr(atari, 'atari_env',
                        lambda *args, **kwargs: Scoreboard(make_atari(*args, **kwargs), scores))
    policy = tf.saved_model.load(os.path.join(root_dir, 'policy'))
    inputs = policy.signatures['action'].structured_input_signature[1]
    observation = [spec for name, spec in inputs.items() if name.endswith('observation')][0]
    assert observation.shape.as_list() == [None, 84, 84, 4] and observation.dtype == tf.uint8
    # evaluate.py plays it on the env's single frames: it stacks them per copy.
    result = compare_policies([os.path.join(root_dir, 'policy')], env_id='ALE/Pong-v5',
                              episodes=1, seed=5)
    # One Pong game: a whole number of points (env rewards, neither clipped nor scaled) in
    # [-21, 21], the game's own score.
    score = result['policies'][0]['mean']
    assert float(score).is_integer() and -21 <= score <= 21, result
    assert result['policies'][0]['returns'] == scores, (result, scores)
    with open(os.path.join(root_dir, 'config.gin')) as f:
        assert 'run.frame_stack = 4' in f.read()


def test_sigkill_resume_keeps_the_compressed_reverb_replay(tmp_path):
    """Reverb storing LZ4 frames as strings: killed after a checkpoint, resumed, nothing lost."""
    root_dir = str(tmp_path / 'run')
    args = PIXELS + ['--gin_file=configs/buffers/reverb_uniform.gin',
                     '--gin_bindings=run.checkpoint_interval=160',
                     '--gin_bindings=run.export_final_policy=False',
                     '--gin_bindings=run.final_eval_episodes=0',
                     '--gin_bindings=run.best_policy_episodes=0', f'--root_dir={root_dir}']
    process = subprocess.Popen(
        [sys.executable, 'train.py', *args, '--gin_bindings=run.num_env_steps=50000'],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    signal_after_checkpoint_beyond(process, root_dir, 0, signal.SIGKILL)
    killed_at = latest_checkpoint_step(root_dir)
    metrics = cli.train_main(args + [f'--gin_bindings=run.num_env_steps={killed_at + 160}',
                                     '--force'])
    assert metrics['env_steps'] == killed_at + 160
    sizes = [(step, size) for step, size in read_scalars(root_dir)['buffer/size']
             if step > killed_at]
    assert sizes
    # An empty restored buffer would hold ~160 steps here; Reverb items need the
    # window (n-step + 3 context frames) per copy before the first new one.
    for step, size in sizes:
        assert size >= min(step, 600) - 2 * 8, (step, size)
    with open(os.path.join(root_dir, 'metrics.json')) as f:
        assert json.load(f)['env_steps'] == killed_at + 160


def test_memmap_frames_live_in_the_run_directory(tmp_path):
    root_dir = str(tmp_path / 'run')
    metrics = cli.train_main(PIXELS + [
        f'--root_dir={root_dir}', '--gin_bindings=run.num_env_steps=160',
        "--gin_bindings=FrameStackedReplay.codec='none'",
        "--gin_bindings=FrameStackedReplay.storage='memmap'",
        '--gin_bindings=run.final_eval_episodes=0', '--gin_bindings=run.best_policy_episodes=0'])
    assert metrics['env_steps'] == 160 and metrics['buffer_size'] == 160
    frames = os.path.join(root_dir, 'replay_frames', 'frames.u8')
    assert os.path.getsize(frames) == 2 * 600 * 84 * 84  # twice the capacity, raw frames


def test_the_atari100k_protocol_trains_a_dueling_network(tmp_path):
    """configs/dqn_atari100k.gin, shrunk: DrQ(eps)'s dueling head, 10-step targets, augmentation."""
    root_dir = str(tmp_path / 'run')
    metrics = cli.train_main([
        '--gin_file=configs/dqn_atari100k.gin', '--gin_file=configs/testing/tiny_pixels.gin',
        f'--root_dir={root_dir}', '--gin_bindings=run.num_env_steps=160',
        '--gin_bindings=run.final_eval_episodes=0', '--gin_bindings=run.export_final_policy=False'])
    assert metrics['env_steps'] == 160 and metrics['train_steps'] > 0
    with open(os.path.join(root_dir, 'operative_config.gin')) as f:
        operative = f.read()
    assert re.search(r'^dqn\.make_agent\.dueling = True$', operative, re.M)
    assert re.search(r'^dqn\.make_agent\.n_step_update = 10$', operative, re.M)


def test_the_atari100k_table_reads_the_run(pixel_run, tmp_path):
    from reports import atari100k_results

    root_dir, _ = pixel_run
    runs = tmp_path / 'runs'
    runs.mkdir()
    os.symlink(root_dir, runs / 'pong_s1')
    # The same run as if trained with the dueling head: another agent, so a mean of its own.
    dueling = runs / 'pong_s2'
    shutil.copytree(root_dir, dueling, ignore=shutil.ignore_patterns('checkpoints', 'replay*'))
    with open(dueling / 'config.gin', 'a') as f:
        f.write('\ndqn.make_agent.dueling = True\n')
    # ... and as if trained on raw frames: a storage comparison with the LZ4 run of seed 1.
    raw = runs / 'pong_raw_s1'
    shutil.copytree(root_dir, raw, ignore=shutil.ignore_patterns('checkpoints', 'replay*'))
    with open(raw / 'config.gin', 'a') as f:
        f.write("\nFrameStackedReplay.codec = 'none'\n")
    # ... and as a distributed run lays it out (app.launch): the evaluator's directory holds
    # the config and curve, the launcher's metrics.json at the root the report and wall time.
    distributed = tmp_path / 'distributed' / 'pong_s3'
    shutil.copytree(root_dir, distributed / 'eval',
                    ignore=shutil.ignore_patterns('checkpoints', 'replay*', 'metrics.json'))
    report = json.loads((pathlib.Path(root_dir) / 'metrics.json').read_text())['final_report']
    (distributed / 'metrics.json').write_text(json.dumps(
        {'collectors': 1, 'interrupted': False, 'wall_time_s': 4700.0,
         'exited_at': {'learner': 1e9 + 4330.0, 'replay': 1e9 + 4700.0},
         'learner': {'budget_reached_at': 1e9 + 4320.0},  # 72 min after the launcher's start
         'replay': {'inserted': 412}, 'eval': {'final_report': report}}))
    atari100k_results.main(['--runs', str(runs), '--runs', str(distributed.parent),
                            '--docs', str(tmp_path / 'docs')])
    text = (tmp_path / 'docs' / 'atari100k_results.md').read_text()
    # Finished, lz4 (lossless): each in its own head's (and mode's) mean over seeds.
    assert re.search(r'^\| Pong \| plain \| one process \| 1 \| -?\d+\.\d \|', text, re.M)
    assert re.search(r'^\| Pong \| dueling \| one process \| 1 \| -?\d+\.\d \|', text, re.M)
    assert re.search(r'^\| Pong \| plain \| distributed, 1 collector \| 1 \| -?\d+\.\d \|',
                     text, re.M)
    assert '| Pong | plain | one process | 1 | lz4 | 400 |' in text
    assert '| Pong | dueling | one process | 2 | lz4 | 400 |' in text
    assert '| Pong | plain | one process | 1 | none | 400 |' in text
    final, best = report['final'], report.get('best')
    best_text = f"{best['mean']:.1f}" if best else '—'
    assert (f"| Pong | plain | distributed, 1 collector | 3 | lz4 | 400 | "
            f"{final['mean']:.1f} ± {final['std']:.1f} | {best_text} | 72 min |") in text
    comparison = text.split('## Storage comparison')[1]
    assert '| game | Q head | seed | lz4 | none |' in comparison
    assert re.search(r'^\| Pong \| plain \| 1 \| -?[\d.]+ ± [\d.]+ \| -?[\d.]+ ± [\d.]+ \|$',
                     comparison, re.M)


@pytest.mark.parametrize('storage', ['memory', 'memmap'])
def test_a_pixel_dataset_trains_offline_on_frame_stacks(pixel_run, tmp_path, storage):
    """make_dataset plays the pixel policy (stacking its frames); offline DQN stores each frame
    once and samples stacks, in RAM or in a memory-mapped file under the run directory."""
    root_dir, _ = pixel_run
    dataset = str(tmp_path / 'pong')
    metadata = cli.make_dataset_main([
        '--gin_file=configs/datasets/pong_expert.gin', f'--output_dir={dataset}',
        f'--gin_bindings=make_dataset.policy_dir="{root_dir}/policy"',
        '--gin_bindings=make_dataset.num_steps=150', '--gin_bindings=make_env.num_envs=2',
        '--gin_bindings=atari_env.max_episode_frames=400'])
    assert metadata['num_steps'] >= 150 and metadata['env_id'] == 'ALE/Pong-v5'
    assert 'shape=(84, 84)' in metadata['observation_spec']  # single frames, not stacks
    offline_dir = str(tmp_path / 'offline')
    memmap = (['--gin_bindings=FrameStackedReplay.storage="memmap"',
               '--gin_bindings=FrameStackedReplay.codec="none"'] if storage == 'memmap' else [])
    metrics = cli.train_main([
        '--gin_file=configs/dqn_atari_offline.gin',
        '--gin_file=configs/testing/tiny_pixels_offline.gin',
        f'--gin_bindings=train_offline.dataset_dir="{dataset}"', f'--root_dir={offline_dir}',
        *memmap])
    assert metrics['train_steps'] == 40 and metrics['dataset_steps'] == metadata['num_steps']
    policy = tf.saved_model.load(os.path.join(offline_dir, 'policy'))
    inputs = policy.signatures['action'].structured_input_signature[1]
    observation = [spec for name, spec in inputs.items() if name.endswith('observation')][0]
    assert observation.shape.as_list() == [None, 84, 84, 4]
    frames_file = os.path.join(offline_dir, 'replay_frames', 'frames.u8')
    assert os.path.isfile(frames_file) == (storage == 'memmap')


def test_overlapped_collection_trains_and_resumes_with_its_replay(tmp_path):
    """run.overlap_collection: every chunk collected and trained, the buffer kept on resume."""
    root_dir = str(tmp_path / 'run')
    args = PIXELS + [f'--root_dir={root_dir}', '--gin_bindings=run.overlap_collection=True',
                     '--gin_bindings=run.final_eval_episodes=0',
                     '--gin_bindings=run.best_policy_episodes=0',
                     '--gin_bindings=run.export_final_policy=False']
    first = cli.train_main(args + ['--gin_bindings=run.num_env_steps=256'])
    assert first['env_steps'] == 256 and first['buffer_size'] == 256
    # 64 warm-up steps, then 12 chunks of 16 env steps, 4 gradient steps each.
    assert first['train_steps'] == (256 - 64) // 16 * 4
    resumed = cli.train_main(args + ['--gin_bindings=run.num_env_steps=384', '--force'])
    assert resumed['env_steps'] == 384 and resumed['buffer_size'] == 384
    assert resumed['train_steps'] == (384 - 64) // 16 * 4
