"""PrioritizedReplay beyond the shared contract: sampling law, keys, sum tree, XLA."""

import gin
import numpy as np
import pytest
import tensorflow as tf

from buffers.prioritized import PrioritizedReplay
from core.errors import UserError

SPEC = {'t': tf.TensorSpec([], tf.int64), 'env': tf.TensorSpec([], tf.int64)}
ALPHA = 0.6
EPS = 1e-6
# Chi-square critical value at p = 0.001 for 7 degrees of freedom (8 cells).
CHI2_CRIT_DF7_P001 = 24.322


def _make(capacity, num_envs=1, seed=0):
    return PrioritizedReplay(SPEC, capacity=capacity, num_envs=num_envs, batch_size=1,
                             num_steps=1, seed=seed, alpha=ALPHA, priority_epsilon=EPS)


def _add(buffer, t):
    """Writes step t; every leaf names its (t, env) so windows can be checked."""
    n = buffer._num_envs
    buffer.add({'t': tf.fill([n], tf.constant(t, tf.int64)), 'env': tf.range(n, dtype=tf.int64)})


def _stored(p):
    return (np.asarray(p, np.float64) + EPS) ** ALPHA


def _chi_square(counts, probs):
    expected = counts.sum() * probs
    return float(((counts - expected) ** 2 / expected).sum())


def _assert_tree_consistent(buffer):
    """Every internal node is the sum of its children; unused leaves hold nothing."""
    tree, leaves = buffer._tree.numpy(), buffer._num_leaves
    np.testing.assert_allclose(tree[1:leaves], tree[2::2] + tree[3::2], rtol=1e-12)
    size = int(buffer.size().numpy())
    assert (tree[leaves + size:] == 0).all()
    assert (tree[leaves:leaves + size] > 0).all()


def _table_of_eight(raw):
    """Eight one-step items (keys 0..7) with raw priorities `raw`."""
    buffer = _make(capacity=8)
    for t in range(8):
        _add(buffer, t)
    buffer.update_priorities(tf.range(8, dtype=tf.int64), tf.constant(raw, tf.float32))
    return buffer


def test_sampling_frequencies_follow_p_to_the_alpha():
    """Chi-square over 20k draws against q_i / sum q (q = (p + eps)^alpha).

    Stratified draws vary less than a multinomial, so the multinomial critical
    value is conservative: a wrong law still fails it, a right one passes.
    """
    raw = np.array([0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0])
    buffer = _table_of_eight(raw)
    window, info = buffer.sample(20_000, 1)
    keys = info.keys.numpy()
    np.testing.assert_array_equal(keys, window['t'].numpy()[:, 0])
    expected = _stored(raw) / _stored(raw).sum()
    counts = np.bincount(keys, minlength=8)
    assert _chi_square(counts, expected) < CHI2_CRIT_DF7_P001
    # The reported probabilities are the true ones, not estimates.
    np.testing.assert_allclose(info.probabilities.numpy(), expected[keys], rtol=1e-6)


def test_update_priorities_moves_the_frequencies():
    raw = np.ones(8)
    buffer = _table_of_eight(raw)
    before = _stored(raw) / _stored(raw).sum()
    raw[[2, 5]] = [20.0, 0.0]
    buffer.update_priorities(tf.constant([2, 5], tf.int64), tf.constant([20.0, 0.0]))
    after = _stored(raw) / _stored(raw).sum()
    counts = np.bincount(buffer.sample(20_000, 1)[1].keys.numpy(), minlength=8)
    assert _chi_square(counts, after) < CHI2_CRIT_DF7_P001
    assert _chi_square(counts, before) > 100 * CHI2_CRIT_DF7_P001


def test_new_items_get_the_max_priority():
    buffer = _make(capacity=8, num_envs=2)
    _add(buffer, 0)
    np.testing.assert_array_equal(buffer.priorities(tf.constant([0, 1], tf.int64)), [1.0, 1.0])
    buffer.update_priorities(tf.constant([0, 1], tf.int64), tf.constant([9.0, 0.1]))
    buffer.update_priorities(tf.constant([0], tf.int64), tf.constant([0.2]))  # max stays q(9)
    _add(buffer, 1)
    np.testing.assert_allclose(buffer.priorities(tf.constant([0, 1, 2, 3], tf.int64)),
                               _stored([0.2, 0.1, 9.0, 9.0]))
    metrics = buffer.metrics()
    assert metrics['priority_max'] == pytest.approx(_stored(9.0))
    assert metrics['priority_mean'] == pytest.approx(_stored([0.2, 0.1, 9.0, 9.0]).mean())
    _assert_tree_consistent(buffer)


def test_duplicate_keys_keep_their_largest_priority():
    buffer = _make(capacity=8)
    for t in range(3):
        _add(buffer, t)
    buffer.update_priorities(tf.constant([1, 2, 1, 1], tf.int64), tf.constant([1.0, 3.0, 5.0, 2.0]))
    np.testing.assert_allclose(buffer.priorities(tf.constant([0, 1, 2], tf.int64)),
                               [1.0, *_stored([5.0, 3.0])])
    _assert_tree_consistent(buffer)


