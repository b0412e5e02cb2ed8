"""The MuJoCo SAC configs end to end (shrunk by the tiny mixin), and the adapter on MuJoCo.

The full configs need hours per seed (see their headers), so this only proves that each one
parses strictly, builds, trains, evaluates and checkpoints on its real environment, and that
our adapter gives MuJoCo's episode ends the right discounts.
"""

import json
import math
import os

import numpy as np
import pytest
import tensorflow as tf

from app import cli
from core import tags
from envs.suite import make_env
from tests.smoke.test_train import ROOT, read_scalars

CONFIGS = ['configs/sac_halfcheetah.gin', 'configs/sac_hopper.gin', 'configs/sac_walker2d.gin']
ENV_STEPS = 1000
# The tiny mixin shrinks networks, batch and replay; these shrink the run further for speed:
# 1,000 env steps, 8 env steps then 8 gradient steps per chunk, one 2-episode eval at the end.
BINDINGS = [f'run.num_env_steps={ENV_STEPS}', 'run.collect_steps_per_iteration=8',
            'run.train_steps_per_iteration=8', 'run.eval_interval=0',
            'run.checkpoint_interval=500', 'run.export_final_policy=False']


@pytest.fixture(scope='module', params=CONFIGS, ids=lambda path: os.path.basename(path))
def mujoco_run(request, tmp_path_factory):
    """One shrunk run per config (tracing TF is the slow part; do it once per config)."""
    root_dir = str(tmp_path_factory.mktemp('mujoco') / 'run')
    os.chdir(ROOT)
    argv = [f'--gin_file={request.param}', '--gin_file=configs/testing/tiny_sac.gin',
            f'--root_dir={root_dir}', '--seed=1']
    metrics = cli.train_main(argv + [f'--gin_bindings={binding}' for binding in BINDINGS])
    return root_dir, metrics


def test_run_finishes_and_counts_every_env_step(mujoco_run):
    root_dir, metrics = mujoco_run
    assert not metrics['interrupted']
    assert metrics['env_steps'] == ENV_STEPS
    assert metrics['buffer_size'] == ENV_STEPS
    # 1 gradient step per env step after the initial random collection.
    assert 0 < metrics['train_steps'] <= ENV_STEPS
    assert metrics['unused_bindings'] == []
    with open(os.path.join(root_dir, 'metrics.json')) as f:
        assert json.load(f) == metrics


def test_returns_are_finite(mujoco_run):
    root_dir, metrics = mujoco_run
    assert math.isfinite(metrics['final_eval_return'])
    scalars = read_scalars(root_dir)
    for tag in (tags.EVAL_AVERAGE_RETURN, tags.TRAIN_LOSS, tags.TRAIN_MEAN_Q):
        assert scalars[tag] and all(math.isfinite(value) for _, value in scalars[tag]), tag


def test_checkpoint_holds_the_final_step(mujoco_run):
    root_dir, _ = mujoco_run
    latest = tf.train.latest_checkpoint(os.path.join(root_dir, 'checkpoints'))
    assert latest is not None
    names = {name for name, _ in tf.train.list_variables(latest)}
    env_step = next(name for name in names if name.startswith('env_step'))
    assert tf.train.load_variable(latest, env_step) == ENV_STEPS


def _random_steps(env_id, num_steps, seed=0):
    """Steps one adapted copy with uniform-random actions; yields each TimeStep."""
    env = make_env(env_id=env_id, num_envs=1, seed=seed)
    spec = env.action_spec()
    rng = np.random.default_rng(seed)
    try:
        yield env.reset()
        for _ in range(num_steps):
            action = rng.uniform(spec.minimum, spec.maximum, (1, *spec.shape))
            yield env.step(action.astype(np.float32))
    finally:
        env.close()


def test_halfcheetah_truncates_at_1000_steps_and_bootstraps():
    steps = list(_random_steps('HalfCheetah-v5', 1000))
    assert steps[0].observation.dtype == np.float32 and steps[0].observation.shape == (1, 17)
    assert [int(s.step_type[0]) for s in steps[1:1000]] == [1] * 999
    last = steps[1000]
    # Truncation ends the episode but not the task: discount 1, so targets bootstrap.
    assert int(last.step_type[0]) == 2 and float(last.discount[0]) == 1.0


def test_hopper_falling_over_terminates_with_discount_0():
    lasts = [s for s in _random_steps('Hopper-v5', 300) if int(s.step_type[0]) == 2]
    assert lasts, 'a random Hopper falls within 300 steps'
    assert all(float(s.discount[0]) == 0.0 for s in lasts)


def test_a_mujoco_episode_renders_headless_into_a_video():
    import gin

    from experiment import video

    assert os.environ.get('MUJOCO_GL') or os.environ.get('DISPLAY')  # set by envs/
    gin.clear_config()  # an earlier train_main in this process left its config locked
    gin.bind_parameter('make_env.max_episode_steps', 30)
    rng = np.random.default_rng(0)
    try:
        frames, _, fps = video.play_and_render(
            lambda time_step: rng.uniform(-1, 1, (1, 6)).astype(np.float32),
            env_id='HalfCheetah-v5', seed=0)
    except Exception as error:  # noqa: BLE001  (no EGL/OSMesa library on this machine)
        pytest.skip(f"MuJoCo cannot render with MUJOCO_GL={os.environ.get('MUJOCO_GL')} here "
                    f"({type(error).__name__}: {error}); install libegl1 and libgl1-mesa-dri")
    finally:
        gin.clear_config()
    assert frames.shape[0] == 30 and frames.dtype == np.uint8 and frames.shape[-1] == 3
    assert frames.std() > 0 and not np.array_equal(frames[0], frames[-1])
    gif, width, height = video.encode_gif(frames, fps)
    assert gif.startswith(b'GIF8') and max(width, height) <= video.MAX_SIDE
