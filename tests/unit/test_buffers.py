"""One contract test for every replay backend (DESIGN.md: interfaces are total)."""

import numpy as np
import pytest
import tensorflow as tf

from buffers.base import ReplayBackend, SampleInfo
from buffers.episodic import EpisodicReplay
from buffers.prioritized import PrioritizedReplay
from buffers.reverb_replay import ReverbPrioritizedReplay, ReverbUniformReplay
from buffers.uniform import UniformReplay
from core.errors import UserError

NUM_ENVS = 2
SPEC = {
    'obs': tf.TensorSpec([3], tf.float32),
    't': tf.TensorSpec([], tf.int64),
    'env': tf.TensorSpec([], tf.int64),
}
BACKENDS = [UniformReplay, PrioritizedReplay, EpisodicReplay,
            pytest.param(ReverbUniformReplay, marks=pytest.mark.reverb),
            pytest.param(ReverbPrioritizedReplay, marks=pytest.mark.reverb)]


def _step(t):
    """The batched step written at time t: each leaf identifies (t, env)."""
    env = np.arange(NUM_ENVS, dtype=np.int64)
    return {
        'obs': tf.constant(np.stack([np.full(3, t * 10 + e, np.float32) for e in env])),
        't': tf.constant(np.full(NUM_ENVS, t, np.int64)),
        'env': tf.constant(env),
    }


def _make(backend_cls, capacity=20, seed=0, num_steps=2):
    return backend_cls(SPEC, capacity=capacity, num_envs=NUM_ENVS, batch_size=4,
                       num_steps=num_steps, seed=seed)


def _oldest_kept(request, newest, steps_per_env, num_steps=2):
    """The oldest step a sampled window may hold once eviction has begun.

    Row buffers keep each copy's last `steps_per_env` steps; Reverb tables keep
    its last `steps_per_env` windows (items), which reach `num_steps - 1` further back.
    """
    oldest = newest - steps_per_env + 1
    return oldest - (num_steps - 1) if request.node.get_closest_marker('reverb') else oldest


def _fill(buffer, steps):
    for t in range(steps):
        buffer.add(_step(t))


def _drawable(buffer, draws=1024):
    """The set of (window t, env, key, probability) a buffer draws in many samples."""
    window, info = buffer.sample(draws, 2)
    return set(zip(map(tuple, window['t'].numpy()), map(tuple, window['env'].numpy()),
                   info.keys.numpy(), info.probabilities.numpy()))


