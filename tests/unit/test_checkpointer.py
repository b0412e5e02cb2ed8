"""Checkpointer.restore_latest: a sound checkpoint that does not fit this run is one clear line."""

import json

import pytest
import tensorflow as tf

from core.errors import UserError
from experiment.checkpointing import Checkpointer


class _Setting(tf.train.experimental.PythonState):
    """A setting that must match on resume, as FrameStackedReplay's codec does."""

    def __init__(self, value):
        self.value = value

    def serialize(self):
        return json.dumps(self.value)

    def deserialize(self, string_value):
        saved = json.loads(string_value)
        if saved != self.value:
            raise UserError(f"saved with {saved!r}, this run has {self.value!r}: resume with it.")


def test_a_mismatch_the_checkpoint_reports_is_raised_as_is(tmp_path):
    step = tf.Variable(0, dtype=tf.int64)
    Checkpointer(str(tmp_path), step=step, setting=_Setting('lz4')).save(100)
    with pytest.raises(UserError) as raised:
        Checkpointer(str(tmp_path), step=step, setting=_Setting('zlib')).restore_latest()
    # Not "cannot be restored ... delete the checkpoints": the checkpoint is sound.
    assert str(raised.value) == "saved with 'lz4', this run has 'zlib': resume with it."


def test_a_matching_checkpoint_restores(tmp_path):
    step = tf.Variable(7, dtype=tf.int64)
    Checkpointer(str(tmp_path), step=step, setting=_Setting('lz4')).save(7)
    restored = tf.Variable(0, dtype=tf.int64)
    path = Checkpointer(str(tmp_path), step=restored, setting=_Setting('lz4')).restore_latest()
    assert path.endswith('ckpt-7') and int(restored.numpy()) == 7
