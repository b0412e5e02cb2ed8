"""RLDS datasets: episodes from batched streams, TFDS round trip, Reverb and backend imports."""

import os

import numpy as np
import pytest
import reverb
import tensorflow as tf
import tensorflow_datasets as tfds
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory as trajectory_lib

from buffers.base import Capabilities
from buffers.episodic import EpisodicReplay
from buffers.prioritized import PrioritizedReplay
from buffers.reverb_replay import ReverbUniformReplay
from buffers.uniform import UniformReplay
from core.errors import UserError
from envs.suite import make_env
from rlds_io import importing
from rlds_io.behaviour import BehaviourPolicy
from rlds_io.episodes import EpisodeRecorder
from rlds_io.files import Dataset, write_dataset
from rlds_io.recording import ExperienceRecorder

F, M, L = ts.StepType.FIRST, ts.StepType.MID, ts.StepType.LAST


def _row(step_type, next_step_type, obs, discount, reward=1.0):
    return trajectory_lib.Trajectory(
        step_type=np.array([step_type], np.int32), observation=np.array([[obs]], np.float32),
        action=np.array([[obs]], np.float32), policy_info=(),
        next_step_type=np.array([next_step_type], np.int32),
        reward=np.array([reward], np.float32), discount=np.array([discount], np.float32))


def test_recorder_cuts_whole_episodes_and_marks_termination():
    recorder = EpisodeRecorder(num_envs=1)
    stream = [_row(M, L, 9, 0.0),                                  # no beginning: dropped
              _row(L, F, 10, 1.0, 0.0),
              _row(F, M, 0, 1.0), _row(M, L, 1, 0.0), _row(L, F, 2, 1.0, 0.0),  # terminated
              _row(F, M, 3, 1.0), _row(M, L, 4, 1.0), _row(L, F, 5, 1.0, 0.0),  # truncated
              _row(F, M, 6, 1.0)]                                  # in flight: not yet out
    for row in stream:
        recorder.add(row)
    terminated, truncated = recorder.pop_complete()
    assert terminated['observation'][:, 0].tolist() == [0, 1, 2]
    assert terminated['is_first'].tolist() == [True, False, False]
    assert terminated['is_last'].tolist() == [False, False, True]
    assert terminated['is_terminal'].tolist() == [False, False, True]
    assert terminated['discount'].tolist() == [1.0, 0.0, 1.0]
    assert truncated['is_terminal'].tolist() == [False, False, False]
    assert recorder.pop_complete() == []


def _collect_cartpole(num_steps, seed=0):
    """Random CartPole (it terminates) through 2 batched copies: (rows, episodes)."""
    env = make_env('CartPole-v1', num_envs=2, seed=seed)
    policy = BehaviourPolicy(env.action_spec(), seed=seed)
    recorder, rows, episodes = EpisodeRecorder(2), [], []
    time_step = env.reset()
    for _ in range(num_steps):
        action = policy(time_step)
        next_time_step = env.step(action)
        row = trajectory_lib.Trajectory(
            time_step.step_type, time_step.observation, action, (), next_time_step.step_type,
            np.asarray(next_time_step.reward, np.float32),
            np.asarray(next_time_step.discount, np.float32))
        recorder.add(row)
        rows.append(row)
        episodes.extend(recorder.pop_complete())
        time_step = next_time_step
    return env, rows, episodes


@pytest.fixture(scope='module')
def cartpole_dataset(tmp_path_factory):
    env, rows, episodes = _collect_cartpole(400)
    path = str(tmp_path_factory.mktemp('rlds') / 'cartpole_random')
    metadata = write_dataset(path, episodes, observation_spec=env.observation_spec(),
                             action_spec=env.action_spec(), metadata={'kind': 'random'})
    return path, episodes, metadata, env


def test_plain_tfds_reads_the_dataset_without_our_code(cartpole_dataset):
    path, episodes, metadata, _ = cartpole_dataset
    read = list(tfds.builder_from_directory(path).as_dataset(split='train'))
    assert len(read) == len(episodes) == metadata['num_episodes']
    for stored, original in zip(read, episodes):
        steps = list(stored['steps'].as_numpy_iterator())
        np.testing.assert_array_equal([s['observation'] for s in steps], original['observation'])
        assert [bool(s['is_terminal']) for s in steps] == original['is_terminal'].tolist()
    assert metadata['num_terminal_episodes'] == len(episodes)  # random CartPole always falls


def test_export_then_import_gives_back_the_collected_trajectories(cartpole_dataset):
    path, episodes, _, _ = cartpole_dataset
    imported = list(importing.trajectories(Dataset(path)).as_numpy_iterator())
    # The collected stream of copy 0 and 1, flattened in episode order, is what was exported.
    assert len(imported) == sum(len(e['reward']) for e in episodes)
    flat = {field: np.concatenate([e[field] for e in episodes])
            for field in ('observation', 'action', 'reward', 'discount')}
    got = {field: np.stack([getattr(t, field) for t in imported])
           for field in ('observation', 'action', 'reward', 'discount')}
    is_boundary = np.concatenate([e['is_last'] for e in episodes])
    for field in ('observation', 'action', 'reward'):
        np.testing.assert_array_equal(got[field], flat[field])
    # Transitions keep their discounts (0 on termination); only the boundary rows' discount
    # (never trained on) is set to 0 by TF-Agents' importer for terminal episodes.
    np.testing.assert_array_equal(got['discount'][~is_boundary], flat['discount'][~is_boundary])
    step_types = np.array([t.step_type for t in imported])
    assert (step_types[is_boundary] == L).all() and (step_types[~is_boundary] != L).all()


