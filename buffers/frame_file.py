"""Frames in a memory-mapped file: replay larger than RAM (FrameStackedReplay.storage='memmap').

The frames live in `<directory>/frames.u8`, a numpy memmap of `slots` raw
frames, and `<directory>/frame_ids.i64` records which frame id each slot holds.
The replay backend stores frame ids (int64) where it would store frames; the
operating system keeps the hot pages in RAM and the rest on disk.

Resume. The frame counter is in the training checkpoint; the file is not copied
into it (that would be the whole buffer at every checkpoint). The file has
twice the buffer's slots, so the frames written after the last checkpoint (up
to a buffer's worth) overwrite only frames the restored buffer no longer
holds, and a resume finds every frame it references. Slots written after the
checkpoint are detected by their ids; if any frame the restored buffer needs
was overwritten (a kill more than `capacity` steps after the last checkpoint),
the restore refuses in one line instead of training on wrong frames.
"""

import json
import os

import numpy as np
import tensorflow as tf

from core.errors import UserError

FRAMES_FILE = 'frames.u8'
IDS_FILE = 'frame_ids.i64'


class _Counter(tf.train.experimental.PythonState):
    """The next frame id, in the training checkpoint; a restore checks the file against it."""

    def __init__(self, frame_file):
        self._file = frame_file

    def serialize(self):
        self._file.flush()
        return json.dumps({'next_id': self._file.next_id, 'slots': self._file.slots,
                           'frame_shape': list(self._file.frame_shape)})

    def deserialize(self, string_value):
        saved = json.loads(string_value)
        if saved['slots'] != self._file.slots or tuple(saved['frame_shape']) != \
                self._file.frame_shape:
            raise UserError(f"The checkpoint's replay frame file held {saved['slots']:,} frames "
                            f"of {saved['frame_shape']}, this run's holds {self._file.slots:,} of "
                            f"{list(self._file.frame_shape)}: resume with the same capacity.")
        self._file.restore(saved['next_id'])


class FrameFile:
    """A ring of raw frames in a memory-mapped file, addressed by frame id."""

    def __init__(self, directory, frame_shape, capacity):
        if not directory:
            raise UserError("FrameStackedReplay.storage='memmap' needs a directory for the "
                            "frame file: train.py puts it under the run directory.")
        os.makedirs(directory, exist_ok=True)
        self.frame_shape = tuple(int(d) for d in frame_shape)
        self.capacity = int(capacity)
        self.slots = 2 * self.capacity  # see the module docstring: resume without copies
        frames_path = os.path.join(directory, FRAMES_FILE)
        ids_path = os.path.join(directory, IDS_FILE)
        self.path = frames_path
        mode = 'r+' if os.path.exists(frames_path) and os.path.exists(ids_path) else 'w+'
        self.created = mode == 'w+'
        expected = self.slots * int(np.prod(self.frame_shape))
        if not self.created and os.path.getsize(frames_path) != expected:
            raise UserError(f"{frames_path} holds {os.path.getsize(frames_path):,} bytes, not "
                            f"the {expected:,} of this buffer: it belongs to a run with another "
                            "capacity or frame size; use that run's settings or a new --root_dir.")
        try:
            self._frames = np.memmap(frames_path, np.uint8, mode,
                                     shape=(self.slots, *self.frame_shape))
            self._ids = np.memmap(ids_path, np.int64, mode, shape=(self.slots,))
        except ValueError as error:
            raise UserError(f"{frames_path} does not fit this buffer ({error}): it belongs to a "
                            "run with another capacity or frame size; delete it or use a new "
                            "--root_dir.") from None
        if mode == 'w+':
            self._ids[:] = -1
        self.next_id = 0

    # The codec interface of buffers/frames.py: what replay stores, encode, decode.
    compresses = False

    def stored_spec(self, frame_spec):
        return tf.TensorSpec([], tf.int64, name=frame_spec.name)

    def encode(self, frames):
        """[N, H, W] uint8 -> [N] frame ids, the frames written to the file."""
        ids = tf.numpy_function(self.write, [frames], tf.int64, stateful=True)
        return tf.ensure_shape(ids, frames.shape[:1])

    def decode(self, ids):
        """[M] frame ids -> [M, H, W] uint8 frames read from the file."""
        frames = tf.numpy_function(self.read, [ids], tf.uint8, stateful=False)
        return tf.reshape(frames, [-1, *self.frame_shape])

    def write(self, frames):
        """Stores [N, H, W] frames; returns their ids [N] (numpy; runs in a py function)."""
        count = len(frames)
        ids = np.arange(self.next_id, self.next_id + count, dtype=np.int64)
        slots = ids % self.slots
        self._frames[slots] = frames
        self._ids[slots] = ids
        self.next_id += count
        return ids

    def read(self, ids):
        """Frames [M, H, W] for ids [M] (numpy)."""
        return np.asarray(self._frames[np.asarray(ids) % self.slots])

    def flush(self):
        self._frames.flush()
        self._ids.flush()

    def restore(self, next_id):
        """Continues from a checkpoint's counter; refuses if needed frames were overwritten."""
        if self.created and next_id > 0:
            raise UserError(f"The replay frame file {self.path} is missing (it was created anew) "
                            f"but the checkpoint's buffer needs its frames: restore the run "
                            "directory's replay_frames/ with its checkpoints, or start anew.")
        newest_needed = next_id - 1
        oldest_needed = max(0, next_id - self.capacity)
        needed = np.arange(oldest_needed, next_id, dtype=np.int64)
        held = self._ids[needed % self.slots]
        lost = int(np.count_nonzero(held != needed))
        if lost and newest_needed >= 0:
            raise UserError(
                f"The replay frame file lost {lost:,} frames the checkpoint's buffer needs "
                f"(the run went on for more than a buffer's worth of steps after its last "
                f"checkpoint): checkpoint more often (run.checkpoint_interval), or start the "
                "run anew in a new --root_dir.")
        self.next_id = next_id

    def checkpoint_item(self):
        return _Counter(self)
