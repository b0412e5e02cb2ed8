"""core/tf_setup.py: the seed reaches every initializer a run uses."""

import numpy as np
import tensorflow as tf

from core.tf_setup import configure_tf


def _critic_like_kernel():
    configure_tf(0, 1)
    # SAC's critics name their initializer by string, which Keras 2.15 draws from its own
    # generator: tf.random.set_seed alone left it unseeded (same-seed SAC runs differed).
    layer = tf.keras.layers.Dense(4, kernel_initializer='glorot_uniform')
    layer.build([None, 3])
    return layer.kernel.numpy()


def test_the_same_seed_gives_the_same_keras_initial_weights():
    np.testing.assert_array_equal(_critic_like_kernel(), _critic_like_kernel())
