"""Pixel replay: each frame stored once (optionally compressed), stacks built when sampled.

An Atari environment yields one [84, 84] frame per step, while the Q-network
reads the last k frames as [84, 84, k]. Storing stacks (TF-Agents' examples,
SB3) keeps every frame k times, plus a next observation: 28-56 KB per
transition, 28 GB for a 1M buffer. `FrameStackedReplay` wraps any backend
(uniform, prioritized, episodic, Reverb) so that it stores one frame per step
(7 KB raw, ~0.2-0.8 KB compressed) and samples windows k - 1 steps longer than
the agent's; `stack_windows` turns each window's frames into the stacks of its
last T steps. The inner backend never knows it holds pixels, so priorities,
checkpoints and Reverb's chunk sharing (overlapping items share frames) work
unchanged.

Episode starts: frames before an episode's first step are that first frame
repeated (what the acting side does too, `agents/frame_stack.py`), so a stack
never shows a frame of another episode, also across the LAST -> FIRST
boundary rows of auto-resetting env copies.

Codecs (`FrameStackedReplay.codec`), measured on real frames (docs/atari.md):
'lz4' (lossless, LZ4 HC level 3; default): about zlib's size (smaller on
Boxing) and ~10x faster to decode, which is what sampling pays for every
sampled frame; 'zlib' (lossless, level 1, decoded by TF's own kernel);
'jpeg' (lossy, `jpeg_quality`; larger than lz4 on Atari frames); 'none' (raw
uint8). Only the sampled frames are decoded. The codec is recorded in the
checkpoint, and a resume with another codec is refused: its stored strings
would decode to garbage.
"""

import json
import sys
import zlib

import gin
import lz4.block
import numpy as np
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

from buffers.base import allow_concurrent_writes
from buffers.frame_file import FrameFile
from core.errors import UserError

CODECS = ('lz4', 'zlib', 'jpeg', 'none')
LZ4_LEVEL = 3  # LZ4 HC: levels 1-3 encode as fast as zlib-1; 9 costs ~4x for ~8% less
# numpy holds a batch of strings as fixed-width bytes, which drop trailing NUL bytes (and an
# LZ4 block may end in one); a non-NUL end byte keeps every stored string intact.
_END = b'\x01'


def stack_windows(frames, step_type, num_frames):
    """[B, W, H, Wd] frames of W consecutive steps -> [B, W - k + 1, H, Wd, k] stacks.

    Stack t holds the frames of steps t .. t + k - 1 of the window (oldest first),
    except that steps before the newest episode start (a FIRST step) at or before
    step t + k - 1 are replaced by that first step's frame.
    """
    window = tf.shape(frames)[1]
    steps = tf.range(window)
    is_first = tf.equal(step_type, ts.StepType.FIRST)
    starts = tf.where(is_first, steps[None, :], 0)  # [B, W]; 0 where no episode starts
    # The newest episode start at or before each step j: max over i <= j of starts[i].
    at_or_before = steps[None, None, :] <= steps[None, :, None]  # [1, j, i]
    newest_start = tf.reduce_max(tf.where(at_or_before, starts[:, None, :], 0), axis=2)
    last = steps[num_frames - 1:]  # the newest step of each stack
    offsets = tf.range(num_frames) - (num_frames - 1)  # oldest first
    sources = last[:, None] + offsets[None, :]  # [T, k]
    sources = tf.maximum(sources[None], tf.gather(newest_start, last, axis=1)[:, :, None])
    if num_frames == 4 and sys.byteorder == 'little':
        return _packed_stacks(frames, sources)
    stacks = tf.gather(frames, sources, axis=1, batch_dims=1)  # [B, T, k, H, Wd]
    return tf.transpose(stacks, [0, 1, 3, 4, 2])


