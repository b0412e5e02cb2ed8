"""Videos of the greedy policy playing: one episode, rendered headless, as an animated GIF.

A GIF needs nothing beyond Pillow (no ffmpeg), plays in every browser, and
is what TensorBoard 2.15's Images tab shows animated: its image plugin serves
GIF bytes as image/gif. Frames are the env's `rgb_array` renders (pygame
draws classic control and Box2D into arrays without a display; MuJoCo needs
`MUJOCO_GL=egl` or `osmesa`, see docs/training.md), one per step taken, so
a video has as many frames as its episode has steps. Large renders are
shrunk by an integer factor to at most `MAX_SIDE` pixels a side.
"""

import io
import math
import os

import gin
import numpy as np

from core.errors import UserError

MAX_SIDE = 400


def _render_env(env_id, seed):
    """One copy of the run's env (or `env_id`) that renders rgb_array frames."""
    from envs.suite import make_env

    try:
        kwargs = dict(gin.query_parameter('make_env.env_kwargs') or {})
    except ValueError:
        kwargs = {}
    kwargs['render_mode'] = 'rgb_array'
    options = {'env_id': env_id} if env_id else {}
    with gin.config_scope('eval'):  # the episode an evaluation plays (e.g. its time limit)
        return make_env(num_envs=1, seed=seed, env_kwargs=kwargs, **options)


class RenderError(UserError):
    """The environment cannot render frames here (no rgb_array mode, no OpenGL back end)."""


def _render(env):
    """One frame of a one-copy env; any renderer failure becomes a one-line RenderError."""
    try:
        return env.render()[0]
    except Exception as error:  # noqa: BLE001  (pygame, MuJoCo's GL back ends, ...)
        reason = ' '.join(str(error).split())[:160] or type(error).__name__
        raise RenderError(
            f"Cannot render frames for a video ({type(error).__name__}: {reason}). MuJoCo needs "
            "MUJOCO_GL=egl (Debian: libegl1, libgl1-mesa-dri) or osmesa (libosmesa6); or turn "
            "videos off: run.video_interval=0, run.final_video=False.") from None


def play_and_render(act, *, env_id=None, seed=0):
    """Plays one greedy episode; returns (frames [T, H, W, 3] uint8, return, fps)."""
    env = _render_env(env_id, seed)
    try:
        fps = env.envs[0].gym_env.metadata.get('render_fps') or 30
        time_step = env.reset()
        frames, episode_return = [], 0.0
        while True:
            frame = _render(env)
            if frame is None:
                raise RenderError("The environment rendered no frame: it does not support "
                                "render_mode='rgb_array', so it cannot be recorded.")
            frames.append(np.asarray(frame, np.uint8))
            time_step = env.step(act(time_step))
            episode_return += float(time_step.reward[0])
            if time_step.is_last()[0]:
                break
    finally:
        env.close()
    return np.stack(frames), episode_return, fps


def frame_duration_ms(fps):
    """Each frame's display time: GIF counts in hundredths of a second, at least 2."""
    return max(20, 10 * round(100 / fps))


def encode_gif(frames, fps):
    """GIF bytes of `frames`, shrunk to at most MAX_SIDE pixels a side; (bytes, width, height).

    Like every GIF encoder, Pillow stores a frame identical to the one before it
    (a pole at rest, at this size) once, showing it for the sum of both
    durations: the playing time stays one frame duration per episode step.
    """
    from PIL import Image

    factor = max(1, math.ceil(max(frames.shape[1:3]) / MAX_SIDE))
    images = [Image.fromarray(frame).reduce(factor) if factor > 1 else Image.fromarray(frame)
              for frame in frames]
    buffer = io.BytesIO()
    images[0].save(buffer, format='GIF', save_all=True, append_images=images[1:],
                   duration=frame_duration_ms(fps), loop=0)
    return buffer.getvalue(), images[0].width, images[0].height


def record_video(act, path_stem, *, env_id=None, seed=0):
    """Records one episode to `<path_stem>_return_<R>.gif` (atomically); returns the path."""
    frames, episode_return, fps = play_and_render(act, env_id=env_id, seed=seed)
    gif, _, _ = encode_gif(frames, fps)
    return write_gif(gif, f'{path_stem}_return_{episode_return:.1f}.gif')


def write_gif(gif, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp_path = path + '.tmp'
    with open(tmp_path, 'wb') as f:
        f.write(gif)
    os.replace(tmp_path, path)
    return path


class VideoRecorder:
    """The `run.video_interval` hook: root_dir/videos/step_<N>_return_<R>.gif plus TensorBoard."""

    def __init__(self, root_dir, act, writer, *, seed):
        self._dir = os.path.join(root_dir, 'videos')
        self._act = act
        self._writer = writer
        self._seed = seed
        self.last_path = None

    def record(self, step, diagnostics=None):
        del diagnostics
        frames, episode_return, fps = play_and_render(self._act, seed=self._seed)
        gif, width, height = encode_gif(frames, fps)
        self.last_path = write_gif(
            gif, os.path.join(self._dir, f'step_{int(step):08d}_return_{episode_return:.1f}.gif'))
        self._writer.animation('eval/video', gif, width, height, step,
                               description=f'greedy episode, return {episode_return:.1f}')
        return self.last_path
