"""Prioritized replay: the uniform ring plus a sum tree of priorities in TF variables.

TF-Agents ships no in-process prioritized buffer (only Reverb's, which XLA
cannot compile), so this one keeps the exact storage of `UniformReplay` and adds
a sum tree held in one flat `tf.Variable`. Every operation is vectorised over
the batch and loops only over the `log2(capacity)` tree levels in Python, so
`add`, `sample` and `update_priorities` trace to a fixed graph of gathers and
scatters that XLA compiles, and the fused collect-and-train loop stays jitted.

Keys. A sampled window's key is the absolute id of its first step,
`key = step * num_envs + env`, where `step` counts `add` calls since the buffer
was created -- the same keys `UniformReplay` returns. Unlike a row index, an
absolute id says whether its row still holds that step: a key is stale once
`step < num_adds - rows_per_env` (the row was overwritten), and
`update_priorities` ignores it instead of re-prioritising the new occupant.

Valid starts. The tree holds the priority of every stored row, including the
newest ones, because the window length is an argument of `sample`, not of the
buffer. `sample` instead restricts the draw to the cyclic range of rows whose
`num_steps` window lies wholly inside the stored steps (oldest step up to
`num_adds - num_steps`): it maps the uniform draws onto that range's prefix-sum
interval of the tree, so the newest `num_steps - 1` steps of each env copy (and
rows never written) have probability exactly 0.
"""

import gin
import tensorflow as tf

from buffers.base import Capabilities, SampleInfo, check_priority_settings
from buffers.uniform import UniformReplay
from core.errors import UserError


