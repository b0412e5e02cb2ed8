"""Reverb-specific behaviour of the Reverb backends (the shared contract is in test_buffers.py).

Every test here starts an in-process Reverb server through the `make` fixture,
which closes it again, so all are marked `reverb`.
"""

import os
import time

import gin
import numpy as np
import pytest
import reverb
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import trajectory as trajectory_lib

from buffers.reverb_replay import ReverbPrioritizedReplay, ReverbUniformReplay
from core.errors import UserError

pytestmark = pytest.mark.reverb

NUM_ENVS = 2
SPEC = {
    'obs': tf.TensorSpec([3], tf.float32),
    't': tf.TensorSpec([], tf.int64),
    'env': tf.TensorSpec([], tf.int64),
}


def _step(t, num_envs=NUM_ENVS):
    env = np.arange(num_envs, dtype=np.int64)
    return {
        'obs': tf.constant(np.stack([np.full(3, t * 10 + e, np.float32) for e in env])),
        't': tf.constant(np.full(num_envs, t, np.int64)),
        'env': tf.constant(env),
    }


def _fill(buffer, start, stop):
    for t in range(start, stop):
        buffer.add(_step(t))


@pytest.fixture
def make():
    """Builds backends (each starts its own server) and closes them all afterwards."""
    made = []

    def build(cls=ReverbPrioritizedReplay, **kwargs):
        kwargs = {'capacity': 20, 'num_envs': NUM_ENVS, 'batch_size': 4, 'num_steps': 2,
                  **kwargs}
        buffer = cls(kwargs.pop('spec', SPEC), **kwargs)
        made.append(buffer)
        return buffer

    yield build
    for buffer in made:
        buffer.close()


def _table(buffer, draws=2000):
    """{key: (priority, t, env, obs)} of every item, read through a fresh Reverb dataset.

    Enough draws from a small table reach every item; callers check the count.
    """
    dataset = reverb.TrajectoryDataset.from_table_signature(
        buffer.server_address, buffer.table_name, max_in_flight_samples_per_worker=100,
        rate_limiter_timeout_ms=1000, max_samples=draws)
    items = {}
    for sample in dataset.batch(draws):
        window = tf.nest.map_structure(lambda x: x.numpy(), buffer.decode_window(sample.data)[0])
        for i, key in enumerate(sample.info.key.numpy()):
            items[int(key)] = (float(sample.info.priority.numpy()[i]), tuple(window['t'][i]),
                               tuple(window['env'][i]), window['obs'][i].tobytes())
    return items


def test_save_restore_gives_identical_items_priorities_and_unblocked_sampling(make, tmp_path):
    buffer = make(checkpoint_dir=str(tmp_path / 'replay'))
    _fill(buffer, 0, 8)  # 7 windows per copy
    _, info = buffer.sample(8, 2)
    buffer.update_priorities(info.keys, tf.linspace(0.5, 4.0, 8))
    before = _table(buffer)
    assert len(before) == 14 and len({p for p, *_ in before.values()}) > 2
    checkpoint = tf.train.Checkpoint(replay=buffer.checkpoint_items())
    path = checkpoint.save(str(tmp_path / 'ckpt'))
    buffer.close()

    restored = make(checkpoint_dir=str(tmp_path / 'replay'))
    tf.train.Checkpoint(replay=restored.checkpoint_items()).restore(path).assert_consumed()
    assert _table(restored) == before
    metrics = restored.metrics()
    assert metrics['windows'] == 14 and metrics['size'] == 16 and metrics['inserted'] == 16
    start = time.perf_counter()
    window, _ = tf.function(lambda: restored.sample(32, 2))()
    assert time.perf_counter() - start < 5, 'sampling blocked after restore'
    assert window['t'].shape == (32, 2)
    # MinSize(1): whatever counts the restored limiter kept, it can never block sampling.
    info = reverb.Client(restored.server_address).server_info()[restored.table_name]
    assert info.rate_limiter_info.min_diff < -1e300 and info.rate_limiter_info.max_diff > 1e300


