"""EpisodicReplay beyond the shared contract: boundaries, uniformity, eviction, stats, XLA.

Every item is a real TF-Agents `Trajectory` whose observation names
`(env, episode, position)`, so a sampled window can be checked on its own and
compared with an independent Python model of which windows are valid.
"""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.trajectories import trajectory as trajectory_lib
from tf_agents.trajectories.time_step import StepType

from buffers.episodic import EpisodicReplay
from core.errors import UserError

SPEC = trajectory_lib.Trajectory(
    step_type=tf.TensorSpec([], tf.int32),
    observation=tf.TensorSpec([3], tf.int64),
    action=tf.TensorSpec([], tf.int64),
    policy_info=(),
    next_step_type=tf.TensorSpec([], tf.int32),
    reward=tf.TensorSpec([], tf.float32),
    discount=tf.TensorSpec([], tf.float32),
)
# Transitions per episode, per env copy; episode k of n transitions is n + 1
# items (the last one the LAST -> FIRST boundary item). Cycled as needed.
LENGTHS = ([3, 5, 2, 4], [4, 1, 6, 2])


def _stream(env, lengths, num_items):
    """Items of one env copy: dicts with step types, episode index k and position."""
    items, k = [], 0
    while len(items) < num_items:
        n = lengths[k % len(lengths)]
        for pos in range(n + 1):
            step_type = StepType.FIRST if pos == 0 else StepType.LAST if pos == n else StepType.MID
            next_type = (StepType.LAST if pos == n - 1 else StepType.FIRST if pos == n
                         else StepType.MID)
            items.append({'env': env, 'k': k, 'pos': pos, 'step_type': int(step_type),
                          'next_step_type': int(next_type),
                          # Boundary items carry reward 0, as in TF-Agents.
                          'reward': 0.0 if pos == n else float(k + 1)})
        k += 1
    return items[:num_items]


def _streams(num_items, lengths=LENGTHS):
    return [_stream(env, env_lengths, num_items) for env, env_lengths in enumerate(lengths)]


def _batched(items):
    """The batched Trajectory [num_envs] of one item per env copy."""
    return trajectory_lib.Trajectory(
        step_type=tf.constant([i['step_type'] for i in items], tf.int32),
        observation=tf.constant([[i['env'], i['k'], i['pos']] for i in items], tf.int64),
        action=tf.zeros([len(items)], tf.int64),
        policy_info=(),
        next_step_type=tf.constant([i['next_step_type'] for i in items], tf.int32),
        reward=tf.constant([i['reward'] for i in items], tf.float32),
        discount=tf.ones([len(items)], tf.float32),
    )


def _make(capacity, num_envs=2, spec=SPEC, num_steps=2, seed=0):
    return EpisodicReplay(spec, capacity=capacity, num_envs=num_envs, batch_size=1,
                          num_steps=num_steps, seed=seed)


def _fill(buffer, streams, start, stop):
    for t in range(start, stop):
        buffer.add(_batched([stream[t] for stream in streams]))


def _reference_windows(streams, num_adds, rows_per_env, num_steps):
    """Valid windows `(env, k, first position)` by brute force over the Python streams.

    Written from the documented rules, not from the implementation: stored,
    one episode, not starting on LAST, episode alive (head stored, or the env
    copy's current episode).
    """
    windows = set()
    oldest = max(num_adds - rows_per_env, 0)
    for items in streams:
        items = items[:num_adds]
        heads = {item['k']: t for t, item in reversed(list(enumerate(items)))}
        current = items[-1]['k']
        for t in range(oldest, num_adds - num_steps + 1):
            window = items[t:t + num_steps]
            k = window[0]['k']
            if (all(item['k'] == k for item in window)
                    and window[0]['step_type'] != int(StepType.LAST)
                    and (heads[k] >= oldest or k == current)):
                windows.add((window[0]['env'], k, window[0]['pos']))
    return windows


def _sampled_windows(window):
    """Checks each sampled window is one episode's consecutive items; returns their ids."""
    obs = window.observation.numpy()
    step_type = window.step_type.numpy()
    assert (obs[:, :, :2] == obs[:, :1, :2]).all(), 'a window mixes env copies or episodes'
    np.testing.assert_array_equal(np.diff(obs[:, :, 2], axis=1), 1)
    assert (step_type[:, 0] != int(StepType.LAST)).all(), 'a window starts on a boundary item'
    assert (step_type[:, 1:] != int(StepType.FIRST)).all(), 'a window crosses into an episode'
    return [tuple(row) for row in obs[:, 0, :].tolist()]


