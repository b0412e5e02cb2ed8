"""Exports a policy as a SavedModel that plain TensorFlow can load and run."""

import os
import shutil

from tf_agents.policies import policy_saver


def export_policy(policy, directory, train_step):
    """Saves `policy` to `directory`, replacing any previous export atomically.

    The SavedModel is written next to the target and renamed into place, so an
    interrupted export never leaves a half-written policy behind.
    """
    tmp_dir = directory + '.tmp'
    shutil.rmtree(tmp_dir, ignore_errors=True)
    policy_saver.PolicySaver(policy, batch_size=None, train_step=train_step).save(tmp_dir)
    old_dir = directory + '.old'
    if os.path.exists(directory):
        os.replace(directory, old_dir)
    os.replace(tmp_dir, directory)
    shutil.rmtree(old_dir, ignore_errors=True)
