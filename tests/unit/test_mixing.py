"""Mixing two sources at a fixed ratio."""

import numpy as np
import pytest
import tensorflow as tf

from buffers.base import Capabilities
from buffers.mixing import MixedSource, split_batch
from buffers.uniform import UniformReplay
from core.errors import UserError

SPEC = {'source': tf.TensorSpec([], tf.int32)}


def _source(value, seed):
    buffer = UniformReplay(SPEC, capacity=40, num_envs=2, batch_size=4, num_steps=2, seed=seed)
    for _ in range(10):
        buffer.add({'source': tf.constant([value, value], tf.int32)})
    return buffer


def test_every_batch_holds_the_exact_ratio():
    mixed = MixedSource(_source(0, 1), _source(1, 2), fraction=0.25)
    window, info = tf.function(lambda: mixed.sample(64, 2), jit_compile=True)()
    sources = window['source'].numpy()[:, 0]
    assert sources.sum() == 16 and (sources[:48] == 0).all()
    assert info.keys.shape == (64,)
    np.testing.assert_array_equal(MixedSource.source_of_rows(64, 0.25).numpy(), sources)


def test_dataset_mixes_the_same_way():
    mixed = MixedSource(_source(0, 1), _source(1, 2), fraction=0.5)
    window, _ = next(iter(mixed.as_dataset(10, 2)))
    assert window['source'].numpy()[:, 0].tolist() == [0] * 5 + [1] * 5


def test_priority_updates_reach_each_source():
    calls = []

    class Recorder:
        capabilities = Capabilities(priorities=True)

        def __init__(self, name):
            self.name = name

        def update_priorities(self, keys, priorities):
            calls.append((self.name, keys.numpy().tolist()))

    MixedSource(Recorder('a'), Recorder('b'), fraction=0.25).update_priorities(
        tf.range(8), tf.ones([8]))
    assert calls == [('a', [0, 1, 2, 3, 4, 5]), ('b', [6, 7])]


def test_fraction_outside_unit_interval_is_refused():
    with pytest.raises(UserError, match=r'\[0, 1\]'):
        split_batch(8, 1.5)


def test_mixed_replay_writes_online_reads_both_and_counts_rows():
    from buffers.mixing import MixedReplay

    online, logged = _source(0, 1), _source(1, 2)
    mixed = MixedReplay(online, logged, logged_fraction=0.25, batch_size=8)
    mixed.add({'source': tf.constant([0, 0], tf.int32)})
    assert online.metrics()['inserted'] == 22 and logged.metrics()['inserted'] == 20
    window, info = tf.function(lambda: mixed.sample(8, 2))()
    assert window['source'].numpy()[:, 0].tolist() == [0] * 6 + [1] * 2
    # Uniform rows get probability 1 relative to their own source: IS weights of exactly 1.
    np.testing.assert_array_equal(info.probabilities.numpy(), np.ones(8))
    metrics = mixed.metrics()
    assert metrics['logged_fraction_sampled'] == 0.25 and metrics['logged_size'] == 20
    assert mixed.ages(info.keys.numpy()).shape == (6,)  # online rows only
    assert 'mixing_counters' in mixed.checkpoint_items()


def test_the_logged_fraction_counts_the_rows_each_source_really_returned():
    """A source that returns fewer rows than it was asked for (here one, always) shows in
    `logged_fraction_sampled`: the counters read the sampled parts, not the configuration."""
    from buffers.mixing import MixedReplay

    class OneRowSource:
        capabilities = Capabilities(xla=True)

        def __init__(self, source):
            self._source = source

        def sample(self, batch_size, num_steps):
            window, info = self._source.sample(batch_size, num_steps)
            return tf.nest.map_structure(lambda leaf: leaf[:1], (window, info))

        def metrics(self):
            return self._source.metrics()

    mixed = MixedReplay(_source(0, 1), OneRowSource(_source(1, 2)), logged_fraction=0.5,
                        batch_size=8)
    sample = tf.function(lambda: mixed.sample(8, 2))
    for _ in range(3):
        window, _ = sample()
        assert window['source'].numpy()[:, 0].tolist() == [0, 0, 0, 0, 1]
    metrics = mixed.metrics()
    assert metrics['logged_sampled'] == 3  # one row per batch, as drawn
    assert metrics['logged_fraction_sampled'] == pytest.approx(3 / 15)
