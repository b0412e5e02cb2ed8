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

    def restore_latest(self):
        """Restores the newest checkpoint, if any.

        Returns:
          The restored checkpoint's path, or None when there was none.

        Raises:
          UserError: the checkpoint is unreadable or does not match this run.
        """
        path = self._manager.latest_checkpoint
        if path is None:
            return None
        try:
            status = self._checkpoint.restore(path)
            status.assert_existing_objects_matched()
        except Exception as error:  # noqa: BLE001  (any failure means unusable; say why)
            reason = str(error).strip().splitlines()[0][:160]
            older = [p for p in self._manager.checkpoints if p != path]
            fallback = (f"delete {path}.* to fall back to {os.path.basename(older[-1])}"
                        if older else "delete the checkpoints directory to start over")
            raise UserError(
                f"Checkpoint {path} cannot be restored ({reason}): {fallback}, "
                "or pass a new --root_dir.") from None
        return path

    def save(self, step):
        """Writes checkpoint `ckpt-<step>` and prunes old ones."""
        return self._manager.save(checkpoint_number=int(step))