def test_new_items_after_restore_get_the_restored_max_priority(make, tmp_path):
    buffer = make()
    _fill(buffer, 0, 3)
    _, info = buffer.sample(4, 2)
    buffer.update_priorities(info.keys[:1], tf.constant([7.0]))
    path = tf.train.Checkpoint(replay=buffer.checkpoint_items()).save(str(tmp_path / 'ckpt'))
    restored = make()
    tf.train.Checkpoint(replay=restored.checkpoint_items()).restore(path).assert_consumed()
    old_keys = set(_table(restored))
    _fill(restored, 3, 6)  # the writer restarts: 2 new windows per copy after 3 steps
    new = {k: v for k, v in _table(restored).items() if k not in old_keys}
    assert len(new) == 4
    np.testing.assert_allclose([p for p, *_ in new.values()], 7.0 + 1e-6)
    # Windows written after the restore never reach back into the old writer's steps.
    assert {t for _, t, _, _ in new.values()} == {(3, 4), (4, 5)}


def test_restore_into_a_used_backend_drops_later_items(make, tmp_path):
    buffer = make(cls=ReverbUniformReplay)
    _fill(buffer, 0, 4)
    checkpoint = tf.train.Checkpoint(replay=buffer.checkpoint_items())
    path = checkpoint.save(str(tmp_path / 'ckpt'))
    saved = _table(buffer)
    buffer.sample(4, 2)  # a cached iterator on the old server
    _fill(buffer, 4, 9)
    checkpoint.restore(path).assert_consumed()
    assert _table(buffer) == saved
    window, _ = buffer.sample(4, 2)  # a new iterator on the restarted server
    assert window['t'].numpy().max() <= 3


def test_only_the_last_two_reverb_checkpoints_are_kept(make, tmp_path):
    replay_dir = tmp_path / 'replay'
    buffer = make(cls=ReverbUniformReplay, checkpoint_dir=str(replay_dir))
    checkpoint = tf.train.Checkpoint(replay=buffer.checkpoint_items())
    # TF keeps every checkpoint here, so the oldest can only fail on its pruned replay.
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path / 'ckpt'), max_to_keep=None)
    paths = []
    for t in range(4):
        _fill(buffer, 2 * t, 2 * t + 2)
        paths.append(manager.save())
    assert sorted(os.listdir(replay_dir)) == ['ckpt-000003', 'ckpt-000004', 'server']
    assert os.listdir(replay_dir / 'server') == []  # Reverb's root stays empty
    restored = make(cls=ReverbUniformReplay, checkpoint_dir=str(replay_dir))
    restoring = tf.train.Checkpoint(replay=restored.checkpoint_items())
    restoring.restore(paths[2]).assert_consumed()
    assert restored.metrics()['windows'] == 10  # 6 steps: 5 windows per copy
    with pytest.raises(UserError, match='Reverb checkpoint is missing'):
        restoring.restore(paths[0])


def test_checkpoint_found_after_the_run_directory_moved(make, tmp_path):
    buffer = make(cls=ReverbUniformReplay, checkpoint_dir=str(tmp_path / 'a' / 'replay'))
    _fill(buffer, 0, 3)
    path = tf.train.Checkpoint(replay=buffer.checkpoint_items()).save(
        str(tmp_path / 'a' / 'ckpt'))
    buffer.close()
    os.rename(tmp_path / 'a', tmp_path / 'b')
    restored = make(cls=ReverbUniformReplay, checkpoint_dir=str(tmp_path / 'b' / 'replay'))
    tf.train.Checkpoint(replay=restored.checkpoint_items()).restore(
        path.replace(str(tmp_path / 'a'), str(tmp_path / 'b'))).assert_consumed()
    assert restored.metrics()['windows'] == 4


def test_fifo_eviction_follows_insertion_order_across_copies(make):
    buffer = make(cls=ReverbUniformReplay, capacity=8, num_envs=4, flush_every=1000)
    for t in range(10):
        buffer.add(_step(t, num_envs=4))
    window, _ = buffer.sample(512, 2)
    # 8 windows kept: the last 2 of each of the 4 copies (starts 7 and 8).
    kept = set(zip(window['t'].numpy()[:, 0], window['env'].numpy()[:, 0]))
    assert kept == {(t, e) for t in (7, 8) for e in range(4)}


