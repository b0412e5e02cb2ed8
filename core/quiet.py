"""Start-up noise control, applied before TensorFlow is imported.

TF prints CUDA-plugin registration errors on CPU-only machines, tf_agents'
import of the old `gym` prints a deprecation banner, and autograph emits
SyntaxWarnings for TF-Agents' own code. None of it is actionable for a user,
and it buries the progress lines, so it is silenced here -- once, at start-up.
"""

import contextlib
import io
import logging
import os
import warnings


def quiet_startup():
    """Silences known start-up noise and imports TF and tf_agents quietly."""
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
    warnings.filterwarnings('ignore', category=SyntaxWarning)
    warnings.filterwarnings('ignore', message='.*StructuredValue.*')
    with contextlib.redirect_stderr(io.StringIO()):
        import gym  # noqa: F401  (prints its banner to stderr on import)
    import absl.logging
    import tensorflow as tf

    tf.get_logger().setLevel(logging.ERROR)
    absl.logging.set_verbosity(absl.logging.ERROR)
