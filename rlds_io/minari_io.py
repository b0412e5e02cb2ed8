"""Minari datasets in and out: our RLDS episodes <-> Minari episodes, step for step.

Minari (Farama's successor to D4RL) is where Gymnasium's offline datasets live. Converting
a Minari dataset into our RLDS format lets CQL-SAC train on it with nothing else changed
(`train_offline.dataset_dir`), and converting back lets Minari's tools read our datasets.

The two formats hold an episode of T transitions differently:

- Minari: T+1 observations, and T actions, rewards, terminations and truncations.
- RLDS (rlds_io/episodes.py): T+1 steps; step t holds o_t, a_t and the reward and discount
  that followed; the last step (`is_last`) holds o_T, and `is_terminal` on it says the
  episode ended in a terminal state (Gymnasium's `terminated`), not by truncation.

So `terminated` is `is_terminal` (and discount 0 on the step before it), a truncation is
`is_last` without `is_terminal`, and an episode that Minari ends with neither flag counts as
truncated (as Minari's DataCollector marks it on reset). The last RLDS step's action, reward
and discount follow no transition, so Minari has no place for them: coming from Minari they
are zeros, 0 and 1 (the reward and discount of a time step that starts an episode).

Kept exactly: observations, actions, rewards, terminations and truncations, for Box and
Discrete spaces and Dict nests of them, plus the spaces and env spec (in collection.json,
for the way back). Changed once: float64 Boxes and rewards become float32 (what our envs
hand TF-Agents; after that the round trip is exact). Not kept: Minari's infos and
per-episode seeds and metadata, RLDS discounts other than 1 and 0-at-termination (refused).
Refused: other spaces (Tuple, Text, MultiDiscrete, ...), and uint8 arrays toward Minari,
whose HDF5 storage would store them as lossy JPEG images.

`minari` is imported inside the functions that need it, so the rest of rlds_io loads
without it.
"""

import contextlib
import json
import os
import shutil
import warnings

import gymnasium as gym
import numpy as np
import tensorflow as tf
from tf_agents.specs import array_spec, tensor_spec

from core.errors import UserError
from rlds_io.files import Dataset, _describe, _same_shapes_and_dtypes, write_dataset

MINARI_METADATA_KEY = 'minari'  # collection.json: the spaces and env spec, for the way back
_FLOAT32 = np.finfo(np.float32)
_SUPPORTED = 'Box, Discrete and Dict nests of them'


# --- spaces ---------------------------------------------------------------------------------

def narrowed_space(space, where):
    """`space` as our RLDS datasets hold it: float64 Boxes become float32, bounds clamped.

    Our envs hand TF-Agents float32 observations (envs/gymnasium_env.py), so a dataset
    must too, or it would not fit the env it trains on.

    Raises:
      UserError: for a space we cannot convert, naming it and where it is.
    """
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict({key: narrowed_space(sub, f'{where}/{key}')
                                for key, sub in space.spaces.items()})
    if isinstance(space, gym.spaces.Discrete):
        return space
    if isinstance(space, gym.spaces.Box):
        if np.dtype(space.dtype) != np.float64:
            return space
        return gym.spaces.Box(np.clip(space.low, _FLOAT32.min, _FLOAT32.max),
                              np.clip(space.high, _FLOAT32.min, _FLOAT32.max),
                              space.shape, np.float32)
    raise UserError(f"Cannot convert the {type(space).__name__} space at '{where}': only "
                    f"{_SUPPORTED} convert (got {space}).")


def space_spec(space):
    """The array spec (shape, dtype) of a narrowed space, as write_dataset takes it."""
    if isinstance(space, gym.spaces.Dict):
        return {key: space_spec(sub) for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Discrete):
        return array_spec.ArraySpec((), np.int64)  # as envs/gymnasium_env.py maps Discrete
    return array_spec.ArraySpec(space.shape, space.dtype)