def test_pending_items_stay_bounded(make):
    buffer = make(cls=ReverbUniformReplay, capacity=4000, num_envs=8, flush_every=32)
    worst = 0
    for t in range(120):
        buffer.add(_step(t, num_envs=8))
        worst = max(worst, buffer.pending_items())
    assert worst <= 2 * 32 + 8
    assert buffer.metrics()['items_inserted'] == 119 * 8


def test_add_inside_a_traced_collect_loop(make):
    buffer = make(cls=ReverbUniformReplay)

    @tf.function(input_signature=[tf.TensorSpec([], tf.int64)])
    def collect(steps):
        for t in tf.range(steps):
            env = tf.range(NUM_ENVS, dtype=tf.int64)
            buffer.add({'obs': tf.cast(tf.tile((t * 10 + env)[:, None], [1, 3]), tf.float32),
                        't': tf.fill([NUM_ENVS], t), 'env': env})
        return steps

    collect(tf.constant(6, tf.int64))
    window, _ = buffer.sample(256, 2)
    t, env = window['t'].numpy(), window['env'].numpy()
    np.testing.assert_array_equal(np.diff(t, axis=1), 1)
    np.testing.assert_allclose(window['obs'].numpy()[..., 0], t * 10 + env)
    assert buffer.metrics()['windows'] == 10 and buffer.metrics()['size'] == 12


def test_priorities_skew_sampling_with_reported_probabilities(make):
    buffer = make(alpha=1.0, priority_epsilon=0.0)
    _fill(buffer, 0, 3)  # 4 windows
    keys = list(_table(buffer))
    buffer.update_priorities(tf.constant(np.array(keys, np.uint64).view(np.int64)),
                             tf.constant([1.0, 1.0, 1.0, 5.0]))
    _, info = buffer.sample(2000, 2)  # a new iterator: no sample predates the update
    heavy = info.keys.numpy() == np.array(keys[3], np.uint64).view(np.int64)
    assert 0.55 < heavy.mean() < 0.70  # 5/8 of the mass
    np.testing.assert_allclose(info.probabilities.numpy()[heavy], 5 / 8, rtol=1e-6)


def test_ages_and_histograms_describe_recent_samples(make):
    buffer = make()
    _fill(buffer, 0, 5)
    _, info = buffer.sample(64, 2)
    ages = buffer.ages(info.keys.numpy())
    # age = transitions inserted (10) - first-step id (t * 2 + env) for starts t = 0..3
    assert set(ages) <= {10 - (2 * t + e) for t in range(4) for e in range(2)}
    assert np.isnan(buffer.ages(np.array([12345]))).all()
    assert buffer.histograms()['sampled_priority'].shape == (64,)
    assert ReverbUniformReplay.histograms(buffer) == {}


def test_trajectory_spec_round_trips_with_its_own_type(make):
    spec = trajectory_lib.Trajectory(
        step_type=tf.TensorSpec([], tf.int32), observation=tf.TensorSpec([4], tf.float32),
        action=tensor_spec.BoundedTensorSpec([], tf.int64, 0, 1), policy_info=(),
        next_step_type=tf.TensorSpec([], tf.int32), reward=tf.TensorSpec([], tf.float32),
        discount=tf.TensorSpec([], tf.float32))
    buffer = make(spec=spec)
    zeros = tf.nest.map_structure(lambda s: tf.zeros([NUM_ENVS, *s.shape], s.dtype), spec)
    for _ in range(3):
        buffer.add(zeros)
    window, _ = buffer.sample(4, 2)
    assert type(window) is trajectory_lib.Trajectory and window.policy_info == ()
    assert window.observation.shape == (4, 2, 4)


