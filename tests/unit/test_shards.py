"""Sharded replay (buffers/reverb/shards.py): sampling over shards of unequal size is what one
buffer of the same contents gives, priorities go to the shard holding the key, and writers
choose shards that stay balanced and local."""

import numpy as np
import pytest
import tensorflow as tf

from buffers.reverb.shards import ShardedReplay, choose_shard
from buffers.reverb_replay import ReverbPrioritizedReplay, ReverbUniformReplay
from core.errors import UserError

pytestmark = pytest.mark.reverb

SPEC = {'t': tf.TensorSpec([], tf.int64)}
SIZES = (30, 90)  # windows per shard: unequal on purpose
BATCH = 64


def _chi_square_ok(counts, expected):
    """A Pearson chi-square goodness-of-fit test at about p < 1e-4 (normal approximation)."""
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    df = len(counts) - 1
    return chi2 < df + 5 * np.sqrt(2 * df), (chi2, df)


@pytest.fixture
def shards():
    """Builds K in-process servers holding unequal numbers of windows, and a sharded reader."""
    made = []

    def build(cls, **kwargs):
        owners, readers = [], []
        start = 0
        for size in SIZES:
            owner = cls(SPEC, capacity=1000, num_envs=1, batch_size=1, num_steps=2, **kwargs)
            for t in range(start, start + size + 1):  # size + 1 steps: size windows
                owner.add({'t': tf.constant([t], tf.int64)})
            owner.metrics()  # flushes
            start += size + 1
            owners.append(owner)
            readers.append(cls(SPEC, capacity=1000, num_envs=1, batch_size=1, num_steps=2,
                               server_address=owner.server_address, read_only=True, **kwargs))
        sharded = ShardedReplay(readers, seed=1)
        made.extend([sharded, *owners])
        return sharded, owners

    yield build
    for thing in made:
        thing.close()


def _draw(sharded, batches):
    """(first-step t, shard, key, probability) of `batches` batches of windows."""
    rows = []
    for window, info in sharded.as_dataset(BATCH, 2).take(batches):
        keys = info.keys.numpy()
        rows.extend(zip(window['t'].numpy()[:, 0], keys[:, 0], keys[:, 1],
                        info.probabilities.numpy()))
    return rows


def _window_starts():
    """The first-step t of every stored window, shard by shard."""
    starts, start = [], 0
    for size in SIZES:
        starts.append(list(range(start, start + size)))
        start += size + 1
    return starts


def test_uniform_sampling_over_unequal_shards_is_uniform_over_all_windows(shards):
    sharded, _ = shards(ReverbUniformReplay)
    rows = _draw(sharded, 200)
    every = [t for starts in _window_starts() for t in starts]
    counts = np.array([sum(1 for row in rows if row[0] == t) for t in every], np.float64)
    ok, stats = _chi_square_ok(counts, np.full(len(every), len(rows) / len(every)))
    assert ok, stats
    # Each window's probability in the whole buffer, whichever shard it came from.
    np.testing.assert_allclose([row[3] for row in rows], 1 / sum(SIZES), rtol=1e-6)
    # Each shard supplies in proportion to its size (90 of 120 here).
    from_second = np.mean([row[1] == 1 for row in rows])
    assert abs(from_second - SIZES[1] / sum(SIZES)) < 0.02


