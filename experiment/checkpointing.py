"""Training checkpoints: everything a resumed run needs, written atomically.

`tf.train.CheckpointManager` writes the new checkpoint's files first and only
then replaces the small `checkpoint` state file (atomically), so a run killed
mid-write still points at the previous, complete checkpoint.
"""

import os

import tensorflow as tf

from core.errors import UserError


class Checkpointer:
    """Saves and restores one tree of trackables under `directory`."""

    def __init__(self, directory, *, max_to_keep=2, **trackables):
        self._directory = directory
        self._checkpoint = tf.train.Checkpoint(**trackables)
        self._manager = tf.train.CheckpointManager(
            self._checkpoint, directory, max_to_keep=max_to_keep)

    @property
    def latest(self):
        return self._manager.latest_checkpoint

    def restore_latest(self, *, say=print):
        """Restores the newest checkpoint that can be restored, if any.

        A checkpoint a crash left unusable (its index names missing or truncated
        files) is skipped for the previous one, saying so.

        Returns:
          The restored checkpoint's path, or None when there was none.

        Raises:
          UserError: no kept checkpoint can be restored, or none matches this run.
        """
        candidates = list(reversed(self._manager.checkpoints))
        latest = self._manager.latest_checkpoint
        if latest is None:
            return None
        if latest not in candidates:
            candidates.insert(0, latest)
        failures = []
        for path in candidates:
            try:
                status = self._checkpoint.restore(path)
                status.assert_existing_objects_matched()
            except UserError:
                raise  # the checkpoint is sound but does not fit this run (e.g. another codec)
            except Exception as error:  # noqa: BLE001  (any failure means unusable; say why)
                failures.append((path, str(error).strip().splitlines()[0][:160]))
                continue
            for bad, reason in failures:
                say(f"warning: checkpoint {bad} cannot be restored ({reason}); fell back to "
                    f"{os.path.basename(path)}.")
            return path
        path, reason = failures[0]
        raise UserError(
            f"Checkpoint {path} cannot be restored ({reason}) and no older one can either: "
            "delete the checkpoints directory to start over, or pass a new --root_dir.")

    def save(self, step):
        """Writes checkpoint `ckpt-<step>` and prunes old ones."""
        return self._manager.save(checkpoint_number=int(step))
