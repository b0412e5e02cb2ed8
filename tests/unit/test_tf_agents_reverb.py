"""buffers/tf_agents_reverb.py and tf_agents_reverb_observer.py beyond TF-Agents' own suites:
the packed table, RLDS pushed into it with TF-Agents' `push_rlds_to_reverb`, and items
identical to TF-Agents' observer's."""

import numpy as np
import pytest
import reverb
import tensorflow as tf
from rlds import rlds_types
from tf_agents.replay_buffers import reverb_replay_buffer, reverb_utils, rlds_to_reverb
from tf_agents.specs import tensor_spec

from buffers import tf_agents_reverb
from buffers.tf_agents_reverb import ReverbReplayBuffer
from buffers.tf_agents_reverb_observer import ReverbAddTrajectoryObserver

pytestmark = pytest.mark.reverb

EPISODE_LENGTHS = (5, 1, 4, 2, 6)


def _episodes():
    """A small RLDS dataset: every step's observation is (its index in the stream, episode)."""
    episodes, index = [], 0
    for episode, length in enumerate(EPISODE_LENGTHS):
        steps = np.arange(index, index + length, dtype=np.float32)
        index += length
        last = np.arange(length) == length - 1
        episodes.append(tf.data.Dataset.from_tensor_slices({
            rlds_types.OBSERVATION: np.stack([steps, np.full(length, episode, np.float32)], 1),
            rlds_types.ACTION: (10 * steps)[:, None],
            rlds_types.REWARD: steps / 2,
            rlds_types.DISCOUNT: np.ones(length, np.float32),
            rlds_types.IS_TERMINAL: last,
            rlds_types.IS_LAST: last,
            rlds_types.IS_FIRST: np.arange(length) == 0,
        }))
    return tf.data.Dataset.from_tensor_slices({rlds_types.STEPS: episodes})


@pytest.fixture(scope='module')
def rlds():
    episodes = _episodes()
    spec = rlds_to_reverb.create_trajectory_data_spec(episodes)
    stream = list(rlds_to_reverb.convert_rlds_to_trajectories(episodes).as_numpy_iterator())
    return episodes, spec, stream


def _server(*tables):
    return reverb.Server(list(tables))


def _check_windows(data, stream, num_steps):
    """Every sampled window equals `num_steps` consecutive pushed steps, leaf by leaf."""
    observations = data.observation.numpy().reshape(-1, num_steps, 2)
    assert observations.shape[0] > 0
    for b, window in enumerate(observations):
        first = int(window[0, 0])
        np.testing.assert_array_equal(window[:, 0], np.arange(first, first + num_steps))
        for t in range(num_steps):
            pushed = stream[first + t]
            for got, want in zip(tf.nest.flatten(data), tf.nest.flatten(pushed)):
                np.testing.assert_array_equal(
                    got.numpy().reshape(-1, num_steps, *np.shape(want))[b, t], want)


@pytest.mark.parametrize('packed', [True, False], ids=['packed', 'tf_agents_signature'])
def test_push_rlds_and_sample_consecutive_windows(rlds, packed):
    episodes, spec, stream = rlds
    name = 'replay'
    if packed:
        table = tf_agents_reverb.table(name, spec, 2, max_size=100)
    else:
        table = reverb.Table(name, reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100,
                             reverb.rate_limiters.MinSize(1),
                             signature=tensor_spec.add_outer_dim(spec))
    server = _server(table)
    try:
        buffer = ReverbReplayBuffer(spec, name, sequence_length=None if packed else 2,
                                    local_server=server)
        assert buffer.packed == packed
        observer = ReverbAddTrajectoryObserver(buffer.py_client, name, sequence_length=2,
                                               data_spec=spec if packed else None)
        assert observer.get_table_signature() == tensor_spec.add_outer_dim(spec)
        assert rlds_to_reverb.push_rlds_to_reverb(episodes, observer) == len(stream)
        observer.close()
        # Windows never cross an episode: one per step after the first of each episode.
        assert buffer.num_frames() == sum(n - 1 for n in EPISODE_LENGTHS)
        data, info = next(iter(buffer.as_dataset(sample_batch_size=16, num_steps=2)))
        assert data.step_type.shape == (16, 2) and info.key.shape == (16, 2)
        _check_windows(data, stream, 2)
        # num_steps=1 splits each 2-step item into rows; no batch dimension.
        data, info = next(iter(buffer.as_dataset(num_steps=1)))
        assert data.observation.shape == (1, 2) and info.probability.shape == (1,)
        _check_windows(data, stream, 1)
        # get_next works (TF-Agents' raises NotImplementedError).
        data, _ = buffer.get_next(sample_batch_size=4, num_steps=2)
        _check_windows(data, stream, 2)
    finally:
        server.stop()


