"""Minari <-> RLDS: datasets written by Minari's own DataCollector round-trip step for step.

Two tiny Minari datasets: Pendulum-v1 (Box observations and actions, truncations only) and
CartPole with a Dict observation (cart / pole entries) and Discrete actions, where random
play both terminates and truncates. Each goes Minari -> RLDS -> Minari; datasets made by
make_dataset.py go RLDS -> Minari -> RLDS. Everything Minari writes stays under a tmp
MINARI_DATASETS_PATH.
"""

import os
import warnings

import gymnasium as gym
import minari
import numpy as np
import pytest
import tensorflow as tf

from app import cli
from core.errors import UserError
from envs.suite import make_env
from rlds_io import minari_io
from rlds_io.files import Dataset, write_dataset
from tests.smoke.test_train import ROOT


class DictObservation(gym.ObservationWrapper):
    """CartPole's observation as {'cart': [x, x_dot], 'pole': [theta, theta_dot]}."""

    def __init__(self, env):
        super().__init__(env)
        low, high = env.observation_space.low, env.observation_space.high
        self.observation_space = gym.spaces.Dict({
            'cart': gym.spaces.Box(low[:2], high[:2], dtype=np.float32),
            'pole': gym.spaces.Box(low[2:], high[2:], dtype=np.float32)})

    def observation(self, observation):
        return {'cart': observation[:2], 'pole': observation[2:]}


def collect(env, dataset_id, num_episodes, seed=0):
    """Random play recorded by Minari's DataCollector; the dataset it creates."""
    collector = minari.DataCollector(env)
    collector.action_space.seed(seed)
    for episode in range(num_episodes):
        collector.reset(seed=seed + episode)
        done = False
        while not done:
            _, _, terminated, truncated, _ = collector.step(collector.action_space.sample())
            done = terminated or truncated
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # author, email, permalink unset
        dataset = collector.create_dataset(dataset_id, algorithm_name='random')
    collector.close()
    return dataset


ENVS = {
    'pendulum': lambda: gym.make('Pendulum-v1', max_episode_steps=12),
    'dict_cartpole': lambda: DictObservation(gym.make('CartPole-v1', max_episode_steps=14)),
}


@pytest.fixture(autouse=True)
def minari_root(tmp_path, monkeypatch):
    root = tmp_path / 'minari'
    monkeypatch.setenv('MINARI_DATASETS_PATH', str(root))
    return root


def rlds_episodes(path):
    return [tf.nest.map_structure(lambda t: t.numpy(),
                                  e['steps'].batch(10_000).get_single_element())
            for e in Dataset(path).episodes()]


def assert_nests_equal(a, b):
    tf.nest.assert_same_structure(a, b)
    for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


def assert_same_minari_episodes(original, converted):
    """Every episode's steps identical; rewards as our format keeps them (float32)."""
    assert converted.observation_space == original.observation_space
    assert converted.action_space == original.action_space
    assert converted.total_steps == original.total_steps
    assert len(converted) == len(original)
    for a, b in zip(original.iterate_episodes(), converted.iterate_episodes()):
        assert_nests_equal(a.observations, b.observations)
        assert_nests_equal(a.actions, b.actions)
        np.testing.assert_array_equal(b.rewards, a.rewards.astype(np.float32))
        np.testing.assert_array_equal(b.terminations, a.terminations)
        np.testing.assert_array_equal(b.truncations, a.truncations)