def _refuse_jpeg_leaves(space, where):
    """Minari's HDF5 storage JPEG-encodes any uint8 array of rank 1-3 per step: lossy."""
    if isinstance(space, gym.spaces.Dict):
        for key, sub in space.spaces.items():
            _refuse_jpeg_leaves(sub, f'{where}/{key}')
    elif isinstance(space, gym.spaces.Box) and np.dtype(space.dtype) == np.uint8:
        raise UserError(f"Cannot convert the uint8 Box at '{where}' to Minari: its HDF5 "
                        "storage would keep uint8 arrays as lossy JPEG images.")


def _cast(spec, value):
    return tf.nest.map_structure(lambda s, x: np.asarray(x, s.dtype), spec, value)


# --- Minari -> RLDS -------------------------------------------------------------------------

def open_minari(source):
    """A `MinariDataset` from a local dataset id or a dataset directory (never downloads).

    Raises:
      UserError: when `source` is neither, in one line.
    """
    import minari

    data_path = _minari_data_path(source)
    try:
        if data_path is not None:
            return minari.MinariDataset(data_path)
        return minari.load_dataset(source)
    except (FileNotFoundError, ValueError) as error:
        root = os.environ.get('MINARI_DATASETS_PATH', '~/.minari/datasets')
        detail = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UserError(f"No Minari dataset '{source}': not a dataset directory, nor a "
                        f"dataset id under {root} (MINARI_DATASETS_PATH); "
                        f"`minari download {source}` fetches a remote one ({detail})") from None


def _minari_data_path(source):
    """The `data/` directory (metadata.json inside) if `source` is a path, else None."""
    if not os.path.isdir(source):
        return None
    for candidate in (os.path.join(source, 'data'), source):
        if os.path.isfile(os.path.join(candidate, 'metadata.json')):
            return candidate
    raise UserError(f"No Minari dataset in the directory {source}: it holds no "
                    "metadata.json (nor data/metadata.json).")


def minari_episode_to_rlds(episode, observation_spec, action_spec, where):
    """RLDS steps (dict of numpy arrays, T+1 long) of one Minari episode (T transitions)."""
    length = len(episode.rewards)
    terminations = np.asarray(episode.terminations, bool)
    truncations = np.asarray(episode.truncations, bool)
    ends = np.flatnonzero(terminations | truncations)
    if ends.size and ends[0] != length - 1:
        raise UserError(f"{where}, episode {episode.id}: it ends at step {ends[0]} of "
                        f"{length}; RLDS episodes end only on their last step.")
    terminal = bool(length and terminations[-1])
    last = np.arange(length + 1) == length
    discount = np.ones(length + 1, np.float32)
    discount[:length][terminations] = 0.0
    final_action = tf.nest.map_structure(lambda s: np.zeros((1,) + s.shape, s.dtype),
                                         action_spec)
    actions = _cast(action_spec, episode.actions)
    return {
        'observation': _cast(observation_spec, episode.observations),
        'action': tf.nest.map_structure(lambda a, z: np.concatenate([a, z]), actions,
                                        final_action),
        'reward': np.append(np.asarray(episode.rewards, np.float32), np.float32(0.0)),
        'discount': discount,
        'is_first': np.arange(length + 1) == 0,
        'is_last': last,
        'is_terminal': last & terminal,
    }