def test_reverb_import_holds_every_transition(cartpole_dataset):
    path, episodes, _, _ = cartpole_dataset
    dataset = Dataset(path)
    steps, transitions = importing.count_transitions(dataset)
    assert transitions == steps - len(episodes) > 100  # not TF-Agents' example's 100
    server = reverb.Server([importing.make_transition_table('offline', dataset)])
    try:
        client = reverb.Client(f'localhost:{server.port}')
        pushed, items = importing.push_to_reverb(dataset, client, 'offline')
        assert (pushed, items) == (steps, transitions)
    finally:
        server.stop()


def _trajectory_spec(env):
    from tf_agents.specs import tensor_spec
    return trajectory_lib.Trajectory(
        ts.time_step_spec(tensor_spec.from_spec(env.observation_spec())).step_type,
        tensor_spec.from_spec(env.observation_spec()), tensor_spec.from_spec(env.action_spec()),
        (), tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.float32),
        tf.TensorSpec([], tf.float32))


@pytest.mark.parametrize('backend_cls', [UniformReplay, PrioritizedReplay, EpisodicReplay,
                                         ReverbUniformReplay])
def test_every_backend_takes_the_whole_dataset(cartpole_dataset, backend_cls):
    path, _, metadata, env = cartpole_dataset
    dataset = Dataset(path)
    backend = backend_cls(_trajectory_spec(env), capacity=metadata['num_steps'], num_envs=1,
                          batch_size=8, num_steps=2, seed=0)
    try:
        assert importing.load_into_backend(dataset, backend) == metadata['num_steps']
        windows, _ = backend.sample(8, 2)
        assert windows.observation.shape == (8, 2, 4)
    finally:
        backend.close()


@pytest.mark.parametrize('capacity, chunk', [(None, 4096), (100, 64)])
def test_loading_in_chunks_stores_what_loading_step_by_step_does(cartpole_dataset, monkeypatch,
                                                                  capacity, chunk):
    """UniformReplay.add_steps (dataset loading) against one add per step, also past a wrap."""
    class OneByOne(UniformReplay):
        capabilities = Capabilities(xla=True)  # no bulk_steps: one `add` per step

    path, _, metadata, env = cartpole_dataset
    monkeypatch.setattr(importing, 'LOAD_CHUNK', chunk)
    backends = [cls(_trajectory_spec(env), capacity=capacity or metadata['num_steps'],
                    num_envs=1, batch_size=8, num_steps=2, seed=0)
                for cls in (UniformReplay, OneByOne)]
    added = [importing._add_all(importing.trajectories(Dataset(path)), b) for b in backends]
    assert added[0] == added[1] == metadata['num_steps']
    chunked, one_by_one = backends
    assert chunked.capabilities.bulk_steps and int(chunked._num_adds) == metadata['num_steps']
    for a, b in zip(tf.nest.flatten(chunked._storage), tf.nest.flatten(one_by_one._storage)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_backend_import_checks_the_count(cartpole_dataset):
    path, _, _, env = cartpole_dataset
    small = UniformReplay(_trajectory_spec(env), capacity=100, num_envs=1, batch_size=8,
                          num_steps=2, seed=0)
    with pytest.raises(UserError, match='raise the replay capacity'):
        importing.load_into_backend(Dataset(path), small)


def test_mismatched_specs_and_missing_paths_are_one_line_errors(cartpole_dataset, tmp_path):
    path, _, _, _ = cartpole_dataset
    pendulum = make_env('Pendulum-v1')
    from tf_agents.environments import tf_py_environment
    tf_env = tf_py_environment.TFPyEnvironment(pendulum)
    with pytest.raises(UserError, match=r'observation spec is float32\[4\] but the '
                                        r"environment's is float32\[3\]"):
        Dataset(path).check_specs(tf_env.time_step_spec(), tf_env.action_spec())
    with pytest.raises(UserError, match='No RLDS dataset at .*make_dataset.py'):
        Dataset(str(tmp_path / 'nowhere'))
    with pytest.raises(UserError, match='already exists'):
        write_dataset(path, [{}], observation_spec=None, action_spec=None, metadata={})


def test_recorded_shards_survive_a_resume_and_become_one_dataset(tmp_path):
    env, rows, episodes = _collect_cartpole(200, seed=1)
    spec = tf.nest.map_structure(lambda x: tf.TensorSpec(np.asarray(x).shape[1:],
                                                         np.asarray(x).dtype), rows[0])
    recorder = ExperienceRecorder(str(tmp_path / 'rec'), spec, num_envs=2)
    for i, row in enumerate(rows):
        recorder._add(*tf.nest.flatten(row))
        if i in (60, 120):
            recorder.save_shard(i)
    recorder.save_shard(200)
    # A resume from the checkpoint at step 120 drops the shard written after it.
    resumed = ExperienceRecorder(str(tmp_path / 'rec'), spec, num_envs=2, resume_step=120)
    kept = sorted(os.listdir(tmp_path / 'rec'))
    assert kept == ['upto_120.npz', 'upto_60.npz']
    out = str(tmp_path / 'dataset')
    metadata = resumed.write_dataset(out, observation_spec=env.observation_spec(),
                                     action_spec=env.action_spec(), metadata={'kind': 'replay'})
    done_by_120 = [e for e in episodes][:metadata['num_episodes']]
    read = list(Dataset(out).episodes())
    assert len(read) == len(done_by_120) > 0
    for stored, original in zip(read, done_by_120):
        np.testing.assert_array_equal(stored['steps'].batch(1000).get_single_element()
                                      ['observation'].numpy(), original['observation'])
