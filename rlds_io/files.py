"""RLDS datasets on disk in TFDS format: written atomically, read with a spec check.

A dataset directory is a plain TFDS dataset (`dataset_info.json`, `features.json`,
TFRecord shards), so `tfds.builder_from_directory(path).as_dataset(split='train')`
reads it without any of our code, and RLDS tools see the usual `steps` field.
Next to it, `collection.json` records how it was made (env id, behaviour
policy, returns, counts) for humans and for the count check on import.
"""

import json
import os
import shutil

import numpy as np
import tensorflow as tf
from tf_agents.specs import tensor_spec

from core import rundir
from core.errors import UserError
from rlds_io.episodes import episode_return, episode_transitions

_NAME = 'rlds_experience'
_VERSION = '1.0.0'
METADATA_FILE = 'collection.json'


def _feature(spec):
    import tensorflow_datasets as tfds

    spec = tensor_spec.from_spec(spec)
    return tfds.features.Tensor(shape=tuple(spec.shape.as_list()),
                                dtype=spec.dtype.as_numpy_dtype)


def _features(observation_spec, action_spec):
    import tensorflow_datasets as tfds

    def nested(spec):
        if isinstance(spec, dict):
            return tfds.features.FeaturesDict({k: nested(v) for k, v in spec.items()})
        return _feature(spec)

    return tfds.features.FeaturesDict({
        'steps': tfds.features.Dataset({
            'observation': nested(observation_spec),
            'action': nested(action_spec),
            'reward': tfds.features.Scalar(dtype=np.float32),
            'discount': tfds.features.Scalar(dtype=np.float32),
            'is_first': tfds.features.Scalar(dtype=np.bool_),
            'is_last': tfds.features.Scalar(dtype=np.bool_),
            'is_terminal': tfds.features.Scalar(dtype=np.bool_),
        }),
    })


def write_dataset(path, episodes, *, observation_spec, action_spec, metadata):
    """Writes `episodes` (RLDS step dicts of numpy arrays) as a TFDS dataset at `path`.

    Everything is built in a scratch directory next to `path` and renamed into
    place, so an interrupted export never leaves a half-written dataset.

    Returns:
      The metadata written to collection.json (with counts and returns added).
    """
    import tensorflow_datasets as tfds

    if not episodes:
        raise UserError("No complete episode was collected: raise num_steps (a dataset holds "
                        "whole episodes only).")
    if os.path.exists(path):
        raise UserError(f"Dataset directory {path} already exists: pick another output path or "
                        "delete it first.")
    returns = [episode_return(e) for e in episodes]
    metadata = dict(metadata,
                    num_episodes=len(episodes),
                    num_steps=int(sum(episode_transitions(e) for e in episodes)),
                    num_terminal_episodes=int(sum(bool(e['is_terminal'][-1]) for e in episodes)),
                    average_return=float(np.mean(returns)),
                    std_return=float(np.std(returns)),
                    observation_spec=str(observation_spec),
                    action_spec=str(action_spec))
    tfds.disable_progress_bar()
    scratch = f'{path}.tmp-{os.getpid()}'
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        tfds.dataset_builders.store_as_tfds_dataset(
            name=_NAME, version=_VERSION, data_dir=scratch,
            features=_features(observation_spec, action_spec),
            split_datasets={'train': ((i, {'steps': e}) for i, e in enumerate(episodes))},
            description=json.dumps(metadata), disable_shuffling=True)
        built = os.path.join(scratch, _NAME, _VERSION)
        rundir.atomic_write_text(os.path.join(built, METADATA_FILE),
                                 json.dumps(metadata, indent=2) + '\n')
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        os.replace(built, path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return metadata


class Dataset:
    """An RLDS dataset on disk: its episodes (a tf.data.Dataset) and its metadata."""

    def __init__(self, path):
        import tensorflow_datasets as tfds

        if not os.path.isfile(os.path.join(path, 'dataset_info.json')):
            hint = ("make one with make_dataset.py (see docs/offline_rl.md)"
                    if not os.path.exists(path) else
                    "it holds no dataset_info.json, so it is not a TFDS dataset directory")
            raise UserError(f"No RLDS dataset at {path}: {hint}.")
        self.path = path
        self._builder = tfds.builder_from_directory(path)
        metadata_path = os.path.join(path, METADATA_FILE)
        self.metadata = {}
        if os.path.isfile(metadata_path):
            with open(metadata_path) as f:
                self.metadata = json.load(f)

    @property
    def num_episodes(self):
        return int(self._builder.info.splits['train'].num_examples)

    @property
    def step_spec(self):
        return self.episodes().element_spec['steps'].element_spec

    def episodes(self):
        """Episodes in stored order, each with a nested `steps` dataset."""
        return self._builder.as_dataset(split='train', shuffle_files=False)

    def count_steps(self):
        """Counts the stored steps by reading them (what an import must match)."""
        # Whole episodes at once: a per-step reduce costs ~60 us a step (a minute per 1M).
        lengths = self.episodes().map(lambda e: tf.shape(
            e['steps'].batch(2**31 - 1).get_single_element()['is_last'], out_type=tf.int64)[0])
        return int(lengths.reduce(tf.constant(0, tf.int64), lambda a, b: a + b).numpy())

    def check_specs(self, time_step_spec, action_spec):
        """Refuses a dataset whose observation or action spec differs from the env's."""
        step_spec = self.step_spec
        for name, expected in (('observation', time_step_spec.observation),
                               ('action', action_spec)):
            stored = step_spec[name]
            expected = tensor_spec.from_spec(expected)
            if not _same_shapes_and_dtypes(stored, expected):
                raise UserError(
                    f"Dataset {self.path} does not fit this environment: its {name} spec is "
                    f"{_describe(stored)} but the environment's is {_describe(expected)}; "
                    "use a dataset made on the same env id (and make_env settings).")


def _same_shapes_and_dtypes(a, b):
    try:
        tf.nest.assert_same_structure(a, b)
    except (ValueError, TypeError):
        return False
    return all(x.shape == y.shape and x.dtype == y.dtype
               for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)))


def _describe(spec):
    return str(tf.nest.map_structure(
        lambda s: f'{s.dtype.name}{s.shape.as_list()}', spec))