def minari_to_rlds(source, output_dir, *, verbose=True):
    """Writes the Minari dataset `source` (id or directory) as an RLDS dataset at `output_dir`.

    `output_dir` must not exist; it appears whole or not at all (write_dataset).

    Returns:
      The metadata written to collection.json.
    """
    from minari.serialization import serialize_space

    if os.path.exists(output_dir):
        raise UserError(f"Dataset directory {output_dir} already exists: pick another "
                        "--output_dir or delete it first.")
    minari_dataset = open_minari(source)
    where = f"Minari dataset '{source}'"
    observation_space = narrowed_space(minari_dataset.observation_space, 'observation')
    action_space = narrowed_space(minari_dataset.action_space, 'action')
    observation_spec, action_spec = space_spec(observation_space), space_spec(action_space)
    episodes = [minari_episode_to_rlds(e, observation_spec, action_spec, where)
                for e in minari_dataset.iterate_episodes()]
    env_spec = minari_dataset.env_spec
    metadata = write_dataset(
        output_dir, episodes, observation_spec=observation_spec, action_spec=action_spec,
        metadata={
            'kind': 'minari', 'source': source, 'minari_dataset_id': minari_dataset.id,
            # Only an unwrapped registered env is one that make_env.env_id can name.
            'env_id': (env_spec.id if env_spec is not None and not env_spec.additional_wrappers
                       else None),
            MINARI_METADATA_KEY: {
                'observation_space': serialize_space(observation_space),
                'action_space': serialize_space(action_space),
                'env_spec': env_spec.to_json() if env_spec is not None else None}})
    if verbose:
        print(f"Wrote {output_dir}: {metadata['num_steps']:,} steps in "
              f"{metadata['num_episodes']:,} episodes from Minari dataset {minari_dataset.id}, "
              f"average return {metadata['average_return']:.1f}.", flush=True)
    return metadata


# --- RLDS -> Minari -------------------------------------------------------------------------

def rlds_episode_to_minari(steps, where):
    """A Minari `EpisodeBuffer` from one RLDS episode's steps (dict of numpy arrays)."""
    from minari.data_collector import EpisodeBuffer

    length = len(steps['reward']) - 1
    if length < 1:
        raise UserError(f"{where}: an episode of one step holds no transition, and a Minari "
                        "episode needs at least one.")
    terminal = bool(steps['is_terminal'][-1])
    expected = np.ones(length, np.float32)
    expected[-1] = 0.0 if terminal else 1.0
    if not np.array_equal(steps['discount'][:length], expected):
        raise UserError(f"{where}: its discounts are not 1 (0 only where the episode "
                        "terminates); Minari keeps no discounts, so converting would change "
                        "them.")
    terminations = np.zeros(length, bool)
    truncations = np.zeros(length, bool)
    (terminations if terminal else truncations)[-1] = True
    return EpisodeBuffer(
        observations=steps['observation'],
        actions=tf.nest.map_structure(lambda a: a[:length], steps['action']),
        rewards=np.asarray(steps['reward'][:length], np.float32),
        terminations=terminations, truncations=truncations)


def _numpy_episodes(dataset):
    for episode in dataset.episodes():
        steps = episode['steps'].batch(2**31 - 1).get_single_element()
        yield tf.nest.map_structure(lambda t: t.numpy(), steps)


def _dataset_spaces(dataset, env_id):
    """(observation space, action space, env spec JSON or None) for an RLDS dataset.

    A dataset converted from Minari carries its spaces in collection.json; one made here
    names its env id, whose spaces (narrowed as our envs narrow them) are used. Either
    way they must match the stored steps.
    """
    from minari.serialization import deserialize_space

    saved = dataset.metadata.get(MINARI_METADATA_KEY)
    if saved:
        spaces = (deserialize_space(saved['observation_space']),
                  deserialize_space(saved['action_space']))
        env_spec = saved.get('env_spec')
    else:
        env_id = env_id or dataset.metadata.get('env_id')
        if not env_id:
            raise UserError(f"Dataset {dataset.path} does not say which env made it (no "
                            "env_id in its collection.json): pass --env_id.")
        try:
            env = gym.make(env_id)
        except gym.error.Error as error:
            raise UserError(f"Cannot make env '{env_id}' for the spaces of {dataset.path}: "
                            f"{str(error).splitlines()[0]}") from None
        spaces = (narrowed_space(env.observation_space, 'observation'),
                  narrowed_space(env.action_space, 'action'))
        env_spec = env.spec.to_json() if env.spec is not None else None
        env.close()
    for name, space in zip(('observation', 'action'), spaces):
        stored, expected = dataset.step_spec[name], tensor_spec.from_spec(space_spec(space))
        if not _same_shapes_and_dtypes(stored, expected):
            raise UserError(f"Dataset {dataset.path} does not fit its env's {name} space: it "
                            f"stores {_describe(stored)}, the space is {_describe(expected)}.")
        _refuse_jpeg_leaves(space, name)
    return spaces[0], spaces[1], env_spec