@pytest.mark.parametrize('num_steps', [1, 3])
def test_invalid_starts_are_never_sampled(num_steps):
    """At every fill level and ring position, even with the invalid starts at top priority.

    Valid starts are steps oldest..newest - num_steps + 1 of each env copy; the
    newest steps get a huge priority, so any leak through the exclusion shows.
    """
    num_envs, rows_per_env = 2, 5
    buffer = _make(capacity=num_envs * rows_per_env, num_envs=num_envs)
    for n in range(1, 16):
        _add(buffer, n - 1)
        newest = tf.range((n - 1) * num_envs, n * num_envs, dtype=tf.int64)
        buffer.update_priorities(newest, tf.fill([num_envs], 1e4))
        if n < num_steps:
            continue
        window, info = buffer.sample(64, num_steps)
        t, keys = window['t'].numpy(), info.keys.numpy()
        oldest = max(n - rows_per_env, 0)
        assert t[:, 0].min() >= oldest and t[:, -1].max() <= n - 1
        np.testing.assert_array_equal(np.diff(t, axis=1), 1)
        np.testing.assert_array_equal(keys, t[:, 0] * num_envs + window['env'].numpy()[:, 0])
        # Probabilities are q_key over the mass of exactly the valid starts.
        valid = np.arange(oldest * num_envs, (n - num_steps + 1) * num_envs)
        q = buffer.priorities(tf.constant(valid, tf.int64)).numpy()
        np.testing.assert_allclose(info.probabilities.numpy(),
                                   q[keys - valid[0]] / q.sum(), rtol=1e-6)
        _assert_tree_consistent(buffer)


def test_stale_and_bad_updates_are_ignored():
    """Keys of overwritten (or never written) steps and non-finite priorities change nothing."""
    buffer = _make(capacity=8, num_envs=2)  # 4 steps per env copy
    for t in range(3):
        _add(buffer, t)
    _, info = buffer.sample(8, 1)
    stale = info.keys.numpy()
    for t in range(3, 7):  # overwrites steps 0..2
        _add(buffer, t)
    tree, max_priority = buffer._tree.numpy(), buffer._max_priority.numpy()
    buffer.update_priorities(tf.constant(stale), tf.fill([len(stale)], 1e6))
    buffer.update_priorities(tf.constant([100, -3, 7 * 2], tf.int64), tf.constant([1e6] * 3))
    buffer.update_priorities(tf.constant([10, 11, 12], tf.int64),
                             tf.constant([np.nan, np.inf, -1.0], tf.float32))
    np.testing.assert_array_equal(buffer._tree.numpy(), tree)
    assert buffer._max_priority.numpy() == max_priority


def test_save_restore_keeps_priorities(tmp_path):
    buffer = _table_of_eight([0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0])
    path = tf.train.Checkpoint(replay=buffer.checkpoint_items()).save(str(tmp_path / 'ckpt'))
    restored = _make(capacity=8, seed=5)
    tf.train.Checkpoint(replay=restored.checkpoint_items()).restore(path).assert_consumed()
    np.testing.assert_array_equal(restored._tree.numpy(), buffer._tree.numpy())
    assert restored._max_priority.numpy() == buffer._max_priority.numpy()


def test_add_sample_update_compile_with_xla():
    """One jit-compiled loop step (add, sample, update) keeps every guarantee.

    XLA draws other random numbers than the TF kernels for the same RNG state,
    so the compiled step is checked against the law, not against an eager twin.
    """
    assert PrioritizedReplay.capabilities.xla and PrioritizedReplay.capabilities.priorities
    buffer = _make(capacity=12, num_envs=2)  # 6 steps per env copy
    for t in range(8):  # wraps the ring
        _add(buffer, t)
    stored_keys = tf.range(2 * 2, 8 * 2, dtype=tf.int64)  # steps 2..7
    buffer.update_priorities(stored_keys, tf.random.stateless_uniform([12], [1, 2]) * 5)
    valid_q = buffer.priorities(tf.range(3 * 2, 8 * 2, dtype=tf.int64)).numpy()  # 3..7
    max_priority = buffer._max_priority.numpy()

    @tf.function(jit_compile=True)
    def loop_step(priorities):
        _add(buffer, 8)  # evicts step 2; step 8 is not yet a 2-step start
        window, info = buffer.sample(32, 2)
        keys = tf.concat([info.keys, info.keys[:4]], 0)
        buffer.update_priorities(keys, priorities)
        return window, info, keys

    priorities = np.arange(36, dtype=np.float32) % 7
    window, info, keys = loop_step(tf.constant(priorities))
    t, sampled = window['t'].numpy(), info.keys.numpy()
    assert t[:, 0].min() >= 3 and t[:, 1].max() <= 8
    np.testing.assert_array_equal(np.diff(t, axis=1), 1)
    np.testing.assert_array_equal(sampled, t[:, 0] * 2 + window['env'].numpy()[:, 0])
    np.testing.assert_allclose(info.probabilities, valid_q[sampled - 6] / valid_q.sum(),
                               rtol=1e-6)
    largest = {}
    for key, p in zip(keys.numpy(), priorities):
        largest[key] = max(largest.get(key, 0.0), p)
    np.testing.assert_allclose(buffer.priorities(tf.constant(list(largest), tf.int64)),
                               _stored(list(largest.values())), rtol=1e-6)
    np.testing.assert_allclose(buffer.priorities(tf.constant([16, 17], tf.int64)),
                               [max_priority] * 2)
    _assert_tree_consistent(buffer)


def test_negative_alpha_is_refused():
    with pytest.raises(UserError, match='alpha'):
        PrioritizedReplay(SPEC, capacity=8, alpha=-1.0)


def test_gin_config_binds_the_backend():
    import app.registry  # noqa: F401  (registers the configurables)

    with gin.unlock_config():
        gin.clear_config()
        try:
            gin.parse_config_file('configs/buffers/prioritized.gin')
            assert gin.query_parameter('PrioritizedReplay.alpha') == 0.6
            assert gin.query_parameter('run.replay_backend').selector == 'PrioritizedReplay'
        finally:
            gin.clear_config()