def test_prioritized_sampling_over_shards_follows_priorities_over_all_windows(shards):
    alpha = 0.7
    sharded, owners = shards(ReverbPrioritizedReplay, alpha=alpha, priority_epsilon=0.0)
    # Learn every window's (shard, key), then give it a priority from its t, routed by key.
    seen = {}
    for t, shard, key, _ in _draw(sharded, 40):
        seen[t] = (shard, key)
    every = [t for starts in _window_starts() for t in starts]
    assert sorted(seen) == every
    priority = {t: 1.0 + (t % 7) for t in every}
    keys = np.array([seen[t] for t in every], np.int64)
    sharded.update_priorities(tf.constant(keys), tf.constant([priority[t] for t in every]))
    # Routed: each shard's own table now holds exactly these priorities for its keys.
    for index, owner in enumerate(owners):
        stored = _stored_priorities(owner)
        mine = {int(key): priority[t] for t, (shard, key) in seen.items() if shard == index}
        assert stored == pytest.approx(mine)
    rows = _draw(sharded, 300)
    mass = np.array([priority[t] ** alpha for t in every])
    counts = np.array([sum(1 for row in rows if row[0] == t) for t in every], np.float64)
    ok, stats = _chi_square_ok(counts, len(rows) * mass / mass.sum())
    assert ok, stats
    # Reported probabilities are against the whole buffer.
    for t, _, _, probability in rows[:500]:
        assert probability == pytest.approx(priority[t] ** alpha / mass.sum(), rel=1e-5)


def _stored_priorities(owner, draws=3000):
    """{key: priority} of every window in an owner's table, read through its own dataset."""
    import reverb

    dataset = reverb.TrajectoryDataset.from_table_signature(
        owner.server_address, owner.table_name, max_in_flight_samples_per_worker=100,
        rate_limiter_timeout_ms=1000, max_samples=draws)
    stored = {}
    for sample in dataset.batch(draws):
        keys = tf.bitcast(sample.info.key, tf.int64).numpy()
        stored.update(zip(keys.tolist(), sample.info.priority.numpy().tolist()))
    return stored


def test_a_shard_below_its_minimum_gets_no_weight_until_it_is_ready(shards):
    sharded, owners = shards(ReverbUniformReplay)
    owners[0].close()  # shard 0 is gone: only shard 1 is sampled, and nothing waits on 0
    states = sharded.refresh()
    assert states[0] is None and states[1] == (SIZES[1], True)
    starts = set(_window_starts()[1])
    rows = _draw(sharded, 5)
    assert {row[0] for row in rows} <= starts and {row[1] for row in rows} == {1}


def test_shards_must_share_one_class():
    with pytest.raises(UserError, match='at least one shard'):
        ShardedReplay([])


def test_writers_keep_shards_balanced_and_stay_local_within_the_tolerance():
    # Balanced: the least-filled shard wins.
    assert choose_shard([100, 50, 80]) == 1
    # Local is preferred while it is within 5% of the mean above the least-filled...
    hosts = ['a', 'b', 'b']
    assert choose_shard([1000, 990, 1010], hosts, 'a') == 0
    # ...and left for a remote one once it has run ahead.
    assert choose_shard([1100, 990, 1010], hosts, 'a') == 1
    # Down shards (None) are skipped; all down is one clear error.
    assert choose_shard([None, 500, 400], hosts, 'a') == 2
    with pytest.raises(UserError, match='Every replay shard is down'):
        choose_shard([None, None])


def test_a_slow_writer_does_not_unbalance_the_shards():
    """Four writers, one 3x slower, on two shards; each re-chooses its shard after every 64
    windows it writes (as a collector does at each weight pull)."""
    rng = np.random.default_rng(0)
    inserted = [0, 0]
    speeds = [1.0, 1.0, 1.0, 1 / 3]
    written = [0] * len(speeds)
    chosen = [choose_shard(inserted, offset=writer) for writer in range(len(speeds))]
    assert sorted(chosen) == [0, 0, 1, 1]  # writers starting together spread out
    for tick in range(8000):
        for writer, speed in enumerate(speeds):
            if rng.random() < speed:
                inserted[chosen[writer]] += 1
                written[writer] += 1
                if written[writer] % 64 == 0:
                    chosen[writer] = choose_shard(inserted, offset=writer)
        # Writers switch in whole 64-window stretches (up to 3 x 64 windows can land on one
        # shard between two choices), so the 10% holds once the shards hold a few thousand.
        if sum(inserted) > 4000:
            assert max(inserted) <= 1.1 * min(inserted), (tick, inserted)
    assert max(inserted) <= 1.03 * min(inserted), inserted
