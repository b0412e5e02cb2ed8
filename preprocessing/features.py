"""Example feature functions for `preprocess.FeatureFunction` (and how to write your own).

A feature function takes a batch of observations [N, ...] as a tensor and
returns a tensor [N, ...] of TF ops; register it with Gin and bind it:

    run.preprocessing = [@preprocess.FeatureFunction()]
    preprocess.FeatureFunction.fn = @preprocess.squared_features

Your own lives in your own module (imported before the config is parsed,
e.g. by a `import` line at the top of the Gin file: `import my_project.features`).
"""

import gin
import tensorflow as tf


@gin.configurable(module='preprocess')
def squared_features(observation):
    """[x, x^2]: lets a small network see magnitudes directly (an example, not a cure)."""
    observation = tf.cast(observation, tf.float32)
    return tf.concat([observation, tf.square(observation)], axis=-1)
