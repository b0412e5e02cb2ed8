"""Process-wide TensorFlow settings every entry point applies first (one place for all roles)."""

import tensorflow as tf


def configure_tf(seed, tf_threads):
    """Sizes TF's thread pools and seeds its global RNG.

    `tf.keras.utils.set_random_seed`, not only `tf.random.set_seed`: Keras 2.15's initializers
    named by string ('glorot_uniform', as SAC's critics use) draw unseeded from Keras' own
    generator, so SAC and CQL-SAC runs with the same seed started from different critic weights.
    It seeds Python's and NumPy's global RNGs too; nothing here uses those.

    Thread pools can be set only before TF runs its first op; a process that
    already did (tests run several experiments or roles in one interpreter)
    keeps its pools, and only the seed is applied.
    """
    try:
        tf.config.threading.set_intra_op_parallelism_threads(tf_threads)
        tf.config.threading.set_inter_op_parallelism_threads(tf_threads)
    except RuntimeError:
        pass  # TF already initialised in this process: its pools stay as they are.
    tf.keras.utils.set_random_seed(seed)
