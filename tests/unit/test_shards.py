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
    assert sharded.wait_for_updates() and sharded.dropped_updates() == [0, 0]
    # Routed: each shard's own table now holds exactly these priorities for its keys.
    for index, owner in enumerate(owners):
        stored = _stored_priorities(owner)
        mine = {int(key): priority[t] for t, (shard, key) in seen.items() if shard == index}
        assert stored == pytest.approx(mine)
    # Each shard's mass is learnt from the windows drawn from it, so the first groups after a
    # priority update still mix with a shard's old mass until a window of it is drawn: skip
    # 10 batches (40 groups; a shard holding 25% of the mass is drawn in them but for ~1e-5).
    rows = _draw(sharded, 310)[10 * BATCH:]
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
    assert np.isnan(sharded.latencies_ms[0]) and 0 < sharded.latencies_ms[1] < 1000
    starts = set(_window_starts()[1])
    rows = _draw(sharded, 5)
    assert {row[0] for row in rows} <= starts and {row[1] for row in rows} == {1}



def test_a_dead_shard_is_asked_again_only_once_its_port_accepts_connections(shards):
    """The learner refreshes every 2 s; a Reverb call to a gone server waits its whole
    deadline, so a dead shard is asked once, then only when its port listens again."""
    sharded, owners = shards(ReverbUniformReplay)
    dead = sharded.shards[0]
    calls = []
    ask = dead.table_info
    dead.table_info = lambda timeout_s: calls.append(timeout_s) or ask(timeout_s)
    owners[0].close()
    for _ in range(3):
        assert sharded.refresh()[0] is None
    assert len(calls) == 1  # the refresh that found it down

def test_shards_must_share_one_class():
    with pytest.raises(UserError, match='at least one shard'):
        ShardedReplay([])


def test_writers_keep_shards_balanced_and_stay_put_and_local_within_the_tolerance():
    # Balanced: the least-filled shard wins.
    assert choose_shard([100, 50, 80]) == 1
    # A local shard is preferred while it is within 1% of the mean above the least-filled...
    local = [True, False, False]
    assert choose_shard([1000, 995, 1005], local) == 0
    # ...and left for a remote one once it has run ahead.
    assert choose_shard([1100, 990, 1010], local) == 1
    # The current shard is kept while it is within the tolerance (a switch costs a stream).
    assert choose_shard([1000, 995, 1005], local, current=2) == 2
    assert choose_shard([1000, 990, 1100], local, current=2) == 0
    # Down shards (None) are skipped; all down is one clear error.
    assert choose_shard([None, 500, 400], local, current=0) == 2
    with pytest.raises(UserError, match='Every replay shard is down'):
        choose_shard([None, None])


@pytest.mark.parametrize('num_shards', [2, 4])
def test_a_slow_writer_does_not_unbalance_the_shards(num_shards):
    """Four writers, one 3x slower; each re-chooses its shard after every 64 windows it writes
    (as a collector does at each weight pull), from the shards' counts and how fast each grew
    since its previous choice. Decisions come in 64-window steps, so the 10% is checked once
    every shard holds 2,000 windows (a run's first minute or so)."""
    rng = np.random.default_rng(0)
    inserted = [0] * num_shards
    speeds = [1.0, 1.0, 1.0, 1 / 3]
    written = [0] * len(speeds)
    chosen = [choose_shard(inserted, offset=writer) for writer in range(len(speeds))]
    assert len(set(chosen)) == min(num_shards, len(speeds))  # writers starting together spread
    seen = [(list(inserted), 0)] * len(speeds)  # each writer's last reading
    worst = 0.0
    for tick in range(1, 40000):
        for writer, speed in enumerate(speeds):
            if rng.random() < speed:
                inserted[chosen[writer]] += 1
                written[writer] += 1
                if written[writer] % 64 == 0:
                    before, then = seen[writer]
                    rates = [(now - old) / (tick - then) for now, old in zip(inserted, before)]
                    chosen[writer] = choose_shard(inserted, current=chosen[writer], rates=rates,
                                                  offset=writer)
                    seen[writer] = (list(inserted), tick)
        if sum(inserted) > 2000 * num_shards:
            worst = max(worst, max(inserted) / min(inserted) - 1)
    assert worst <= 0.10, worst
    assert max(inserted) <= 1.03 * min(inserted), inserted


def test_a_writer_moving_shards_loses_no_window(shards):
    _, owners = shards(ReverbUniformReplay)
    before = [owner.metrics()['windows'] for owner in owners]
    writer = ReverbUniformReplay(SPEC, capacity=1000, num_envs=1, batch_size=1, num_steps=2,
                                 server_address=owners[0].server_address)
    try:
        for t in range(1000, 1005):
            writer.add({'t': tf.constant([t], tf.int64)})
        writer.retarget(owners[1].server_address)
        for t in range(1005, 1010):
            writer.add({'t': tf.constant([t], tf.int64)})
        writer.metrics()  # flushes
    finally:
        writer.close()
    added = [owner.metrics()['windows'] - count for owner, count in zip(owners, before)]
    # Steps 1000..1004 make 4 windows on shard 0; the window (1004, 1005) spanning the move
    # and the 4 after it are on shard 1: 9 windows from 10 steps, as on one server.
    assert added == [4, 5]
    starts = {int(t) for t, shard, _, _ in _draw(ShardedReplay([owners[1]]), 40) if t >= 1000}
    assert starts == {1004, 1005, 1006, 1007, 1008}
