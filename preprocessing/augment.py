"""Sampling-time augmentations (pure functions of TF ops; XLA-compilable)."""

import tensorflow as tf


def random_shift(frames, pad):
    """Shifts each frame of `frames` [N, H, W, C] by its own random (dy, dx) in [-pad, pad].

    Equivalent to padding by `pad` with the edge pixels repeated and cropping a
    random H x W window (DrQ's augmentation), done as two gathers of clipped row
    and column indices, so nothing padded is ever materialised.
    """
    shifts = tf.random.uniform([tf.shape(frames)[0], 2], minval=-pad, maxval=pad + 1,
                               dtype=tf.int32)
    return _shifted(frames, shifts)


@tf.function(jit_compile=True, autograph=False)
def _shifted(frames, shifts):
    """The two gathers, compiled: TF's own batched gathers of uint8 frames are ~5x slower
    than XLA's on this CPU (352 stacks of 84x84x4: 11.5 ms -> 2.4 ms). The shifts are
    drawn outside, so they follow TF's seeds."""
    shape = tf.shape(frames)
    height, width = shape[1], shape[2]
    rows = tf.clip_by_value(tf.range(height)[None, :] + shifts[:, :1], 0, height - 1)
    cols = tf.clip_by_value(tf.range(width)[None, :] + shifts[:, 1:], 0, width - 1)
    shifted = tf.gather(frames, rows, axis=1, batch_dims=1)
    return tf.gather(shifted, cols, axis=2, batch_dims=1)
