"""Sampling-time augmentations (pure functions of TF ops; XLA-compilable)."""

import tensorflow as tf


def random_shift(frames, pad):
    """Shifts each frame of `frames` [N, H, W, C] by its own random (dy, dx) in [-pad, pad].

    Equivalent to padding by `pad` with the edge pixels repeated and cropping a
    random H x W window (DrQ's augmentation), done as two gathers of clipped row
    and column indices, so nothing padded is ever materialised.
    """
    shape = tf.shape(frames)
    count, height, width = shape[0], shape[1], shape[2]
    shifts = tf.random.uniform([count, 2], minval=-pad, maxval=pad + 1, dtype=tf.int32)
    rows = tf.clip_by_value(tf.range(height)[None, :] + shifts[:, :1], 0, height - 1)
    cols = tf.clip_by_value(tf.range(width)[None, :] + shifts[:, 1:], 0, width - 1)
    shifted = tf.gather(frames, rows, axis=1, batch_dims=1)
    return tf.gather(shifted, cols, axis=2, batch_dims=1)