@pytest.mark.parametrize('backend_cls', BACKENDS)
class TestReplayContract:

    def test_implements_the_interface(self, backend_cls):
        assert isinstance(_make(backend_cls), ReplayBackend)

    def test_sample_shapes_and_windows(self, backend_cls):
        buffer = _make(backend_cls, num_steps=3)
        _fill(buffer, 6)
        window, info = buffer.sample(16, 3)
        assert window['obs'].shape == (16, 3, 3)
        assert window['t'].shape == (16, 3)
        assert isinstance(info, SampleInfo)
        assert info.keys.shape == (16,) and info.probabilities.shape == (16,)
        t, env = window['t'].numpy(), window['env'].numpy()
        # A window is consecutive steps of one env copy, never mixing copies.
        np.testing.assert_array_equal(np.diff(t, axis=1), 1)
        assert (env == env[:, :1]).all()
        np.testing.assert_allclose(window['obs'].numpy()[..., 0], t * 10 + env)

    def test_eviction_at_capacity(self, backend_cls, request):
        buffer = _make(backend_cls, capacity=10)  # 5 steps per env copy
        _fill(buffer, 12)
        assert buffer.metrics()['size'] == 10
        assert buffer.metrics()['fill_ratio'] == 1.0
        window, _ = buffer.sample(256, 2)
        # Only the last 5 steps (7..11) survive; windows never straddle evicted rows.
        assert window['t'].numpy().min() >= _oldest_kept(request, 11, 5)
        assert window['t'].numpy().max() <= 11

    def test_sampling_covers_all_items_uniformly(self, backend_cls):
        buffer = _make(backend_cls, capacity=20, num_steps=1)
        _fill(buffer, 6)
        window, info = buffer.sample(5000, 1)
        counts = np.bincount(window['t'].numpy()[:, 0] * NUM_ENVS + window['env'].numpy()[:, 0])
        assert len(counts) == 12 and counts.min() > 300
        np.testing.assert_allclose(info.probabilities.numpy(), 1 / 12, rtol=1e-6)

    def test_sample_inside_xla_function(self, backend_cls):
        buffer = _make(backend_cls)
        _fill(buffer, 4)
        jit = backend_cls.capabilities.xla
        first = tf.function(lambda: buffer.sample(8, 2)[0]['t'], jit_compile=jit)()
        second = tf.function(lambda: buffer.sample(8, 2)[0]['t'], jit_compile=jit)()
        assert first.shape == (8, 2)
        assert not np.array_equal(first.numpy(), second.numpy())  # RNG state advances

    def test_as_dataset(self, backend_cls):
        buffer = _make(backend_cls)
        _fill(buffer, 4)
        window, info = next(iter(buffer.as_dataset(4, 2)))
        assert window['t'].shape == (4, 2) and info.keys.shape == (4,)

    def test_save_restore_is_identical(self, backend_cls, tmp_path, request):
        buffer = _make(backend_cls, seed=1)
        _fill(buffer, 7)
        path = tf.train.Checkpoint(replay=buffer.checkpoint_items()).save(str(tmp_path / 'ckpt'))
        restored = _make(backend_cls, seed=99)
        tf.train.Checkpoint(replay=restored.checkpoint_items()).restore(path).assert_consumed()
        assert restored.metrics() == buffer.metrics()
        if request.node.get_closest_marker('reverb'):
            # Reverb's server-side sampler cannot be seeded: compare every window
            # either table can draw, with its key and probability.
            assert _drawable(buffer) == _drawable(restored)
            return
        # Same contents and same RNG state: the next samples agree exactly.
        a, a_info = buffer.sample(32, 2)
        b, b_info = restored.sample(32, 2)
        tf.nest.map_structure(np.testing.assert_array_equal, a, b)
        # Same keys and probabilities: priorities were restored too.
        tf.nest.map_structure(np.testing.assert_array_equal, a_info, b_info)

    def test_update_priorities_is_accepted(self, backend_cls):
        buffer = _make(backend_cls)
        _fill(buffer, 4)
        _, info = buffer.sample(4, 2)
        buffer.update_priorities(info.keys, tf.ones([4]))
        assert buffer.sample(4, 2)[0]['t'].shape == (4, 2)

    def test_priorities_feed_back_inside_the_compiled_loop(self, backend_cls, request):
        """The loop's sample -> update_priorities round trip, with XLA where claimed.

        Duplicate keys and keys whose rows were overwritten must be accepted
        without corrupting sampling: windows stay valid, probabilities stay in
        (0, 1].
        """
        buffer = _make(backend_cls, capacity=10)
        _fill(buffer, 4)
        _, old = buffer.sample(4, 2)
        for t in range(4, 12):  # keeps steps 7..11: every row of `old.keys` is overwritten
            buffer.add(_step(t))

        @tf.function(jit_compile=backend_cls.capabilities.xla)
        def train_once():
            _, info = buffer.sample(4, 2)
            keys = tf.concat([info.keys, info.keys[:1], old.keys], 0)
            buffer.update_priorities(keys, tf.range(9, dtype=tf.float32))
            return buffer.sample(64, 2)

        window, info = train_once()
        t = window['t'].numpy()
        np.testing.assert_array_equal(np.diff(t, axis=1), 1)
        assert t.min() >= _oldest_kept(request, 11, 5) and t.max() <= 11
        p = info.probabilities.numpy()
        assert (p > 0).all() and (p <= 1).all()

    def test_close_is_idempotent(self, backend_cls):
        buffer = _make(backend_cls)
        buffer.close()
        buffer.close()


@pytest.mark.parametrize('capacity, message', [
    (0, 'positive'),
    (-5, 'positive'),
    (3, 'smaller than batch_size'),
    (5, 'at least 6'),
])
def test_impossible_capacity_is_refused(capacity, message):
    with pytest.raises(UserError, match=message):
        UniformReplay(SPEC, capacity=capacity, num_envs=2, batch_size=4, num_steps=3)


def test_large_rows_fall_back_from_xla():
    """XLA's CPU gather is slower on image-sized rows: such buffers opt out of jit."""
    image = {'obs': tf.TensorSpec([84, 84, 4], tf.uint8)}
    assert not UniformReplay(image, capacity=8, num_envs=1, batch_size=2).capabilities.xla
    assert UniformReplay(SPEC, capacity=8, num_envs=1, batch_size=2).capabilities.xla
