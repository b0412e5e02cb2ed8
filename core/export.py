"""Exports a policy as a SavedModel that plain TensorFlow can load and run."""

import json
import os
import shutil

from tf_agents.policies import policy_saver


def export_policy(policy, directory, train_step, info=None, info_file=None, nested=None):
    """Saves `policy` to `directory`, replacing any previous export atomically.

    The SavedModel (and `info` as JSON in `info_file`, if given, and the
    policies of `nested`, {subdirectory: policy}, each a SavedModel of its own)
    is written next to the target and renamed into place, so an interrupted
    export never leaves a half-written policy, or a policy with another
    policy's description.
    """
    tmp_dir = directory + '.tmp'
    shutil.rmtree(tmp_dir, ignore_errors=True)
    policy_saver.PolicySaver(policy, batch_size=None, train_step=train_step).save(tmp_dir)
    for name, inner in (nested or {}).items():
        policy_saver.PolicySaver(inner, batch_size=None, train_step=train_step).save(
            os.path.join(tmp_dir, name))
    if info is not None:
        with open(os.path.join(tmp_dir, info_file), 'w') as f:
            json.dump(info, f, indent=1)
    old_dir = directory + '.old'
    if os.path.exists(directory):
        os.replace(directory, old_dir)
    os.replace(tmp_dir, directory)
    shutil.rmtree(old_dir, ignore_errors=True)


SNAPSHOT_FILE = 'snapshot.json'
# A snapshot's collect (exploring) policy, when the run exports it: the policy that
# gathers a D4RL-style dataset ('medium' is the stochastic SAC policy, not its mean).
COLLECT_POLICY_DIR = 'collect'


def export_snapshot(policy, root_dir, step, train_step, eval_return, collect_policy=None):
    """Saves `policy` to root_dir/policies/step_<step> with the eval return it scored.

    With `collect_policy`, it goes to the snapshot's collect/ subdirectory.
    """
    directory = os.path.join(root_dir, 'policies', f'step_{int(step)}')
    info = {'env_step': int(step), 'train_step': int(train_step.numpy()),
            'eval_return': eval_return, 'collect_policy': collect_policy is not None}
    export_policy(policy, directory, train_step, info, SNAPSHOT_FILE,
                  nested={COLLECT_POLICY_DIR: collect_policy} if collect_policy else None)
