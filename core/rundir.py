"""The run directory: config fingerprint, final metrics, atomic writes.

Layout of a root_dir:
  config.gin            the parsed Gin config this run was started with
  operative_config.gin  the values actually used (written once wiring is built)
  checkpoints/          training checkpoints (see checkpointing.py)
  tb/                   TensorBoard event files
  policy/               the final greedy policy as a SavedModel
  metrics.json          the final metrics train.py returns
"""

import json
import os
import tempfile

from core.errors import UserError
from core.runlock import RunLock

CONFIG_FILE = 'config.gin'


def atomic_write_text(path, text):
    """Writes via a temp file, fsync and rename, so a reader never sees half a file.

    The fsync makes the rename durable: after a power loss the file holds the
    old text or the new one, never an empty or partial one.
    """
    directory = os.path.dirname(path) or '.'
    fd, tmp_path = tempfile.mkstemp(dir=directory, prefix='.tmp-')
    try:
        with os.fdopen(fd, 'w') as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
        raise


def prepare(root_dir, config_str, *, force=False):
    """Creates root_dir, or checks that a resumed run keeps the same config.

    Args:
      root_dir: the run's directory.
      config_str: `gin.config_str()` of the run being started.
      force: accept a config that differs from the one the run started with.

    Returns:
      True when root_dir already holds a run (a resume).

    Raises:
      UserError: root_dir is not writable, or the config changed without force.
    """
    try:
        os.makedirs(root_dir, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=root_dir, prefix='.write-test-')
        probe.close()
    except OSError as error:
        raise UserError(
            f"Cannot write to root_dir {root_dir!r} ({error.strerror}): "
            "pass a writable --root_dir.") from None
    config_path = os.path.join(root_dir, CONFIG_FILE)
    if not os.path.exists(config_path):
        atomic_write_text(config_path, config_str)
        return False
    with open(config_path) as f:
        previous = f.read()
    if not previous.strip():
        # Damage from a crash of an older, non-fsyncing write: the checkpoints (not this
        # record) decide whether there is a run to resume.
        atomic_write_text(config_path, config_str)
        return _holds_progress(root_dir)
    if previous != config_str and not _holds_progress(root_dir):
        # A start that failed before training (a bad value, a missing package) left only
        # its config: nothing to protect, so the corrected command just starts.
        atomic_write_text(config_path, config_str)
        return False
    if previous != config_str:
        if not force:
            raise UserError(
                f"{root_dir} holds a run with a different config (see {config_path}): "
                "pass --force to resume it with the new config, or use another --root_dir.")
        atomic_write_text(config_path, config_str)
    return True


def open_run(root_dir, config_str, *, force=False):
    """Locks root_dir for this process, then `prepare`s it.

    The lock comes first, before anything in root_dir is read or written, so a
    second process on the same directory is refused before it touches a file.

    Returns:
      (resuming, lock): `prepare`'s answer and the held `RunLock` (keep a
      reference: the lock is released when it is closed or collected).
    """
    try:
        os.makedirs(root_dir, exist_ok=True)
    except OSError as error:
        raise UserError(
            f"Cannot write to root_dir {root_dir!r} ({error.strerror}): "
            "pass a writable --root_dir.") from None
    lock = RunLock(root_dir).acquire()
    try:
        return prepare(root_dir, config_str, force=force), lock
    except BaseException:
        lock.release()
        raise


def _holds_progress(root_dir):
    """Whether root_dir holds anything a run produced beyond its config: checkpoints, events."""
    produced = (os.path.join('checkpoints', 'checkpoint'), 'metrics.json', 'tb', 'reverb')
    return any(os.path.exists(os.path.join(root_dir, name)) for name in produced)


def write_metrics(root_dir, metrics):
    atomic_write_text(os.path.join(root_dir, 'metrics.json'),
                      json.dumps(metrics, indent=2, sort_keys=True) + '\n')
