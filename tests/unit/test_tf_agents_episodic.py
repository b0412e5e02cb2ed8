"""buffers.tf_agents_episodic.EpisodicReplayBuffer beyond TF-Agents' own test file.

What a TF-Agents user relies on and that file does not check: windows from
`as_dataset(sample_batch_size, num_steps)` never cross an episode and cover every
valid window, stale pre-drawn windows are never delivered, eviction order, the pool
reusing evicted episodes' slots, `completed_only`, Trajectories through
`StatefulEpisodicReplayBuffer`, refused arguments, XLA, checkpoints.

Items name themselves: the value `1000 * episode + position`, so a window can be
checked on its own.
"""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.trajectories import trajectory as trajectory_lib
from tf_agents.trajectories.time_step import StepType

from buffers.tf_agents_episodic import EpisodicReplayBuffer, StatefulEpisodicReplayBuffer

SPEC = {'value': tf.TensorSpec([], tf.int64), 'obs': tf.TensorSpec([2], tf.float32)}


def _items(values):
    values = np.asarray(values, np.int64)
    return {'value': values, 'obs': np.stack([values, -values], -1).astype(np.float32)}


def _buffer(capacity=10, sequences=False, **kwargs):
    """A buffer whose items begin an episode at value 1000 * k. With `sequences` its
    begin/end functions give the one scalar `add_sequence` needs (from the first item)."""
    def begins(items):
        value = items['value'][0] if sequences else items['value']
        return tf.equal(value % 1000, 0)

    kwargs.setdefault('begin_episode_fn', begins)
    kwargs.setdefault('end_episode_fn', lambda items: tf.zeros_like(begins(items)))
    return EpisodicReplayBuffer(SPEC, capacity=capacity, seed=1, **kwargs)


def _fill_interleaved(rb, lengths_per_copy):
    """Episodes of several env copies written together by `add_batch`, one item per copy
    per call; copy c's k-th episode has id-like tag `10 * k + c` (value 1000 * tag + pos)."""
    streams = []
    for copy, lengths in enumerate(lengths_per_copy):
        stream = []
        for k, length in enumerate(lengths):
            stream += [1000 * (10 * k + copy) + pos for pos in range(length)]
        streams.append(stream)
    steps = min(len(s) for s in streams)
    ids = rb.create_episode_ids(len(streams))
    for t in range(steps):
        ids = rb.add_batch(_items([s[t] for s in streams]), ids)
    return [s[:steps] for s in streams]


