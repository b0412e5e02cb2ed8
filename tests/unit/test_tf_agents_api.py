"""buffers/tf_agents_api.py beyond TF-Agents' own suites: prioritized replay, XLA, checkpoints,
refused arguments, and TF-Agents' RLDS push into our backends."""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.replay_buffers import rlds_to_reverb
from tf_agents.specs import tensor_spec

from buffers.reverb_replay import ReverbUniformReplay
from buffers.tf_agents_api import PrioritizedReplayBuffer, TrajectoryObserver, UniformReplayBuffer
from buffers.uniform import UniformReplay
from rlds_io.files import Dataset, write_dataset
from tests.unit.test_datasets import _collect_cartpole

SPEC = tensor_spec.TensorSpec([], tf.int64, 'step')


def _filled(buffer_class, num_adds=10, batch_size=2, **kwargs):
    buffer = buffer_class(SPEC, batch_size=batch_size, max_length=16, seed=3, **kwargs)
    for i in range(num_adds):
        buffer.add_batch(tf.constant([100 * env + i for env in range(batch_size)], tf.int64))
    return buffer


def test_prioritized_buffer_samples_by_priority_and_ignores_stale_ids():
    buffer = _filled(PrioritizedReplayBuffer, alpha=1.0, priority_epsilon=0.0)
    _, info = buffer.get_next(sample_batch_size=64, num_steps=2)
    assert info.ids.shape == (64,) and info.probabilities.shape == (64,)
    # Every window to priority 1 except one to 99: it then holds 99 / (17 + 99) of the mass.
    ids = np.unique(info.ids.numpy())
    buffer.update_priorities(ids, np.ones(len(ids)))
    favourite = ids[0]
    buffer.update_priorities([favourite], [99.0])
    items, info = buffer.get_next(sample_batch_size=4000, num_steps=2)
    share = np.mean(info.ids.numpy() == favourite)
    total = 99.0 + (len(ids) - 1)
    assert abs(share - 99.0 / total) < 0.05, share
    np.testing.assert_allclose(info.probabilities.numpy()[info.ids.numpy() == favourite],
                               99.0 / total, rtol=1e-5)
    assert (items[:, 1] == items[:, 0] + 1).numpy().all()  # windows of consecutive steps
    # After the ring wraps, the old ids are stale: updating them changes nothing.
    for i in range(10, 40):
        buffer.add_batch(tf.constant([i, 100 + i], tf.int64))
    before = buffer.backend.priorities(tf.constant(ids)).numpy()
    buffer.update_priorities(ids, np.full(len(ids), 1e6))
    np.testing.assert_array_equal(buffer.backend.priorities(tf.constant(ids)).numpy(), before)


def test_sampling_compiles_with_xla_and_matches_the_stored_steps():
    buffer = _filled(UniformReplayBuffer)

    @tf.function(jit_compile=True)
    def sample():
        return buffer.get_next(sample_batch_size=32, num_steps=3)

    items, info = sample()
    items = items.numpy()
    assert items.shape == (32, 3)
    assert ((items[:, 1:] - items[:, :-1]) == 1).all()
    assert np.isin(items % 100, np.arange(10)).all()
    np.testing.assert_allclose(info.probabilities.numpy(), 1 / (8 * 2))


def test_checkpoint_restores_contents_and_clear_forgets_them(tmp_path):
    buffer = _filled(PrioritizedReplayBuffer)
    before = buffer.gather_all().numpy()
    path = tf.train.Checkpoint(replay_buffer=buffer).save(str(tmp_path / 'rb'))
    buffer.clear()
    assert buffer.num_frames().numpy() == 0 and buffer.gather_all().shape == (2, 0)
    tf.train.Checkpoint(replay_buffer=buffer).restore(path).assert_consumed()
    np.testing.assert_array_equal(buffer.gather_all().numpy(), before)


def test_arguments_that_cannot_take_effect_are_refused():
    with pytest.raises(ValueError, match='table_fn cannot take effect'):
        UniformReplayBuffer(SPEC, batch_size=1, table_fn=lambda spec, capacity: None)
    with pytest.raises(NotImplementedError, match='sequence_preprocess_fn'):
        _filled(UniformReplayBuffer).as_dataset(sequence_preprocess_fn=lambda x: x)


def test_unseeded_buffers_follow_tf_global_seed():
    def draws():
        tf.random.set_seed(7)
        buffer = UniformReplayBuffer(SPEC, batch_size=1, max_length=50)
        for i in range(50):
            buffer.add_batch(tf.constant([i], tf.int64))
        return buffer.get_next(sample_batch_size=16)[0].numpy()

    np.testing.assert_array_equal(draws(), draws())


@pytest.fixture(scope='module')
def cartpole_rlds(tmp_path_factory):
    env, _, episodes = _collect_cartpole(300)
    path = str(tmp_path_factory.mktemp('rlds') / 'cartpole')
    write_dataset(path, episodes, observation_spec=env.observation_spec(),
                  action_spec=env.action_spec(), metadata={'kind': 'random'})
    return Dataset(path), episodes


@pytest.mark.parametrize('backend_class', [UniformReplay, ReverbUniformReplay])
def test_tf_agents_push_rlds_to_reverb_fills_our_backends(cartpole_rlds, backend_class):
    dataset, episodes = cartpole_rlds
    spec = rlds_to_reverb.create_trajectory_data_spec(dataset.episodes())
    num_steps = sum(len(e['reward']) for e in episodes)
    backend = backend_class(spec, capacity=num_steps, num_envs=1, batch_size=64, num_steps=2)
    try:
        observer = TrajectoryObserver(backend)
        pushed = rlds_to_reverb.push_rlds_to_reverb(dataset.episodes(), observer)
        observer.flush()
        assert pushed == num_steps
        window, _ = backend.sample(64, 2)
        stream = np.concatenate([e['observation'] for e in episodes])
        position = {tuple(obs): i for i, obs in enumerate(stream)}
        first = [position[tuple(o)] for o in window.observation[:, 0].numpy()]
        second = [position[tuple(o)] for o in window.observation[:, 1].numpy()]
        assert np.array_equal(np.array(second), np.array(first) + 1)  # consecutive steps
    finally:
        backend.close()


def test_deterministic_pass_reads_each_copy_in_order_after_the_ring_wraps():
    # TF-Agents' own class returns [2, 103, 104, 102, 3, 4] here: it indexes id % capacity.
    buffer = UniformReplayBuffer(SPEC, batch_size=2, max_length=3)
    for i in range(5):
        buffer.add_batch(tf.constant([i, 100 + i], tf.int64))
    items = [int(item) for item, _ in buffer.as_dataset(single_deterministic_pass=True)]
    assert items == [2, 3, 4, 102, 103, 104]
    windows = [w.numpy().tolist() for w, _ in buffer.as_dataset(
        sample_batch_size=2, num_steps=2, single_deterministic_pass=True)]
    assert windows == [[[2, 3], [102, 103]]]