def _packed_stacks(frames, sources):
    """Four frames per stack, channels-last, without a uint8 transpose.

    Why: the transpose to channels-last moves single bytes with a stride of four,
    the slowest part of stacking. Here each pixel's four frames are packed into one
    uint32 (frame i in byte i, shifted into place), whose bytes in memory are the
    channels in order on a little-endian machine: a bitcast. ~4% more sampled
    batches/s with LZ4, 4-step windows (A/B in one process; docs/atari_replay.md has the bench).
    """
    packed = None
    for channel in range(4):
        plane = tf.gather(frames, sources[:, :, channel], axis=1, batch_dims=1)  # [B, T, H, Wd]
        plane = tf.bitwise.left_shift(tf.cast(plane, tf.uint32), 8 * channel)
        packed = plane if packed is None else tf.bitwise.bitwise_or(packed, plane)
    return tf.bitcast(packed, tf.uint8)  # [B, T, H, Wd, 4]


class Codec:
    """Encodes batches of uint8 frames into strings and decodes sampled ones, in graph."""

    def __init__(self, name, frame_shape, jpeg_quality=95):
        if name not in CODECS:
            raise UserError(f"FrameStackedReplay.codec={name!r} is not a codec: choose one of "
                            f"{', '.join(CODECS)}.")
        if not 1 <= int(jpeg_quality) <= 100:
            raise UserError(f"FrameStackedReplay.jpeg_quality={jpeg_quality!r} must lie in "
                            "1..100.")
        self.name = name
        self.frame_shape = tuple(frame_shape)
        self.jpeg_quality = int(jpeg_quality)

    @property
    def compresses(self):
        return self.name != 'none'

    def stored_spec(self, frame_spec):
        if not self.compresses:
            return frame_spec
        return tf.TensorSpec([], tf.string, name=frame_spec.name)

    def encode(self, frames):
        """[N, H, W] uint8 -> [N] strings (unchanged for 'none')."""
        if self.name == 'none':
            return frames
        if self.name == 'jpeg':
            return tf.map_fn(
                lambda frame: tf.io.encode_jpeg(frame[..., None], quality=self.jpeg_quality),
                frames, fn_output_signature=tf.string)
        encode = _lz4_encode if self.name == 'lz4' else _zlib_encode
        encoded = tf.numpy_function(encode, [frames], tf.string, stateful=False)
        return tf.ensure_shape(encoded, frames.shape[:1])

    def decode(self, encoded):
        """[M] strings -> [M, H, W] uint8 (unchanged for 'none')."""
        if self.name == 'none':
            return encoded
        if self.name == 'jpeg':
            frames = tf.map_fn(lambda data: tf.io.decode_jpeg(data, channels=1), encoded,
                               fn_output_signature=tf.uint8)
            return tf.reshape(frames, [-1, *self.frame_shape])
        if self.name == 'lz4':
            size = int(np.prod(self.frame_shape))
            raw = tf.numpy_function(lambda blobs: _lz4_decode(blobs, size), [encoded], tf.uint8,
                                    stateful=False)
            return tf.reshape(raw, [-1, *self.frame_shape])
        raw = tf.io.decode_raw(tf.io.decode_compressed(encoded, 'ZLIB'), tf.uint8)
        return tf.reshape(raw, [-1, *self.frame_shape])


def _describe(spec):
    """'float32 [4]' for a spec (a nest: 'nested observations'), for one-line errors."""
    if tf.nest.is_nested(spec):
        return 'nested observations'
    return f'{tf.as_dtype(spec.dtype).name} {list(spec.shape)}'


def _zlib_encode(frames):
    return np.array([zlib.compress(frame.tobytes(), 1) for frame in frames], dtype=object)


def _lz4_encode(frames):
    return np.array([lz4.block.compress(frame.tobytes(), mode='high_compression',
                                        compression=LZ4_LEVEL, store_size=False) + _END
                     for frame in frames], dtype=object)


