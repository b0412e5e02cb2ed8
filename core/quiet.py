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
import sys
import warnings

_library_logs = False


@contextlib.contextmanager
def native_log_lines_hidden():
    """Hides what native code writes to stderr inside (unless `--verbose` asked for it).

    TF 2.15's XLA logs "Compiled cluster using XLA!" through absl's C++ logger,
    preceded by "WARNING: All log messages before absl::InitializeLog() ...",
    whatever TF_CPP_MIN_LOG_LEVEL says; both go straight to file descriptor 2.
    Wrap the first compiled call in this. Python exceptions are unaffected
    (they are printed after the block, by which time stderr is restored).
    """
    if _library_logs:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def quiet_startup(library_logs=False):
    """Silences known start-up noise and imports TF and tf_agents quietly.

    Args:
      library_logs: keep TF's C++ log lines and absl/TF Python logging at their
        defaults (`--verbose`); the banners and warnings fixed below stay off.
    """
    global _library_logs
    _library_logs = library_logs
    if not library_logs:
        os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
    # pygame (Gymnasium's renderer, used for videos) opens the sound card on init: on a
    # machine without one ALSA prints a dozen error lines. Videos need no sound.
    os.environ.setdefault('SDL_AUDIODRIVER', 'dummy')
    os.environ.setdefault('PYGAME_HIDE_SUPPORT_PROMPT', '1')
    warnings.filterwarnings('ignore', category=SyntaxWarning)
    warnings.filterwarnings('ignore', message='.*StructuredValue.*')
    with contextlib.redirect_stderr(io.StringIO()):
        import gym  # noqa: F401  (prints its banner to stderr on import)
    import absl.logging
    import tensorflow as tf

    if not library_logs:
        tf.get_logger().setLevel(logging.ERROR)
        absl.logging.set_verbosity(absl.logging.ERROR)