@pytest.mark.parametrize('env_name', sorted(ENVS))
def test_minari_to_rlds_to_minari_keeps_every_step(env_name, tmp_path):
    original = collect(ENVS[env_name](), f'test/{env_name}-v0', num_episodes=5)
    rlds_dir = str(tmp_path / 'rlds')
    metadata = minari_io.minari_to_rlds(f'test/{env_name}-v0', rlds_dir, verbose=False)
    assert metadata['num_episodes'] == 5
    assert metadata['num_steps'] == original.total_steps + 5  # one final step per episode

    for episode, steps in zip(original.iterate_episodes(), rlds_episodes(rlds_dir)):
        length = len(episode)
        assert_nests_equal(tf.nest.map_structure(lambda x: x[:length], steps['action']),
                           episode.actions)
        assert_nests_equal(steps['observation'], episode.observations)
        np.testing.assert_array_equal(steps['reward'][:length],
                                      episode.rewards.astype(np.float32))
        assert steps['is_first'].tolist() == [True] + [False] * length
        assert steps['is_last'].tolist() == [False] * length + [True]
        # Gymnasium's terminated is is_terminal (discount 0 on the step before); a
        # truncation is is_last alone.
        assert steps['is_terminal'].tolist() == [False] * length + [bool(episode.terminations[-1])]
        assert steps['discount'][:length].tolist() == (1.0 - episode.terminations).tolist()
        assert (steps['reward'][-1], steps['discount'][-1]) == (0.0, 1.0)
    ends = [bool(e.terminations[-1]) for e in original.iterate_episodes()]
    if env_name == 'dict_cartpole':
        assert True in ends and False in ends  # both kinds of ending went through

    minari_io.rlds_to_minari(rlds_dir, f'test/{env_name}-back-v0', verbose=False)
    assert_same_minari_episodes(original, minari.load_dataset(f'test/{env_name}-back-v0'))


def test_a_converted_pendulum_dataset_fits_the_env_it_trains_on(tmp_path):
    collect(gym.make('Pendulum-v1', max_episode_steps=5), 'test/pendulum-v0', num_episodes=1)
    rlds_dir = str(tmp_path / 'rlds')
    metadata = minari_io.minari_to_rlds('test/pendulum-v0', rlds_dir, verbose=False)
    assert metadata['env_id'] == 'Pendulum-v1'
    env = make_env('Pendulum-v1', num_envs=1)
    Dataset(rlds_dir).check_specs(env.time_step_spec(), env.action_spec())  # no error


