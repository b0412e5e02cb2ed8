"""Recording what a training run collects, as an RLDS dataset (the 'replay' kind).

An observer in the collect loop feeds every batched step to an
`EpisodeRecorder` (one `numpy_function` call per step: cheap next to an env
step). Completed episodes are written as a numbered shard next to each
training checkpoint, so a killed run loses only what its checkpoint loses;
a resumed run drops shards newer than the checkpoint it restored (those steps
are collected again). At the end the shards become one TFDS dataset.
"""

import glob
import os
import re

import numpy as np
import tensorflow as tf

from rlds_io.episodes import STEP_FIELDS, EpisodeRecorder
from rlds_io.files import write_dataset

_SHARD = re.compile(r'upto_(\d+)\.npz$')


class ExperienceRecorder:
    """An observer recording every collected episode; shards written at checkpoints."""

    def __init__(self, directory, data_spec, num_envs, *, resume_step=0):
        self._directory = directory
        self._spec = data_spec
        self._recorder = EpisodeRecorder(num_envs)
        os.makedirs(directory, exist_ok=True)
        for path, step in _shards(directory):
            if step > resume_step:
                os.remove(path)  # collected after the restored checkpoint: collected again

    def __call__(self, trajectory):
        flat = tf.nest.flatten(trajectory)
        tf.numpy_function(self._add, flat, Tout=[], stateful=True)

    def _add(self, *flat):
        self._recorder.add(tf.nest.pack_sequence_as(self._spec, list(flat)))
        return []

    def save_shard(self, step):
        """Writes the episodes completed since the last shard (atomically)."""
        episodes = self._recorder.pop_complete()
        if not episodes:
            return
        arrays = {'lengths': np.array([len(e['reward']) for e in episodes], np.int64)}
        for field in STEP_FIELDS:
            leaves = [tf.nest.flatten(e[field]) for e in episodes]
            for i in range(len(leaves[0])):
                arrays[f'{field}/{i}'] = np.concatenate([leaf[i] for leaf in leaves])
        tmp_path = os.path.join(self._directory, f'.tmp-upto_{int(step)}.npz')
        with open(tmp_path, 'wb') as f:
            np.savez(f, **arrays)
        os.replace(tmp_path, os.path.join(self._directory, f'upto_{int(step)}.npz'))

    def write_dataset(self, path, *, observation_spec, action_spec, metadata):
        """Turns every shard into one TFDS dataset at `path`; returns its metadata."""
        episodes = []
        for shard, _ in _shards(self._directory):
            episodes.extend(self._read_shard(shard, observation_spec, action_spec))
        return write_dataset(path, episodes, observation_spec=observation_spec,
                             action_spec=action_spec, metadata=metadata)

    @staticmethod
    def _read_shard(path, observation_spec, action_spec):
        with np.load(path) as data:
            arrays = {key: data[key] for key in data.files}
        bounds = np.cumsum(arrays['lengths'])[:-1]
        nests = {'observation': observation_spec, 'action': action_spec}
        per_field = {}
        for field in STEP_FIELDS:
            spec = nests.get(field)
            count = len(tf.nest.flatten(spec)) if spec is not None else 1
            leaves = [np.split(arrays[f'{field}/{i}'], bounds) for i in range(count)]
            per_field[field] = [
                tf.nest.pack_sequence_as(spec, list(parts)) if spec is not None else parts[0]
                for parts in zip(*leaves)]
        return [{field: per_field[field][k] for field in STEP_FIELDS}
                for k in range(len(arrays['lengths']))]


def _shards(directory):
    """(path, step) of every shard, oldest first."""
    found = []
    for path in glob.glob(os.path.join(directory, 'upto_*.npz')):
        match = _SHARD.search(path)
        if match:
            found.append((path, int(match.group(1))))
    return sorted(found, key=lambda item: item[1])