def _valid_windows(streams, num_steps):
    windows = set()
    for stream in streams:
        for t in range(len(stream) - num_steps + 1):
            window = stream[t:t + num_steps]
            if len({v // 1000 for v in window}) == 1:
                windows.add(tuple(window))
    return windows


def test_dataset_windows_stay_inside_one_episode_and_cover_every_valid_window():
    rb = _buffer()
    streams = _fill_interleaved(rb, [[5, 3, 7], [2, 6, 4, 4]])
    expected = _valid_windows(streams, 3)
    seen = set()
    for data, info in rb.as_dataset(sample_batch_size=32, num_steps=3).take(40):
        values = data['value'].numpy()
        assert data['value'].shape == (32, 3) and data['obs'].shape == (32, 3, 2)
        np.testing.assert_array_equal(data['obs'].numpy()[..., 1], -values)
        windows = {tuple(w) for w in values}
        assert windows <= expected, windows - expected
        # BufferInfo ids name each window's episode.
        tags = values[:, 0] // 1000
        assert len(set(zip(tags, info.ids.numpy()))) == len(set(tags))
        seen |= windows
    assert seen == expected  # 1280 draws over 20 windows: every one turns up


def test_windows_are_uniform_over_valid_windows_not_over_episodes():
    rb = _buffer(sequences=True)
    ids = rb.create_episode_ids()
    ids = rb.add_sequence(_items([0, 1]), ids)  # 1 two-step window
    rb.add_sequence(_items([1000 + p for p in range(9)]), ids)  # 8 windows
    data, _ = rb.get_next(sample_batch_size=9000, num_steps=2)
    short = np.mean(data['value'].numpy()[:, 0] < 1000)
    assert abs(short - 1 / 9) < 0.02  # TF-Agents' length weighting would give ~2 / 11


def test_stale_predrawn_windows_are_redrawn_when_delivered():
    rb = _buffer(capacity=2, sequences=True, buffer_size=50)
    ids = rb.create_episode_ids()
    for episode in (0, 1):
        ids = rb.add_sequence(_items([1000 * episode + p for p in range(4)]), ids)
    options = tf.data.Options()  # no prefetch, so each batch is gathered when it is asked for
    options.autotune.enabled = False
    options.experimental_optimization.inject_prefetch = False
    iterator = iter(rb.as_dataset(sample_batch_size=8, num_steps=2).with_options(options))
    first, _ = next(iterator)  # draws 50 batches' starts from episodes 0 and 1
    assert set(first['value'].numpy()[:, 0] // 1000) <= {0, 1}
    for episode in (2, 3):  # evicts episodes 0 and 1; their slots get reused
        ids = rb.add_sequence(_items([1000 * episode + p for p in range(4)]), ids)
    for _ in range(10):
        data, info = next(iterator)
        values = data['value'].numpy()
        assert set(values[:, 0] // 1000) <= {2, 3}
        np.testing.assert_array_equal(values[:, 1] - values[:, 0], 1)
        np.testing.assert_array_equal(info.ids.numpy(), values[:, 0] // 1000)


def test_capacity_evicts_the_oldest_episodes_and_reuses_their_slots():
    rb = _buffer(capacity=3, sequences=True)
    ids = rb.create_episode_ids()
    for episode in range(50):
        ids = rb.add_sequence(_items([1000 * episode + p for p in range(20)]), ids)
        if episode >= 3:
            assert not rb.get_valid_ids_mask([episode - 3]).numpy()[0]
    assert rb._get_last_episode_id().numpy() == 49
    stored = rb.gather_all()['value'].numpy()[0]
    np.testing.assert_array_equal(stored, [1000 * e + p for e in (47, 48, 49) for p in range(20)])
    assert rb.num_frames().numpy() == 60
    # Evicted episodes' slots are reused: the pool stays near what 3 episodes need.
    assert rb._frame_episode.shape.rank == 1 and tf.size(rb._frame_episode).numpy() <= 256


def test_completed_only_samples_completed_episodes_and_says_when_there_is_none():
    rb = _buffer(completed_only=True,
                 end_episode_fn=lambda items: tf.equal(items['value'] % 1000, 3))
    rb.add_batch(_items([0, 1000]), rb.create_episode_ids(2))  # episodes 0 and 1, running
    with pytest.raises(tf.errors.InvalidArgumentError, match='completed episode'):
        next(iter(rb.as_dataset(sample_batch_size=2, num_steps=2)))
    ids = rb.create_episode_ids(2)
    for pos in range(4):  # episode 2 ends at position 3; episode 3 (values 1000 + 2 pos) not
        ids = rb.add_batch(_items([pos, 1000 + 2 * pos]), ids)
    data, _ = rb.get_next(sample_batch_size=64, num_steps=2)
    assert set(data['value'].numpy().ravel()) <= {0, 1, 2, 3}
    episode, info = rb.get_next()
    np.testing.assert_array_equal(episode['value'], [0, 1, 2, 3])
    np.testing.assert_array_equal(rb.gather_all()['value'].numpy()[0], [0, 1, 2, 3])


def test_trajectories_through_stateful_wrapper_split_at_first_and_complete_at_last():
    spec = trajectory_lib.Trajectory(
        step_type=tf.TensorSpec([], tf.int32), observation=tf.TensorSpec([], tf.int64),
        action=tf.TensorSpec([], tf.int64), policy_info=(),
        next_step_type=tf.TensorSpec([], tf.int32), reward=tf.TensorSpec([], tf.float32),
        discount=tf.TensorSpec([], tf.float32))
    rb = EpisodicReplayBuffer(spec, capacity=4, seed=0)
    stateful = StatefulEpisodicReplayBuffer(rb, num_episodes=2)
    types = [StepType.FIRST, StepType.MID, StepType.LAST, StepType.FIRST, StepType.MID]
    for t, step_type in enumerate(types):
        step_type = tf.constant([int(step_type)] * 2, tf.int32)
        stateful.add_batch(trajectory_lib.Trajectory(
            step_type=step_type, observation=tf.constant([t, 100 + t], tf.int64),
            action=tf.zeros([2], tf.int64), policy_info=(), next_step_type=step_type,
            reward=tf.zeros([2]), discount=tf.ones([2])))
    np.testing.assert_array_equal(stateful.episode_ids.numpy(), [2, 3])
    np.testing.assert_array_equal(rb._completed_episodes().numpy(), [0, 1])
    np.testing.assert_array_equal(rb._get_episode(1).observation, [100, 101, 102])
    np.testing.assert_array_equal(rb._get_episode(2).observation, [3, 4])


@pytest.mark.parametrize('call, error, name', [
    (lambda rb: rb.get_next(time_stacked=False), NotImplementedError, 'time_stacked'),
    (lambda rb: rb.as_dataset(sequence_preprocess_fn=lambda x: x), NotImplementedError,
     'sequence_preprocess_fn'),
    (lambda rb: rb.as_dataset(sample_batch_size=4), ValueError, 'num_steps'),
    (lambda rb: rb.as_dataset(sample_batch_size=4, num_steps=0), ValueError, 'num_steps'),
    (lambda rb: rb.add_batch(_items([0])), NotImplementedError, 'episode_ids'),
    (lambda rb: _buffer(buffer_size=0), ValueError, 'buffer_size'),
    (lambda rb: _buffer(dataset_window_shift=0), ValueError, 'dataset_window_shift'),
    (lambda rb: EpisodicReplayBuffer(SPEC, capacity=0), ValueError, 'capacity'),
    (lambda rb: _buffer(begin_episode_fn=lambda items: items['value'] >= 0).add_sequence(
        _items([0, 1]), -1), ValueError, 'begin_episode_fn'),
])
def test_arguments_it_cannot_honour_are_refused_by_name(call, error, name):
    rb = _buffer()
    with pytest.raises(error, match=name):
        call(rb)


def test_sampling_compiles_with_xla_and_the_pool_grows_inside_tf_function():
    rb = _buffer(capacity=4)
    add = tf.function(rb.add_batch)
    ids = rb.create_episode_ids(2)
    for t in range(100):  # 200 items: more than the initial 64 slots
        ids = add(_items([t, 1000 + t]), ids)
    assert tf.size(rb._frame_episode).numpy() >= 200
    sample = tf.function(lambda: rb.get_next(sample_batch_size=128, num_steps=4),
                         jit_compile=True)
    data, info = sample()
    values = data['value'].numpy()
    np.testing.assert_array_equal(np.diff(values, axis=1), 1)
    np.testing.assert_array_equal(info.ids.numpy(), values[:, 0] // 1000)


def test_a_checkpoint_restores_contents_into_a_fresh_buffer(tmp_path):
    rb = _buffer(capacity=3, sequences=True)
    ids = rb.create_episode_ids()
    for episode in range(4):
        ids = rb.add_sequence(_items([1000 * episode + p for p in range(30)]), ids)
    path = tf.train.Checkpoint(rb=rb).save(str(tmp_path / 'ckpt'))
    fresh = _buffer(capacity=3, sequences=True)
    tf.train.Checkpoint(rb=fresh).restore(path).assert_existing_objects_matched()
    np.testing.assert_array_equal(fresh.gather_all()['value'], rb.gather_all()['value'])
    ids = fresh.add_sequence(_items([3030, 3031]), ids)  # the running episode carries on
    np.testing.assert_array_equal(fresh._get_episode(3)['value'][-3:], [3029, 3030, 3031])
