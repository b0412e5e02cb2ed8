"""What a user takes away from a run: best and final policies, report, videos, quiet console."""

import glob
import json
import os
import re
import subprocess
import sys

import numpy as np
import tensorflow as tf
from PIL import Image, ImageSequence

from app import cli
from experiment import video
from tests.smoke.test_train import ROOT, TINY

SAC_TINY = ['--gin_file=configs/sac_pendulum.gin', '--gin_file=configs/testing/tiny_sac.gin']
# Every line a run prints is one of ours: progress, best-policy news, the report, the summary.
OUR_LINES = re.compile(r"^(step +[\d,]+/[\d,]+ \| eval return |New best policy at |"
                       r"(final|best) policy: |best - final: |Done at env step |  \S)")


def _gif_frames(path):
    """The decoded frames and each one's display time in ms."""
    with Image.open(path) as image:
        return [(np.asarray(frame.convert('RGB')), frame.info['duration'])
                for frame in ImageSequence.Iterator(image)]


def _check_video(path, steps, fps):
    """One frame per step: a frame equal to its predecessor is stored once, shown longer."""
    frames = _gif_frames(path)
    assert sum(duration for _, duration in frames) == steps * video.frame_duration_ms(fps)
    images = [image for image, _ in frames]
    assert images[0].ndim == 3 and min(images[0].shape[:2]) > 50
    assert len(images) > steps / 2, 'most steps change the picture'
    assert all(not np.array_equal(a, b) for a, b in zip(images, images[1:]))


def _train_step_of(policy_dir):
    return int(tf.saved_model.load(policy_dir).get_train_step().numpy())


def test_a_run_prints_only_our_lines_and_leaves_best_and_final_policies_and_videos(tmp_path):
    root_dir = tmp_path / 'run'
    done = subprocess.run(
        [sys.executable, 'train.py', *TINY, f'--root_dir={root_dir}',
         '--gin_bindings=run.video_interval=200', '--gin_bindings=run.final_video=True'],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == '', done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert [line for line in lines if not OUR_LINES.match(line)] == [], done.stdout
    assert any(line.startswith('Done at env step 400: ') for line in lines)

    best = json.loads((root_dir / 'policy_best' / 'best.json').read_text())
    assert _train_step_of(str(root_dir / 'policy_best')) == best['train_step']
    metrics = json.loads((root_dir / 'metrics.json').read_text())
    assert _train_step_of(str(root_dir / 'policy')) == metrics['train_steps']
    assert metrics['best_policy'] == best

    report = json.loads((root_dir / 'evaluation.json').read_text())
    assert report['final']['episodes'] == report['best']['episodes'] == 4
    assert report['final']['ci95'][0] <= report['final']['mean'] <= report['final']['ci95'][1]
    assert 'best_minus_final' in report

    videos = sorted(glob.glob(str(root_dir / 'videos' / '*.gif')))
    assert [os.path.basename(path).split('_return_')[0] for path in videos] == [
        'best_at_00000400', 'step_00000200', 'step_00000400']
    for path in videos:  # CartPole pays 1 per step: a video's return is its episode length
        _check_video(path, int(float(path.split('_return_')[1][:-len('.gif')])), fps=50)
    gifs = [value.tensor.string_val[2]
            for path in glob.glob(str(root_dir / 'tb' / 'events.*'))
            for event in tf.compat.v1.train.summary_iterator(path)
            for value in event.summary.value if value.tag == 'eval/video']
    assert len(gifs) == 2 and all(gif.startswith(b'GIF8') for gif in gifs)


def test_a_pendulum_video_has_one_frame_per_step(tmp_path):
    root_dir = tmp_path / 'run'
    cli.train_main(SAC_TINY + [f'--root_dir={root_dir}', '--gin_bindings=run.final_video=True',
                               '--gin_bindings=run.export_final_policy=False'])
    (video,) = glob.glob(str(root_dir / 'videos' / 'best_at_*.gif'))
    _check_video(video, 50, fps=30)  # eval/make_env.max_episode_steps = 50 in tiny_run.gin


def test_evaluate_reports_intervals_and_records_videos(tmp_path):
    root_dir = tmp_path / 'run'
    cli.train_main(TINY + [f'--root_dir={root_dir}'])
    report_path = tmp_path / 'report.json'
    result = cli.evaluate_main([str(root_dir / 'policy'), str(root_dir / 'policy_best'),
                                '--episodes=5', '--seed=7', f'--report={report_path}',
                                f'--video={tmp_path / "videos"}'])
    assert result['env_id'] == 'CartPole-v1'  # read from the run's config.gin
    final, best = result['policies']
    assert final['episodes'] == best['episodes'] == 5 and final['seed'] == 7
    (difference,) = result['differences']
    assert difference['mean'] == best['mean'] - final['mean']
    assert json.loads(report_path.read_text()) == json.loads(json.dumps(result))
    assert len(glob.glob(str(tmp_path / 'videos' / 'policy_*_return_*.gif'))) == 2


def test_an_env_that_cannot_render_costs_a_warning_not_the_run(tmp_path, capsys, monkeypatch):
    def broken(env):
        raise RuntimeError("'NoneType' object has no attribute 'glGetError'")  # osmesa, no lib

    monkeypatch.setattr('envs.batched.BatchedGymnasiumEnvironment.render', broken)
    metrics = cli.train_main(TINY + [f'--root_dir={tmp_path / "run"}',
                                     '--gin_bindings=run.video_interval=200',
                                     '--gin_bindings=run.final_video=True'])
    assert metrics['env_steps'] == 400 and (tmp_path / 'run' / 'metrics.json').exists()
    out = capsys.readouterr().out
    assert out.count('warning: no videos for this run: Cannot render frames') == 1, out
    assert 'run.final_video=False' in out and not (tmp_path / 'run' / 'videos').exists()