@pytest.mark.parametrize('rows_per_env, num_steps', [(40, 3), (7, 2), (5, 1)])
def test_sampled_windows_are_exactly_the_valid_ones(rows_per_env, num_steps):
    """Filling step by step (including ring wrap-around and eviction), the set of
    sampled windows equals the reference set, and probabilities are 1 / its size."""
    streams = _streams(50)
    buffer = _make(capacity=2 * rows_per_env)
    for stop in range(4, 50, 5):
        _fill(buffer, streams, stop - 5 if stop > 4 else 0, stop)
        expected = _reference_windows(streams, stop, rows_per_env, num_steps)
        window, info = buffer.sample(3000, num_steps)
        assert set(_sampled_windows(window)) == expected, f'after {stop} adds'
        np.testing.assert_allclose(info.probabilities.numpy(), 1 / len(expected), rtol=1e-6)


def test_keys_name_the_first_item_of_each_window():
    streams = _streams(12)
    buffer = _make(capacity=40)
    _fill(buffer, streams, 0, 12)
    window, info = buffer.sample(200, 2)
    steps, envs = np.divmod(info.keys.numpy(), 2)
    obs = window.observation.numpy()[:, 0]
    expected = [(streams[e][s]['k'], streams[e][s]['pos']) for s, e in zip(steps, envs)]
    assert [tuple(o) for o in obs[:, 1:].tolist()] == expected
    np.testing.assert_array_equal(obs[:, 0], envs)


def test_windows_are_drawn_uniformly():
    """Chi-square of 20k draws against equal frequencies over all valid windows."""
    streams = _streams(30)
    buffer = _make(capacity=60)
    _fill(buffer, streams, 0, 30)
    expected = sorted(_reference_windows(streams, 30, 30, 2))
    window, _ = buffer.sample(20000, 2)
    sampled = _sampled_windows(window)
    counts = np.array([sampled.count(w) for w in expected], np.float64)
    assert counts.sum() == 20000
    mean = counts.mean()
    chi2 = float(((counts - mean) ** 2 / mean).sum())
    df = len(expected) - 1
    assert chi2 < df + 5 * np.sqrt(2 * df), (chi2, df)  # about p < 1e-4 for df ~ 40


def test_whole_episodes_are_evicted():
    """One env copy, 6 rows: episode A (3 transitions, 4 items) then B (4, 5 items)."""
    streams = _streams(12, lengths=([3, 4, 2],))
    buffer = _make(capacity=6, num_envs=1)
    _fill(buffer, streams, 0, 6)  # A whole, B's first two items
    assert buffer.metrics()['episodes'] == 1 and buffer.metrics()['size'] == 6
    _fill(buffer, streams, 6, 7)  # overwrites A's head: all of A goes
    metrics = buffer.metrics()
    assert metrics['size'] == 3 and metrics['episodes'] == 0 and metrics['fill_ratio'] == 0.5
    window, _ = buffer.sample(500, 2)
    assert {k for _, k, _ in _sampled_windows(window)} == {1}
    _fill(buffer, streams, 7, 9)  # B complete; A's LAST item is still in a row, but dead
    metrics = buffer.metrics()
    assert metrics['size'] == 5 and metrics['episodes'] == 1
    np.testing.assert_array_equal(buffer.episode_stats()['lengths'], [4])


def test_incomplete_episode_is_sampled_as_far_as_written():
    streams = _streams(20, lengths=([9],))
    buffer = _make(capacity=20, num_envs=1)
    _fill(buffer, streams, 0, 4)
    window, info = buffer.sample(400, 2)
    assert set(_sampled_windows(window)) == {(0, 0, 0), (0, 0, 1), (0, 0, 2)}
    np.testing.assert_allclose(info.probabilities.numpy(), 1 / 3)
    assert buffer.metrics()['episodes'] == 0
    assert buffer.episode_stats()['lengths'].size == 0


def test_episode_longer_than_capacity_is_truncated_then_evicted_whole():
    streams = _streams(20, lengths=([9, 2],))  # 10 items, then 3
    buffer = _make(capacity=6, num_envs=1)
    _fill(buffer, streams, 0, 10)  # items 4..9 of episode 0 survive, LAST included
    metrics = buffer.metrics()
    assert metrics['truncated_episodes'] == 1 and metrics['episodes'] == 0
    assert metrics['size'] == 6
    window, _ = buffer.sample(500, 2)
    assert {pos for _, _, pos in _sampled_windows(window)} == {4, 5, 6, 7, 8}
    _fill(buffer, streams, 10, 11)  # the next episode begins: the truncated one goes whole
    metrics = buffer.metrics()
    assert metrics['truncated_episodes'] == 0 and metrics['size'] == 1
    _fill(buffer, streams, 11, 13)
    window, _ = buffer.sample(100, 2)
    assert {(k, pos) for _, k, pos in _sampled_windows(window)} == {(1, 0), (1, 1)}