def _fifo_table(name, spec, sequence_length, packed):
    options = dict(sampler=reverb.selectors.Fifo(), remover=reverb.selectors.Fifo(),
                   max_size=1000, max_times_sampled=1,
                   rate_limiter=reverb.rate_limiters.MinSize(1))
    if packed:
        return tf_agents_reverb.table(name, spec, sequence_length, **options)
    return reverb.Table(name, signature=tensor_spec.add_outer_dim(spec), **options)


def _all_items(buffer):
    """Every item of a Fifo table, in insertion order (each sampled once)."""
    dataset = buffer.as_dataset(single_deterministic_pass=True)
    return [tf.nest.map_structure(lambda x: x.numpy(), data) for data, _ in dataset]


@pytest.mark.parametrize('sequence_length,options', [
    (2, {}),
    (3, {'stride_length': 2}),
    (4, {'stride_length': 3, 'pad_end_of_episodes': True}),
    (3, {'pad_end_of_episodes': True, 'tile_end_of_episodes': True}),
    (4, {'stride_length': 2, 'pad_end_of_episodes': True, 'tile_end_of_episodes': True}),
])
def test_items_match_tf_agents_observer_on_the_same_stream(rlds, sequence_length, options):
    _, spec, stream = rlds
    server = _server(_fifo_table('theirs', spec, sequence_length, packed=False),
                     _fifo_table('ours_plain', spec, sequence_length, packed=False),
                     _fifo_table('ours_packed', spec, sequence_length, packed=True))
    try:
        client = reverb.Client(f'localhost:{server.port}')
        observers = [
            reverb_utils.ReverbAddTrajectoryObserver(client, 'theirs', sequence_length,
                                                     **options),
            ReverbAddTrajectoryObserver(client, 'ours_plain', sequence_length, **options),
            ReverbAddTrajectoryObserver(client, 'ours_packed', sequence_length,
                                        data_spec=spec, **options)]
        for step in stream:
            for observer in observers:
                observer(step)
        for observer in observers:
            observer.close()
        sizes = {name: info.current_size for name, info in client.server_info().items()}
        assert sizes['theirs'] > 0 and sizes['ours_plain'] == sizes['ours_packed'] == \
            sizes['theirs']
        theirs = _all_items(reverb_replay_buffer.ReverbReplayBuffer(
            spec, 'theirs', sequence_length, local_server=server, rate_limiter_timeout_ms=200))
        assert len(theirs) == sizes['theirs']
        for name in ('ours_plain', 'ours_packed'):
            ours = _all_items(ReverbReplayBuffer(spec, name, sequence_length, local_server=server,
                                                 rate_limiter_timeout_ms=200))
            assert len(ours) == len(theirs)
            for mine, their in zip(ours, theirs):
                tf.nest.map_structure(np.testing.assert_array_equal, mine, their)
    finally:
        server.stop()


def test_packed_tables_are_declared_and_checked(rlds):
    _, spec, _ = rlds
    server = _server(tf_agents_reverb.table('packed', spec, 2, max_size=10))
    try:
        client = reverb.Client(f'localhost:{server.port}')
        with pytest.raises(ValueError, match=r"stores packed steps: pass data_spec="):
            ReverbAddTrajectoryObserver(client, 'packed', sequence_length=2)
        with pytest.raises(ValueError, match=r"use sequence_length=2"):
            ReverbAddTrajectoryObserver(client, 'packed', sequence_length=3, data_spec=spec)
        other = spec._replace(reward=tf.TensorSpec([3], tf.float32))
        with pytest.raises(ValueError, match=r"built for another data spec"):
            ReverbReplayBuffer(other, 'packed', sequence_length=2, local_server=server)
        with pytest.raises(ValueError, match=r"no table 'missing'"):
            ReverbAddTrajectoryObserver(client, 'missing', sequence_length=2, data_spec=spec)
        signature = client.server_info()['packed'].signature
        assert [s.name for s in signature] == [tf_agents_reverb.PACKED_COLUMN]
        assert signature[0].dtype == tf.uint8  # a CartPole-like step: one column
    finally:
        server.stop()