@contextlib.contextmanager
def _minari_root(path):
    """Points Minari (MINARI_DATASETS_PATH) at `path` for the duration; not thread-safe."""
    previous = os.environ.get('MINARI_DATASETS_PATH')
    os.environ['MINARI_DATASETS_PATH'] = path
    try:
        yield
    finally:
        if previous is None:
            del os.environ['MINARI_DATASETS_PATH']
        else:
            os.environ['MINARI_DATASETS_PATH'] = previous


def rlds_to_minari(dataset_dir, dataset_id, *, env_id=None, verbose=True):
    """Writes the RLDS dataset at `dataset_dir` as the Minari dataset `dataset_id`.

    It goes where `minari.load_dataset(dataset_id)` looks (MINARI_DATASETS_PATH, default
    ~/.minari/datasets). Minari writes into its final directory as it goes, so here it
    writes under a hidden scratch root next to it, renamed into place when complete: an
    existing dataset is never overwritten, and an interrupted run leaves none half-written.

    Returns:
      {'dataset_id', 'path', 'num_episodes', 'num_steps'} (steps = Minari's transitions).
    """
    import minari
    from minari.dataset.minari_dataset import parse_dataset_id
    from minari.storage.datasets_root_dir import get_dataset_path

    try:
        namespace = parse_dataset_id(dataset_id)[0]
    except ValueError:
        raise UserError(f"Malformed Minari dataset id '{dataset_id}': use "
                        "(namespace/)name-v<version>, e.g. rlds/pendulum-random-v0.") from None
    target = str(get_dataset_path(dataset_id))
    if os.path.exists(target):
        raise UserError(f"A Minari dataset '{dataset_id}' already exists at {target}: pick "
                        "another id (or version), or delete it first (minari delete).")
    dataset = Dataset(dataset_dir)
    observation_space, action_space, env_spec = _dataset_spaces(dataset, env_id)
    where = f"Dataset {dataset_dir}"
    buffers = [rlds_episode_to_minari(steps, where) for steps in _numpy_episodes(dataset)]
    root = str(get_dataset_path())
    scratch = os.path.join(root, f'.tmp-rlds-{os.getpid()}')
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        with _minari_root(scratch), warnings.catch_warnings():
            warnings.simplefilter('ignore')  # author, email, code permalink: not ours to know
            written = minari.create_dataset_from_buffers(
                dataset_id, buffers, observation_space=observation_space,
                action_space=action_space, algorithm_name=dataset.metadata.get('kind'),
                description=f"Converted from the RLDS dataset {dataset_dir}: "
                            f"{json.dumps(dataset.metadata.get('source'))}.")
            if env_spec is not None:
                # Recorded without making the env (its wrappers may not import here).
                written.storage.update_metadata({'env_spec': env_spec})
        _move_into_place(scratch, root, dataset_id, namespace)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result = {'dataset_id': dataset_id, 'path': target, 'num_episodes': len(buffers),
              'num_steps': int(sum(len(b) for b in buffers))}
    if verbose:
        print(f"Wrote Minari dataset {dataset_id} at {target}: {result['num_steps']:,} steps "
              f"in {result['num_episodes']:,} episodes.", flush=True)
    return result


def _move_into_place(scratch, root, dataset_id, namespace):
    """Renames the finished dataset into `root`, with any namespace files it lacks."""
    from minari.namespace import NAMESPACE_METADATA_FILENAME

    target = os.path.join(root, dataset_id)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.replace(os.path.join(scratch, dataset_id), target)
    parts = namespace.split('/') if namespace else []
    for depth in range(1, len(parts) + 1):
        relative = os.path.join(*parts[:depth], NAMESPACE_METADATA_FILENAME)
        if (os.path.isfile(os.path.join(scratch, relative))
                and not os.path.exists(os.path.join(root, relative))):
            shutil.copyfile(os.path.join(scratch, relative), os.path.join(root, relative))