def test_external_server_is_used_and_checked(make):
    owner = make(cls=ReverbUniformReplay)
    actor = make(cls=ReverbUniformReplay, server_address=owner.server_address)
    _fill(actor, 0, 3)
    actor.metrics()  # flushes
    # Half of the 4 windows end at t=2: 64 draws all missing them has chance 2**-64
    # (8 draws failed once in CI, chance 1/256).
    assert owner.sample(64, 2)[0]['t'].numpy().max() == 2
    actor.close()
    assert owner.metrics()['windows'] == 4  # closing a client leaves the server running
    with pytest.raises(UserError, match="no table 'other'"):
        make(cls=ReverbUniformReplay, server_address=owner.server_address, table_name='other')
    with pytest.raises(UserError, match='another agent or num_steps'):
        make(cls=ReverbUniformReplay, server_address=owner.server_address, num_steps=3)


def test_user_errors(make):
    buffer = make(cls=ReverbUniformReplay)
    with pytest.raises(UserError, match='empty Reverb table'):
        buffer.sample(4, 2)
    with pytest.raises(UserError, match='num_steps=3'):
        buffer.sample(4, 3)
    with pytest.raises(UserError, match='alpha'):
        make(alpha=-1.0)
    buffer.close()
    buffer.close()


@pytest.mark.parametrize('name, backend', [('reverb_uniform', 'ReverbUniformReplay'),
                                           ('reverb_prioritized', 'ReverbPrioritizedReplay')])
def test_gin_configs_bind_the_backends(name, backend):
    import app.registry  # noqa: F401  (registers the configurables)

    with gin.unlock_config():
        gin.clear_config()
        try:
            gin.parse_config_file(f'configs/buffers/{name}.gin')
            assert gin.query_parameter('run.replay_backend').selector == backend
        finally:
            gin.clear_config()


def _signature(buffer):
    return reverb.Client(buffer.server_address).server_info()[buffer.table_name].signature


def test_packed_columns_round_trip_every_dtype(make):
    """Small leaves share one byte column; what comes back is bit-for-bit what went in."""
    spec = {
        'flag': tf.TensorSpec([], tf.bool),
        'small': tf.TensorSpec([2], tf.int8),
        'wide': tf.TensorSpec([3], tf.float64),
        'code': tf.TensorSpec([], tf.uint16),
        'frame': tf.TensorSpec([8, 8, 4], tf.uint8),  # 256 bytes: a column of its own
        't': tf.TensorSpec([], tf.int64),
    }
    buffer = make(cls=ReverbUniformReplay, spec=spec)
    assert len(_signature(buffer)) == 2  # the frame, and every other leaf packed

    def step(t):
        env = np.arange(NUM_ENVS)
        return {'flag': tf.constant((t + env) % 2 == 0),
                'small': tf.constant(np.stack([[-t, t + e] for e in env]).astype(np.int8)),
                'wide': tf.constant(np.stack([[t + 0.1, -1e300, e] for e in env])),
                'code': tf.constant((60000 + t + env).astype(np.uint16)),
                'frame': tf.constant(np.stack([np.full([8, 8, 4], 10 * t + e, np.uint8)
                                               for e in env])),
                't': tf.constant(np.full(NUM_ENVS, t, np.int64))}

    for t in range(5):
        buffer.add(step(t))
    window, _ = buffer.sample(64, 2)
    t, env = window['t'].numpy(), window['frame'].numpy()[:, :, 0, 0, 0] % 10
    np.testing.assert_array_equal(np.diff(t, axis=1), 1)
    for b in range(64):
        for i in range(2):
            expected = step(int(t[b, i]))
            for name, value in window.items():
                np.testing.assert_array_equal(value.numpy()[b, i], expected[name][env[b, i]])


def test_chunk_length_is_validated_and_used(make):
    with pytest.raises(UserError, match='chunk_length'):
        make(cls=ReverbUniformReplay, chunk_length=3)
    buffer = make(cls=ReverbUniformReplay, chunk_length=1)
    _fill(buffer, 0, 4)
    window, _ = buffer.sample(16, 2)
    np.testing.assert_array_equal(np.diff(window['t'].numpy(), axis=1), 1)