def _lz4_decode(blobs, size):
    """[M] stored strings -> [M * size] uint8, each frame decoded into its slice of one array.

    `tolist()` hands over plain bytes objects, and slicing off the end byte copies a few
    hundred bytes: ~20% faster than iterating numpy's bytes scalars through memoryviews.
    """
    frames = np.empty(len(blobs) * size, np.uint8)
    view = memoryview(frames)
    decompress = lz4.block.decompress
    for index, blob in enumerate(blobs.tolist()):
        view[index * size:(index + 1) * size] = decompress(blob[:-1], uncompressed_size=size)
    return frames


class _CodecName(tf.train.experimental.PythonState):
    """The codec, in the training checkpoint: a resume with another one is refused."""

    def __init__(self, name):
        self._name = name

    def serialize(self):
        return json.dumps({'codec': self._name})

    def deserialize(self, string_value):
        saved = json.loads(string_value)['codec']
        if saved != self._name:
            raise UserError(f"The checkpoint's replay frames are stored with "
                            f"FrameStackedReplay.codec={saved!r}, this run's is {self._name!r}: "
                            f"resume with --gin_bindings=\"FrameStackedReplay.codec='{saved}'\".")


@gin.configurable
class FrameStackedReplay(tf.Module):
    """Any replay backend, storing single frames and sampling stacks of `num_frames`."""


    def __init__(self, backend_class, data_spec, *, num_frames, capacity, num_envs=1,
                 batch_size=1, num_steps=2, seed=0, codec='lz4', jpeg_quality=95,
                 storage='memory', directory=None, name='frame_stacked_replay', **options):
        """Builds `backend_class` for single frames and windows `num_frames - 1` longer.

        Args:
          backend_class: the backend that stores the steps (run.replay_backend).
          data_spec: the agent's data spec; its observation is the stack [H, W, k].
          num_frames: k, the frames per stack (run.frame_stack).
          capacity, num_envs, batch_size, num_steps, seed, options: as for the backend;
            num_steps is the agent's window, before the k - 1 context steps.
          codec: 'lz4', 'zlib', 'jpeg' or 'none' (see the module docstring).
          jpeg_quality: JPEG quality 1..100 for codec='jpeg' (lossy).
          storage: 'memory', or 'memmap': raw frames in a memory-mapped file under
            `directory` (buffers/frame_file.py), for buffers larger than RAM; needs
            codec='none' and an in-process backend.
          directory: where the memmap file lives (the wiring passes <root_dir>/replay_frames).
          name: module name.
        """
        super().__init__(name=name)
        stack_spec = data_spec.observation
        if (tf.nest.is_nested(stack_spec) or stack_spec.dtype != tf.uint8
                or stack_spec.shape.rank != 3 or stack_spec.shape[-1] != num_frames):
            raise UserError(f"run.frame_stack={num_frames} needs uint8 frames [H, W] from the "
                            f"environment, not {_describe(stack_spec)}: use an image "
                            "environment (e.g. ALE/Pong-v5) or run.frame_stack=1.")
        if backend_class.capabilities.episode_windows:
            raise UserError(f"{backend_class.__name__} keeps sampled windows inside one episode, "
                            f"so with run.frame_stack={num_frames} an episode's first "
                            f"{num_frames - 1} steps (which need frames before them) would never "
                            "be trained on: use UniformReplay, PrioritizedReplay or a Reverb "
                            "backend.")
        frame_spec = tf.TensorSpec(stack_spec.shape[:-1], tf.uint8, name=stack_spec.name)
        self.codec = Codec(codec, frame_spec.shape, jpeg_quality)
        self.frame_file = None
        if storage == 'memmap':
            if codec != 'none' or backend_class.capabilities.own_checkpoints:
                raise UserError("FrameStackedReplay.storage='memmap' keeps raw frames in a file "
                                "this process owns: use it with FrameStackedReplay.codec='none' "
                                "and an in-process backend (not Reverb).")
            self.codec = self.frame_file = FrameFile(directory, frame_spec.shape, capacity)
        elif storage != 'memory':
            raise UserError(f"FrameStackedReplay.storage={storage!r}: choose 'memory' or "
                            "'memmap'.")
        self.num_frames = num_frames
        # Stacking is a gather and a uint8 transpose to channels-last, which TF's own CPU
        # kernels do ~4x slower than XLA's (bench/atari_replay.py): compile just that part.
        self._stack = tf.function(
            lambda frames, step_type: stack_windows(frames, step_type, num_frames),
            jit_compile=True, autograph=False)
        self._data_spec = data_spec
        self.stored_spec = data_spec._replace(observation=self.codec.stored_spec(frame_spec))
        self.inner = backend_class(
            self.stored_spec, capacity=capacity, num_envs=num_envs, batch_size=batch_size,
            num_steps=num_steps + num_frames - 1, seed=seed, **options)
        # The inner backend's, except XLA (decoding and the stacking gathers run on TF's own
        # kernels) and bulk steps (they would bypass the codec).
        self.capabilities = self.inner.capabilities.narrowed(xla=False, bulk_steps=False)

    @property
    def data_spec(self):
        return self._data_spec

    @property
    def capacity(self):
        return self.inner.capacity

    def read_through(self, inner):
        """Samples stacks from `inner` instead of the backend it built (same stored frames):
        a sharded learner reads every shard's single frames through one `ShardedReplay` and
        stacks them here. The backend it built is left to its owner to close."""
        self.inner = inner
        self.capabilities = inner.capabilities.narrowed(xla=False, bulk_steps=False)

    def add(self, trajectory):
        """Stores the newest frame of each env copy (what the environment yielded)."""
        self.inner.add(trajectory._replace(observation=self.codec.encode(trajectory.observation)))

    def stacked(self, window):
        """A sampled window of stored frames -> the agent's window of stacks."""
        encoded = window.observation
        outer = tf.shape(window.step_type)
        frames = self.codec.decode(tf.reshape(encoded, [-1, *encoded.shape[2:]]))
        frames = tf.reshape(frames, tf.concat([outer, self.codec.frame_shape], 0))
        stacks = self._stack(frames, window.step_type)
        context = self.num_frames - 1
        rest = tf.nest.map_structure(lambda value: value[:, context:],
                                     window._replace(observation=()))
        return rest._replace(observation=stacks)

    def sample(self, batch_size, num_steps):
        window, info = self.inner.sample(batch_size, num_steps + self.num_frames - 1)
        return self.stacked(window), info

    def as_dataset(self, batch_size, num_steps):
        # Stacked (and decoded) on tf.data's threads, ahead of use.
        return self.inner.as_dataset(batch_size, num_steps + self.num_frames - 1).map(
            lambda window, info: (self.stacked(window), info),
            num_parallel_calls=tf.data.AUTOTUNE)

    def update_priorities(self, keys, priorities):
        self.inner.update_priorities(keys, priorities)

    def retarget(self, server_address, *, old_server_alive=True):
        """A Reverb inner backend's `retarget` (a collector moving replay shards)."""
        self.inner.retarget(server_address, old_server_alive=old_server_alive)

    def allow_concurrent_writes(self, steps):
        """As the inner backend's (a frame is written before its step is counted)."""
        allow_concurrent_writes(self.inner, steps)

    def metrics(self):
        return self.inner.metrics()

    def histograms(self):
        return self.inner.histograms()

    def ages(self, keys):
        return self.inner.ages(keys)

    def checkpoint_items(self):
        items = dict(self.inner.checkpoint_items())
        items['frame_codec'] = _CodecName(self.codec.name if self.frame_file is None else 'memmap')
        if self.frame_file is not None:
            items['frame_file'] = self.frame_file.checkpoint_item()
        return items

    def close(self):
        self.inner.close()