def test_episode_stats_lengths_and_returns():
    streams = _streams(16)
    buffer = _make(capacity=40)
    _fill(buffer, streams, 0, 16)
    stats = buffer.episode_stats()
    # Complete episodes, ordered by start step then env copy:
    # env 0: k0 (3, steps 0-3), k1 (5, 4-9), k2 (2, 10-12); env 1: k0 (4, 0-4),
    # k1 (1, 5-6), k2 (6, 7-13). Reward k + 1 per transition.
    np.testing.assert_array_equal(stats['lengths'], [3, 4, 5, 1, 6, 2])
    np.testing.assert_allclose(stats['returns'], [3, 4, 10, 2, 18, 6])
    assert buffer.metrics()['episodes'] == 6


def test_episode_stats_without_reward_or_step_type():
    no_reward = {'step_type': tf.TensorSpec([], tf.int32), 'obs': tf.TensorSpec([], tf.int64)}
    buffer = _make(capacity=20, num_envs=1, spec=no_reward)
    for t, step_type in enumerate([0, 1, 2, 0, 1]):
        buffer.add({'step_type': tf.constant([step_type]), 'obs': tf.constant([t], tf.int64)})
    stats = buffer.episode_stats()
    assert set(stats) == {'lengths'}
    np.testing.assert_array_equal(stats['lengths'], [2])

    plain = _make(capacity=20, num_envs=1, spec={'obs': tf.TensorSpec([], tf.int64)})
    for t in range(5):
        plain.add({'obs': tf.constant([t], tf.int64)})
    assert plain.episode_stats()['lengths'].size == 0
    assert plain.metrics()['episodes'] == 0 and plain.metrics()['size'] == 5
    obs = plain.sample(200, 3)[0]['obs'].numpy()  # one episode: every 3-window is valid
    assert {row[0] for row in obs.tolist()} == {0, 1, 2}


def test_add_and_sample_compile_with_xla():
    streams = _streams(30)
    buffer = _make(capacity=24)
    add = tf.function(buffer.add, jit_compile=True)
    for t in range(30):
        add(_batched([s[t] for s in streams]))
    sample = tf.function(lambda: buffer.sample(2000, 2), jit_compile=True)
    window, info = sample()
    expected = _reference_windows(streams, 30, 12, 2)
    assert set(_sampled_windows(window)) == expected
    np.testing.assert_allclose(info.probabilities.numpy(), 1 / len(expected), rtol=1e-6)
    again, _ = sample()
    assert not np.array_equal(window.observation.numpy(), again.observation.numpy())


def test_save_restore_keeps_episode_state(tmp_path):
    """Restored mid-episode, the buffer continues that episode exactly like the original."""
    streams = _streams(30)
    buffer = _make(capacity=16, seed=1)
    _fill(buffer, streams, 0, 21)
    path = tf.train.Checkpoint(replay=buffer.checkpoint_items()).save(str(tmp_path / 'ckpt'))
    restored = _make(capacity=16, seed=7)
    tf.train.Checkpoint(replay=restored.checkpoint_items()).restore(path).assert_consumed()
    for replay in (buffer, restored):
        _fill(replay, streams, 21, 26)
    assert restored.metrics() == buffer.metrics()
    a, a_info = buffer.sample(64, 3)
    b, b_info = restored.sample(64, 3)
    tf.nest.map_structure(np.testing.assert_array_equal, (a, a_info), (b, b_info))


def test_windows_longer_than_the_ring_are_refused():
    buffer = _make(capacity=8)
    with pytest.raises(UserError, match='raise the capacity'):
        buffer.sample(4, 5)


def test_item_after_last_begins_an_episode_even_without_first():
    """Sources that never emit FIRST (e.g. logged data) still split at LAST items."""
    spec = {'step_type': tf.TensorSpec([], tf.int32), 'obs': tf.TensorSpec([], tf.int64)}
    buffer = _make(capacity=20, num_envs=1, spec=spec)
    for t, step_type in enumerate([1, 1, 2, 1, 1, 2, 1]):
        buffer.add({'step_type': tf.constant([step_type]), 'obs': tf.constant([t], tf.int64)})
    np.testing.assert_array_equal(buffer.episode_stats()['lengths'], [2, 2])
    obs = buffer.sample(300, 2)[0]['obs'].numpy()
    assert {tuple(row) for row in obs.tolist()} == {(0, 1), (1, 2), (3, 4), (4, 5)}