@gin.configurable
class PrioritizedReplay(UniformReplay):
    """In-process proportional prioritized replay (Schaul et al., 2016).

    A window starting at row `i` is drawn with probability `q_i / sum_j q_j`
    over valid starts `j`, where `q = (p + priority_epsilon) ** alpha` is the
    stored priority of the last `p` given for that key. New steps are stored at
    the max-priority variable, the largest `q` ever stored and at least 1.0, so every
    transition is replayed at least once with high probability before its
    TD error is known.

    Sampling is stratified: the valid mass is cut into `batch_size` equal
    segments and one window is drawn from each, which lowers the variance of
    the batch composition. Batch position `j` comes from segment `j`, so a
    batch is ordered by cumulative mass (row order from the oldest step); a
    mean loss does not care, and skipping a shuffle saves a sort per batch.
    """

    # Its own `add` (priorities with every row) and sampling (the sum tree, which a
    # concurrent writer would change under a draw): no bulk steps, no concurrent writes.
    capabilities = Capabilities(xla=True, priorities=True)

    def __init__(self, data_spec, *, capacity, num_envs=1, batch_size=1, num_steps=2, seed=0,
                 alpha=0.6, priority_epsilon=1e-6, name='prioritized_replay'):
        """Allocates storage for `capacity` transitions and their sum tree.

        Args:
          data_spec: nest of `tf.TensorSpec`, normally `agent.collect_data_spec`.
          capacity: transitions kept, summed over env copies.
          num_envs: batch size of every `add` call.
          batch_size: the learner's batch size (validated against capacity).
          num_steps: the learner's window length (validated against capacity).
          seed: seeds the sampling RNG, which is checkpointed with the buffer.
          alpha: how strongly priorities skew sampling; 0 is uniform.
          priority_epsilon: added to every priority so that a zero TD error
            still leaves its transition a chance to be replayed.
          name: module name.

        Raises:
          UserError: on a negative `alpha` or `priority_epsilon`, or a capacity
            that cannot hold what the learner samples.
        """
        check_priority_settings(type(self).__name__, alpha, priority_epsilon)
        super().__init__(data_spec, capacity=capacity, num_envs=num_envs, batch_size=batch_size,
                         num_steps=num_steps, seed=seed, name=name)
        self._alpha = float(alpha)
        self._epsilon = float(priority_epsilon)
        # Leaves are a power of two strictly above capacity: the tree is a
        # complete binary heap (node n has children 2n, 2n+1, root 1, leaf of
        # row r at num_leaves + r), and leaf `capacity` is a spare that is
        # always 0 -- writes for stale keys are sent there, so one batch never
        # needs a dynamic shape to drop them.
        self._num_leaves = 1 << self._capacity.bit_length()
        self._depth = self._num_leaves.bit_length() - 1
        self._spare_row = self._capacity
        # float64: prefix sums over 1e5+ leaves in float32 would misplace
        # boundary draws by a sizeable fraction of one item's mass.
        self._tree = tf.Variable(tf.zeros([2 * self._num_leaves], tf.float64), trainable=False,
                                 name='sum_tree')
        self._max_priority = tf.Variable(1.0, dtype=tf.float64, trainable=False,
                                         name='max_priority')

    @property
    def alpha(self):
        return self._alpha

    def add(self, trajectory):
        """Writes one batched step and gives its rows the current max priority.

        The rows' old priorities (of the overwritten step) are replaced in the
        same call, so the tree never holds mass for evicted data.
        """
        slot = self._num_adds % self._rows_per_env
        leaves = self._new_leaves(trajectory)
        super().add(trajectory)
        rows = slot * self._num_envs + tf.range(self._num_envs, dtype=tf.int64)
        self._set_leaves(rows, leaves)

    def _new_leaves(self, trajectory):
        """The stored priority of each env copy's new row: the max priority, so every window
        is replayed soon. Sequence replay (buffers/sequence.py) gives 0 to rows that start
        no sequence."""
        del trajectory
        return tf.fill([self._num_envs], self._max_priority.read_value())

    def sample(self, batch_size, num_steps):
        """Draws `batch_size` windows of `num_steps` steps in proportion to priority.

        Returns:
          `(window, SampleInfo)`: the nest `[batch_size, num_steps, ...]`, the
          int64 keys (absolute id of each window's first step) and the float32
          probability each window had of being drawn, `q_i / sum_valid q`.
          Before `num_steps` steps are stored no window is valid; the draw then
          falls back to the oldest step (as `UniformReplay` does) with
          probabilities that are not meaningful.
        """
        if num_steps > self._rows_per_env:
            raise UserError(
                f"cannot sample {num_steps}-step windows from a buffer keeping "
                f"{self._rows_per_env} steps per env copy: raise the capacity.")
        rows_per_env, num_envs, capacity = self._rows_per_env, self._num_envs, self._capacity
        tree = self._tree.read_value()
        num_adds = self._num_adds.read_value()
        oldest = tf.maximum(num_adds - rows_per_env, 0)
        num_starts = tf.maximum(tf.minimum(num_adds, rows_per_env) - num_steps + 1, 1)
        # Valid starts are the cyclic row range [lo, lo + span) modulo capacity.
        lo = (oldest % rows_per_env) * num_envs
        span = num_starts * num_envs
        wraps = lo + span > capacity
        hi = tf.where(wraps, lo + span - capacity, lo + span)
        prefix = self._prefix_sums(tree, tf.stack([lo, hi]))
        total = tree[1]
        mass = prefix[1] - prefix[0] + tf.where(wraps, total, tf.zeros_like(total))

        strata = tf.range(batch_size, dtype=tf.float64)
        fraction = (strata + self._rng.uniform([batch_size], dtype=tf.float64)) / batch_size
        target = prefix[0] + fraction * mass
        target = tf.where(target >= total, target - total, target)
        row = self._find_rows(tree, target)
        # Rounding can only push a draw just past either end of the valid range;
        # send it back to the end it came from, so invalid starts stay impossible.
        row = tf.minimum(row, capacity - 1)
        offset = (row - lo) % capacity
        row = tf.where(offset < span, row,
                       tf.where(fraction < 0.5, lo, (lo + span - 1) % capacity))
        # Where leaves may be 0 inside the range (sequence replay: rows that start no
        # sequence), an end row may be one: it goes to the row holding the middle of the mass.
        empty = tf.gather(tree, row + self._num_leaves) <= 0
        middle = prefix[0] + 0.5 * mass
        middle = self._find_rows(tree, tf.where(middle >= total, middle - total, middle))
        row = tf.where(empty, tf.broadcast_to(tf.minimum(middle, capacity - 1), tf.shape(row)),
                       row)

        slot, env = row // num_envs, row % num_envs
        start = oldest + (slot - oldest % rows_per_env) % rows_per_env
        window = self._gather_windows(start, env, num_steps)
        self._num_sampled.assign_add(batch_size)
        priority = tf.gather(tree, row + self._num_leaves)
        probabilities = tf.math.divide_no_nan(priority, mass)
        info = SampleInfo(keys=start * num_envs + env,
                          probabilities=tf.cast(probabilities, tf.float32))
        return window, info

    def update_priorities(self, keys, priorities):
        """Sets the priorities of sampled windows from their new TD errors.

        Args:
          keys: int [B], keys from `SampleInfo.keys`.
          priorities: float [B], non-negative raw priorities `p` (|TD error|);
            stored as `(p + priority_epsilon) ** alpha`.

        Keys whose step was overwritten since sampling (or never stored) are
        ignored, and so are negative or non-finite priorities, so that one bad
        batch cannot poison the tree's sums. When a key appears more than once
        in a batch its largest priority wins: that is deterministic on every
        device, unlike an ordered scatter.
        """
        keys = tf.reshape(tf.cast(keys, tf.int64), [-1])
        priorities = tf.reshape(tf.cast(priorities, tf.float64), [-1])
        num_adds = self._num_adds.read_value()
        oldest = tf.maximum(num_adds - self._rows_per_env, 0)
        step, env = keys // self._num_envs, keys % self._num_envs
        fresh = ((keys >= 0) & (step >= oldest) & (step < num_adds)
                 & tf.math.is_finite(priorities) & (priorities >= 0))
        safe = tf.where(fresh, priorities, tf.zeros_like(priorities))
        stored = tf.where(fresh, tf.pow(safe + self._epsilon, self._alpha), tf.zeros_like(safe))
        rows = tf.where(fresh, (step % self._rows_per_env) * self._num_envs + env,
                        tf.fill(tf.shape(keys), tf.constant(self._spare_row, tf.int64)))
        # Zero then scatter-max: duplicate keys resolve to their max priority.
        leaves = rows + self._num_leaves
        self._tree.scatter_update(tf.IndexedSlices(tf.zeros_like(stored), leaves))
        self._tree.scatter_max(tf.IndexedSlices(stored, leaves))
        self._propagate(leaves)
        self._max_priority.assign(tf.maximum(self._max_priority, tf.reduce_max(stored)))

    def clear(self, zero_storage=False):
        """Forgets every stored step and its priority; new steps start again at priority 1."""
        super().clear(zero_storage)
        self._tree.assign(tf.zeros_like(self._tree))
        self._max_priority.assign(1.0)

    def priorities(self, keys):
        """Stored priorities `q` of `keys` (0 for stale keys); for tests and debugging."""
        keys = tf.cast(keys, tf.int64)
        num_adds = self._num_adds.read_value()
        step, env = keys // self._num_envs, keys % self._num_envs
        fresh = (keys >= 0) & (step >= tf.maximum(num_adds - self._rows_per_env, 0)) & (
            step < num_adds)
        rows = tf.where(fresh, (step % self._rows_per_env) * self._num_envs + env,
                        tf.fill(tf.shape(keys), tf.constant(self._spare_row, tf.int64)))
        return tf.gather(self._tree, rows + self._num_leaves)

    def metrics(self):
        """Uniform's metrics plus the mean and max stored priority `q` of live rows."""
        metrics = super().metrics()
        leaves = self._tree[self._num_leaves:self._num_leaves + self._capacity]
        size = metrics['size']
        metrics['priority_mean'] = float(self._tree[1].numpy()) / size if size else 0.0
        metrics['priority_max'] = float(tf.reduce_max(leaves).numpy())
        return metrics

    def histograms(self):
        """The stored priorities `q` of live rows."""
        size = int(self.size().numpy())
        leaves = self._tree[self._num_leaves:self._num_leaves + self._capacity]
        return {'priority': leaves.numpy()[:size]}

    def checkpoint_items(self):
        """Uniform's items plus the sum tree and max priority: restores replay identically."""
        return {
            **super().checkpoint_items(),
            'sum_tree': self._tree,
            'max_priority': self._max_priority,
        }

    def _set_leaves(self, rows, values):
        """Writes leaf values for unique `rows` and refreshes their ancestors."""
        leaves = rows + self._num_leaves
        self._tree.scatter_update(tf.IndexedSlices(tf.cast(values, tf.float64), leaves))
        self._propagate(leaves)

    def _propagate(self, nodes):
        """Recomputes every ancestor of `nodes` as the sum of its two children.

        Recomputing (instead of adding deltas) keeps sums exact to one rounding
        per level and never drifts. Duplicate nodes write identical values.
        """
        for _ in range(self._depth):
            nodes = nodes // 2
            sums = tf.gather(self._tree, 2 * nodes) + tf.gather(self._tree, 2 * nodes + 1)
            self._tree.scatter_update(tf.IndexedSlices(sums, nodes))

    def _prefix_sums(self, tree, rows):
        """Sum of the leaves left of each row: the left siblings on its root path."""
        nodes = rows + self._num_leaves
        total = tf.zeros(tf.shape(rows), tf.float64)
        for _ in range(self._depth):
            left_sibling = tf.gather(tree, nodes - 1)
            total += tf.where(nodes % 2 == 1, left_sibling, tf.zeros_like(left_sibling))
            nodes = nodes // 2
        return total

    def _find_rows(self, tree, target):
        """Descends the tree: the row whose cumulative-mass interval holds `target`.

        A child with zero mass is never entered while its sibling has mass, so a
        draw cannot end on an empty (unwritten or spare) leaf through rounding.
        """
        nodes = tf.ones(tf.shape(target), tf.int64)
        for _ in range(self._depth):
            left = tf.gather(tree, 2 * nodes)
            right = tf.gather(tree, 2 * nodes + 1)
            go_right = (target >= left) & (right > 0)
            target = tf.where(go_right, target - left, target)
            nodes = 2 * nodes + tf.cast(go_right, tf.int64)
        return nodes - self._num_leaves