@pytest.mark.parametrize('env_id, num_steps', [('Pendulum-v1', 300), ('CartPole-v1', 120)])
def test_rlds_to_minari_to_rlds_keeps_every_step(env_id, num_steps, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    made = str(tmp_path / 'made')
    cli.make_dataset_main(['--gin_file=configs/datasets/pendulum_random.gin',
                           f'--output_dir={made}', f"--gin_bindings=make_env.env_id='{env_id}'",
                           '--gin_bindings=make_env.num_envs=1',
                           f'--gin_bindings=make_dataset.num_steps={num_steps}'])
    result = cli.make_dataset_main(['--to_minari=test/made-v0', f'--dataset_dir={made}'])
    converted = minari.load_dataset('test/made-v0')
    assert result['num_steps'] == converted.total_steps
    back = str(tmp_path / 'back')
    cli.make_dataset_main(['--from_minari=test/made-v0', f'--output_dir={back}'])

    before, after = rlds_episodes(made), rlds_episodes(back)
    assert len(before) == len(after) == result['num_episodes'] >= 2
    for a, b, minari_episode in zip(before, after, converted.iterate_episodes()):
        assert minari_episode.terminations[-1] == a['is_terminal'][-1]
        assert minari_episode.truncations[-1] != a['is_terminal'][-1]
        # The final step's action follows no transition: Minari has no place for it.
        np.testing.assert_array_equal(b['action'][-1], np.zeros_like(a['action'][-1]))
        b['action'][-1] = a['action'][-1]
        assert_nests_equal(a, b)
    if env_id == 'CartPole-v1':
        assert any(a['is_terminal'][-1] for a in before)


def test_errors_are_one_line_user_errors(tmp_path, capsys):
    status = cli.run_cli(lambda: cli.make_dataset_main(
        ['--from_minari=test/missing-v0', f'--output_dir={tmp_path / "out"}']))
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1
    assert lines[0].startswith("error: No Minari dataset 'test/missing-v0'"), lines
    with pytest.raises(UserError, match='No Minari dataset in the directory'):
        minari_io.minari_to_rlds(str(tmp_path), str(tmp_path / 'out'))
    assert not (tmp_path / 'out').exists()
    with pytest.raises(UserError, match='needs --dataset_dir'):
        cli.make_dataset_main(['--to_minari=test/x-v0'])
    with pytest.raises(UserError, match='take no --gin_file'):
        cli.make_dataset_main(['--from_minari=test/x-v0', '--gin_file=configs/dqn_cartpole.gin'])
    with pytest.raises(UserError, match='Malformed Minari dataset id'):
        minari_io.rlds_to_minari(str(tmp_path), 'no version here!', verbose=False)


def test_a_space_that_cannot_convert_is_named():
    tuple_space = gym.spaces.Tuple((gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(3)))
    episode = minari.data_collector.EpisodeBuffer(
        observations=(np.zeros((3, 2), np.float32), np.zeros(3, np.int64)),
        actions=np.zeros((2, 1), np.float32), rewards=[0.0, 0.0],
        terminations=[False, False], truncations=[False, True])
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        minari.create_dataset_from_buffers(
            'test/tuple-v0', [episode], observation_space=tuple_space,
            action_space=gym.spaces.Box(-1, 1, (1,)))
    with pytest.raises(UserError, match="Cannot convert the Tuple space at 'observation'"):
        minari_io.minari_to_rlds('test/tuple-v0', 'unused', verbose=False)


def test_uint8_arrays_are_refused_towards_minari(tmp_path):
    from minari.serialization import serialize_space

    pixels = gym.spaces.Box(0, 255, (4, 4), np.uint8)
    action = gym.spaces.Discrete(2)
    episode = {'observation': np.zeros((2, 4, 4), np.uint8), 'action': np.zeros(2, np.int64),
               'reward': np.zeros(2, np.float32), 'discount': np.ones(2, np.float32),
               'is_first': np.array([True, False]), 'is_last': np.array([False, True]),
               'is_terminal': np.array([False, False])}
    path = str(tmp_path / 'pixels')
    write_dataset(path, [episode], observation_spec=minari_io.space_spec(pixels),
                  action_spec=minari_io.space_spec(action),
                  metadata={'minari': {'observation_space': serialize_space(pixels),
                                       'action_space': serialize_space(action)}})
    with pytest.raises(UserError, match="uint8 Box at 'observation'.*lossy JPEG"):
        minari_io.rlds_to_minari(path, 'test/pixels-v0', verbose=False)


def test_existing_outputs_are_refused_and_a_failed_write_leaves_nothing(
        tmp_path, minari_root, monkeypatch):
    collect(ENVS['pendulum'](), 'test/pendulum-v0', num_episodes=2)
    rlds_dir = tmp_path / 'rlds'
    rlds_dir.mkdir()
    with pytest.raises(UserError, match='already exists'):
        minari_io.minari_to_rlds('test/pendulum-v0', str(rlds_dir), verbose=False)
    assert list(rlds_dir.iterdir()) == []
    rlds_dir.rmdir()
    minari_io.minari_to_rlds('test/pendulum-v0', str(rlds_dir), verbose=False)
    with pytest.raises(UserError, match="Minari dataset 'test/pendulum-v0' already exists"):
        minari_io.rlds_to_minari(str(rlds_dir), 'test/pendulum-v0', verbose=False)

    from minari.dataset._storages.hdf5_storage import HDF5Storage

    def fail_midway(self, episodes):
        raise RuntimeError('disk full')

    monkeypatch.setattr(HDF5Storage, 'update_episodes', fail_midway)
    with pytest.raises(RuntimeError, match='disk full'):
        minari_io.rlds_to_minari(str(rlds_dir), 'test/half-v0', verbose=False)
    assert not os.path.exists(minari_root / 'test' / 'half-v0')
    assert [p.name for p in minari_root.iterdir()] == ['test']  # no scratch left behind
    assert sorted(minari.list_local_datasets()) == ['test/pendulum-v0']
