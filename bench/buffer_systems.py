"""The measuring side of the replay-buffer benchmark: one system and data kind per process.

`bench/buffers.py` runs this module once per (system, data kind), pinned like
every other benchmark run, and reads one JSON line back:

    taskset -c 0 .venv/bin/python -m bench.buffer_systems --system uniform --kind image [--quick]

Why a process each: image buffers hold ~2.8 GB, Reverb servers and tf.data
iterators keep threads, Reverb tables' memory is read from the process RSS,
and TF-Agents' `ReverbReplayBuffer` must be built only once per process (see
`TfaReverbSystem._open`), so every run starts from a clean interpreter.
Progress goes to stderr; the result is the last stdout line (`RESULT {json}`).

What is measured, for a vector (CartPole-like) and an image (84x84x4 uint8)
`Trajectory` as DQN's `collect_data_spec` has it, capacity 100k:

- insert rate, 1 env and 32 batched envs: our backends' `add` and TF-Agents'
  `add_batch` inside a `tf.function` loop, as the collect loop calls them;
  TF-Agents' Reverb observer (unbatched by design) from Python, one observer
  per env copy as its actors would run; the numpy ring from Python. Reverb
  inserts are timed until the server has confirmed them (a final flush).
- sample rate, batch 256 of 2-step windows: our in-process backends draw K=32
  batches in one `tf.function` (jit-compiled when `capabilities.xla`), exactly the
  learner's train chunk; our Reverb backends the same without XLA; TF-Agents'
  classes through their documented `as_dataset(...)` iterated eagerly, and
  also iterated K times inside a `tf.function`.
- latency of one batch (p50/p99), each call timed on its own.
- priority updates of 256 keys (prioritized systems), K per call as in the
  train chunk for ours; TF-Agents' `ReverbReplayBuffer.update_priorities`
  called eagerly (its documented use) and inside a `tf.function`.
- bytes per stored transition: TF variables' (or numpy arrays') total bytes /
  capacity; for Reverb and TF-Agents' episodic buffer (TensorLists, which
  have no static size) the growth of the process RSS while filling / items.
"""

import argparse
import gc
import json
import math
import os
import sys
import time

import numpy as np

CAPACITY = 100_000
BATCH_SIZE = 256
NUM_STEPS = 2
K = 32  # sample calls per train-chunk call, as a train chunk of 32 gradient steps
NUM_ENVS = 32
EPISODE_LENGTH = 200  # steps per synthetic episode, boundary item included
ALPHA = 0.6  # priority exponent: our backends' default, used for TF-Agents' table too
KINDS = ('vector', 'image')
OBS = {'vector': ((4,), 'float32'), 'image': ((84, 84, 4), 'uint8')}
POOL = {'vector': 200, 'image': 40}  # distinct observations cycled; divides EPISODE_LENGTH

# Transitions in each buffer before sampling. Reverb tables get fewer: they take
# items at a few thousand per second, and their samplers' cost does not grow
# with the table's size.
FULL = {'seconds': 1.0, 'latency_s': 1.0, 'latency_calls': (100, 500),
        'fill': {'vector': 100_000, 'image': 50_000}, 'reverb_fill': 20_000}
QUICK = {'seconds': 0.25, 'latency_s': 0.25, 'latency_calls': (20, 100),
         'fill': {'vector': 5_000, 'image': 2_000}, 'reverb_fill': 2_000}

SYSTEMS = ('numpy', 'uniform', 'tfa_uniform', 'prioritized', 'episodic', 'tfa_episodic',
           'reverb_uniform', 'tfa_reverb_uniform', 'reverb_prioritized',
           'tfa_reverb_prioritized')


def log(message):
    print(f'  [{time.strftime("%H:%M:%S")}] {message}', file=sys.stderr, flush=True)


def rss_bytes():
    """Resident memory of this process (Linux)."""
    with open('/proc/self/statm') as statm:
        return int(statm.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


# -- Data ----------------------------------------------------------------------------------------


def data_spec(kind):
    """DQN's `collect_data_spec` for a CartPole-like or an Atari-like env."""
    import tensorflow as tf
    from tf_agents.specs import tensor_spec
    from tf_agents.trajectories import trajectory

    shape, dtype = OBS[kind]
    return trajectory.Trajectory(
        step_type=tf.TensorSpec([], tf.int32, 'step_type'),
        observation=tensor_spec.BoundedTensorSpec(shape, dtype, 0, 255, 'observation'),
        action=tensor_spec.BoundedTensorSpec([], tf.int64, 0, 1, 'action'),
        policy_info=(),
        next_step_type=tf.TensorSpec([], tf.int32, 'step_type'),
        reward=tf.TensorSpec([], tf.float32, 'reward'),
        discount=tensor_spec.BoundedTensorSpec([], tf.float32, 0.0, 1.0, 'discount'))


class Stream:
    """A synthetic collect stream for `num_envs` copies, cheap to replay anywhere.

    Each copy runs episodes of EPISODE_LENGTH items (FIRST, MID..., LAST, then
    the LAST -> FIRST boundary item, as batched auto-resetting envs produce),
    staggered across copies. Observations are random (incompressible: the
    worst case for Reverb's chunk compression) and cycle through a small pool,
    so generating data costs nothing measurable. Step `i` is available as a
    batched numpy nest, per copy, and as TF ops for use inside a tf.function.
    """

    def __init__(self, kind, num_envs, seed=0):
        from tf_agents.trajectories import trajectory

        rng = np.random.default_rng(seed)
        shape, dtype = OBS[kind]
        pool = POOL[kind]
        self.num_envs = num_envs
        self.obs_bytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if dtype == 'uint8':
            obs = rng.integers(0, 256, (pool, num_envs, *shape), dtype=np.uint8)
        else:
            obs = rng.standard_normal((pool, num_envs, *shape)).astype(dtype)
        action = rng.integers(0, 2, (pool, num_envs)).astype(np.int64)
        reward = np.ones((pool, num_envs), np.float32)
        phase = (np.arange(EPISODE_LENGTH)[:, None]
                 + np.arange(num_envs)[None, :] * EPISODE_LENGTH // num_envs) % EPISODE_LENGTH
        # Item at phase p: (time step p, time step p + 1) of an episode of
        # EPISODE_LENGTH time steps; phase L-1 is the LAST -> FIRST boundary.
        step_type = np.where(phase == 0, 0, np.where(phase == EPISODE_LENGTH - 1, 2, 1))
        next_step_type = np.where(phase == EPISODE_LENGTH - 2, 2,
                                  np.where(phase == EPISODE_LENGTH - 1, 0, 1))
        step_type, next_step_type = step_type.astype(np.int32), next_step_type.astype(np.int32)
        discount = np.where(next_step_type == 2, 0.0, 1.0).astype(np.float32)
        self._arrays = (step_type, obs, action, next_step_type, reward, discount)
        self.batched = []  # one Trajectory of [num_envs, ...] arrays per phase
        self.unbatched = []  # [phase][env] -> Trajectory of one copy's arrays
        for i in range(EPISODE_LENGTH):
            j = i % pool
            step = trajectory.Trajectory(step_type[i], obs[j], action[j], (), next_step_type[i],
                                         reward[j], discount[i])
            self.batched.append(step)
            self.unbatched.append([trajectory.Trajectory(
                step.step_type[e], step.observation[e], step.action[e], (),
                step.next_step_type[e], step.reward[e], step.discount[e])
                for e in range(num_envs)])
        self._tf = None

    def tf_step(self, i):
        """The batched step `i` (an int64 tensor) as TF ops, for a tf.function."""
        import tensorflow as tf
        from tf_agents.trajectories import trajectory

        if self._tf is None:  # eager constants, captured by reference when traced
            with tf.init_scope():
                self._tf = [tf.constant(a) for a in self._arrays]
        step_type, obs, action, next_step_type, reward, discount = self._tf
        phase, j = i % EPISODE_LENGTH, i % obs.shape[0]
        return trajectory.Trajectory(tf.gather(step_type, phase), tf.gather(obs, j),
                                     tf.gather(action, j), (), tf.gather(next_step_type, phase),
                                     tf.gather(reward, j), tf.gather(discount, phase))


# -- Systems ------------------------------------------------------------------------------------
#
# Each adapter is built for one data kind and one number of env copies and offers:
#   insert(start, n): adds steps start .. start+n-1 of its stream; returns when delivered
#   read_paths(): [(label, fn, windows per call)], the first one the headline path
#   sample_once(): one batch of BATCH_SIZE windows (for latency)
#   update_paths(): [(label, fn, keys per call)], empty if not prioritized
#   memory(filled, rss_growth): (bytes per stored transition or None, how it was obtained)
#   close()


class NumpyRing:
    """A plain numpy ring buffer, the memcpy baseline: `UniformReplay`'s layout in numpy."""

    def __init__(self, spec, capacity, num_envs, seed=0):
        import tensorflow as tf

        self._rows = capacity // num_envs
        self._num_envs = num_envs
        # np.zeros maps untouched pages; filling them now (as tf.zeros does for the
        # TF buffers) keeps first-touch page faults out of the insert timing.
        self._storage = [np.full((self._rows * num_envs, *s.shape), 0, s.dtype.as_numpy_dtype)
                         for s in tf.nest.flatten(spec)]
        self._num_adds = 0
        self._rng = np.random.default_rng(seed)

    @property
    def nbytes(self):
        return sum(array.nbytes for array in self._storage)

    def add(self, leaves):
        start = (self._num_adds % self._rows) * self._num_envs
        for array, value in zip(self._storage, leaves):
            array[start:start + self._num_envs] = value
        self._num_adds += 1

    def sample(self, batch_size, num_steps):
        oldest = max(self._num_adds - self._rows, 0)
        num_starts = max(self._num_adds - num_steps + 1 - oldest, 1)
        start = oldest + self._rng.integers(0, num_starts, batch_size)
        env = self._rng.integers(0, self._num_envs, batch_size)
        steps = start[:, None] + np.arange(num_steps)[None, :]
        rows = (steps % self._rows) * self._num_envs + env[:, None]
        return [array[rows] for array in self._storage]


class NumpySystem:
    def __init__(self, kind, num_envs):
        import tensorflow as tf

        self.stream = Stream(kind, num_envs)
        self._ring = NumpyRing(data_spec(kind), CAPACITY, num_envs)
        self._flat = [tf.nest.flatten(step) for step in self.stream.batched]

    def insert(self, start, n):
        for i in range(start, start + n):
            self._ring.add(self._flat[i % EPISODE_LENGTH])

    def read_paths(self):
        def draw():
            for _ in range(K):
                self._ring.sample(BATCH_SIZE, NUM_STEPS)
        return [('K x sample, Python loop', draw, K * BATCH_SIZE)]

    def sample_once(self):
        self._ring.sample(BATCH_SIZE, NUM_STEPS)

    def update_paths(self):
        return []

    def memory(self, filled, rss_growth):
        return self._ring.nbytes / CAPACITY, 'array bytes / capacity'

    def close(self):
        self._ring = None


def _insert_function(add, stream):
    """`add` of steps start .. start+n-1 in a tf.function loop, as the collect loop calls it."""
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.int64)])
    def insert(start, n):
        for i in tf.range(start, start + n):
            add(stream.tf_step(i))
        return n
    return insert


def _k_sample_function(sample, spec, jit):
    """K draws in one tf.function: the learner's train chunk without the gradient step.

    The last batch is carried through the loop and returned, so no draw can
    be pruned as dead code, and XLA must materialise every gathered batch.
    """
    import tensorflow as tf

    def zeros():
        return tf.nest.map_structure(
            lambda s: tf.zeros([BATCH_SIZE, NUM_STEPS, *s.shape], s.dtype), spec)

    @tf.function(jit_compile=jit)
    def draw():
        batch = zeros()
        for _ in tf.range(K):
            batch = sample()
        return batch
    return draw


def _tf_variable_bytes(module):
    variables = module.variables  # TF-Agents' replay buffers make it a method
    variables = variables() if callable(variables) else variables
    return sum(v.shape.num_elements() * v.dtype.size for v in variables)


class OurSystem:
    """One of our backends through the `ReplayBackend` contract."""

    def __init__(self, backend_cls, kind, num_envs):
        import tensorflow as tf

        self.stream = Stream(kind, num_envs)
        self._spec = data_spec(kind)
        self._backend = backend_cls(self._spec, capacity=CAPACITY, num_envs=num_envs,
                                    batch_size=BATCH_SIZE, num_steps=NUM_STEPS, seed=0)
        self._jit = bool(self._backend.capabilities.xla)
        self._reverb = hasattr(self._backend, 'server_address')
        self._insert = _insert_function(self._backend.add, self.stream)
        self._tf = tf

    def insert(self, start, n):
        self._insert(self._tf.constant(start, self._tf.int64), self._tf.constant(n, self._tf.int64))
        if self._reverb:
            self._backend.metrics()  # flushes: the items are on the server

    def _sample(self):
        return self._backend.sample(BATCH_SIZE, NUM_STEPS)[0]

    def read_paths(self):
        label = 'K x sample in tf.function' + (' (XLA)' if self._jit else '')
        paths = [(label, _k_sample_function(self._sample, self._spec, self._jit), K * BATCH_SIZE)]
        if self._jit:  # the same without XLA, to tell XLA's share from the backend's
            paths.append(('K x sample in tf.function (no XLA)',
                          _k_sample_function(self._sample, self._spec, False), K * BATCH_SIZE))
        return paths

    def sample_once(self):
        if not hasattr(self, '_once'):
            self._once = self._tf.function(self._sample, jit_compile=self._jit)
        return self._once()

    def update_paths(self):
        name = type(self._backend).__name__
        if 'Prioritized' not in name:
            return []
        tf = self._tf
        keys = tf.function(lambda: self._backend.sample(BATCH_SIZE, NUM_STEPS)[1].keys)()
        priorities = tf.constant(np.random.default_rng(1).uniform(0.1, 2.0, BATCH_SIZE),
                                 tf.float32)

        @tf.function(jit_compile=self._jit)
        def update():
            for i in tf.range(K):
                self._backend.update_priorities(keys, priorities * tf.cast(i + 1, tf.float32))
            return tf.constant(0)
        label = 'K x update_priorities in tf.function' + (' (XLA)' if self._jit else '')
        return [(label, update, K * BATCH_SIZE)]

    def memory(self, filled, rss_growth):
        if self._reverb:
            return _rss_memory(filled, rss_growth)
        return _tf_variable_bytes(self._backend) / CAPACITY, 'TF variables / capacity'

    def close(self):
        self._backend.close()
        self._backend = None


def _rss_memory(filled, rss_growth):
    if filled <= 0:
        return None, 'n/a'
    return rss_growth / filled, f'RSS growth / {filled:,} items filled'


def _dataset_paths(dataset, spec):
    """TF-Agents' read path: its dataset iterated eagerly, and K times in a tf.function."""
    import tensorflow as tf

    iterator = iter(dataset)

    def eager():
        for _ in range(K):
            next(iterator)

    def sample():
        return next(iterator)[0]

    draw = _k_sample_function(sample, spec, jit=False)
    return iterator, [('as_dataset, iterated eagerly', eager, K * BATCH_SIZE),
                      ('as_dataset, K x next in tf.function', draw, K * BATCH_SIZE)], (
        lambda: tf.nest.flatten(next(iterator)))


class _TfaDatasetReader:
    """The read side shared by TF-Agents' buffers: a dataset built once, read lazily.

    Subclasses set `self._spec` and `self._paths = None` and implement `_dataset()`.
    """

    def _open(self):
        if self._paths is None:
            self._iterator, self._paths, self._once = _dataset_paths(self._dataset(), self._spec)
        return self._paths

    def read_paths(self):
        return self._open()

    def sample_once(self):
        self._open()
        return self._once()

    def update_paths(self):
        return []


class TfaUniformSystem(_TfaDatasetReader):
    """`TFUniformReplayBuffer`, read the way TF-Agents' DQN example reads it."""

    def __init__(self, kind, num_envs):
        from tf_agents.replay_buffers import tf_uniform_replay_buffer

        self.stream = Stream(kind, num_envs)
        self._spec = data_spec(kind)
        self._buffer = tf_uniform_replay_buffer.TFUniformReplayBuffer(
            self._spec, batch_size=num_envs, max_length=CAPACITY // num_envs)
        self._insert = _insert_function(self._buffer.add_batch, self.stream)
        self._paths = None

    def insert(self, start, n):
        import tensorflow as tf
        self._insert(tf.constant(start, tf.int64), tf.constant(n, tf.int64))

    def _dataset(self):
        # As dqn/examples/v2/train_eval.py builds it.
        return self._buffer.as_dataset(num_parallel_calls=3, sample_batch_size=BATCH_SIZE,
                                       num_steps=NUM_STEPS).prefetch(3)

    def memory(self, filled, rss_growth):
        return _tf_variable_bytes(self._buffer) / CAPACITY, 'TF variables / capacity'

    def close(self):
        self._iterator = self._paths = self._once = self._buffer = None


class TfaEpisodicSystem(_TfaDatasetReader):
    """TF-Agents' `EpisodicReplayBuffer` (capacity in episodes) fed by its stateful wrapper."""

    def __init__(self, kind, num_envs):
        from tf_agents.replay_buffers import episodic_replay_buffer as erb

        self.stream = Stream(kind, num_envs)
        self._spec = data_spec(kind)
        # Capacity counts episodes: 100k transitions of EPISODE_LENGTH-item episodes,
        # plus one slot per env copy for the episodes still being written.
        self.capacity_episodes = math.ceil(CAPACITY / EPISODE_LENGTH) + num_envs
        self._buffer = erb.EpisodicReplayBuffer(self._spec, capacity=self.capacity_episodes,
                                                seed=0)
        self._stateful = erb.StatefulEpisodicReplayBuffer(self._buffer, num_episodes=num_envs)
        self._insert = _insert_function(self._stateful.add_batch, self.stream)
        self._paths = None

    def insert(self, start, n):
        import tensorflow as tf
        self._insert(tf.constant(start, tf.int64), tf.constant(n, tf.int64))

    def _dataset(self):
        return self._buffer.as_dataset(sample_batch_size=BATCH_SIZE, num_steps=NUM_STEPS)

    def memory(self, filled, rss_growth):
        return _rss_memory(filled, rss_growth)

    def close(self):
        self._iterator = self._paths = self._once = self._buffer = self._stateful = None


class TfaReverbSystem(_TfaDatasetReader):
    """TF-Agents' Reverb path: a table, `ReverbAddTrajectoryObserver`s, `ReverbReplayBuffer`.

    Built as TF-Agents' Reverb examples build it (sequence_length 2, stride 1,
    Fifo remover, MinSize(1) limiter, signature with an outer time dim). The
    observer takes unbatched steps only, so N env copies get N observers (one
    writer each), as N actors would.
    """

    def __init__(self, kind, num_envs, prioritized):
        import reverb
        import tensorflow as tf
        from tf_agents.replay_buffers import reverb_replay_buffer, reverb_utils
        from tf_agents.specs import tensor_spec

        self.stream = Stream(kind, num_envs)
        self._spec = data_spec(kind)
        self._tf = tf
        table_name = 'prioritized_replay' if prioritized else 'uniform_replay'
        sampler = (reverb.selectors.Prioritized(priority_exponent=ALPHA) if prioritized
                   else reverb.selectors.Uniform())
        signature = tensor_spec.add_outer_dim(tensor_spec.from_spec(self._spec))
        table = reverb.Table(table_name, max_size=CAPACITY, sampler=sampler,
                             remover=reverb.selectors.Fifo(),
                             rate_limiter=reverb.rate_limiters.MinSize(1), signature=signature)
        self._server = reverb.Server([table], port=None)
        client = reverb.Client(f'localhost:{self._server.port}')  # what `py_client` would be
        self._observers = [reverb_utils.ReverbAddTrajectoryObserver(
            client, table_name, sequence_length=NUM_STEPS, stride_length=1)
            for _ in range(num_envs)]
        self._make_buffer = lambda: reverb_replay_buffer.ReverbReplayBuffer(
            self._spec, sequence_length=NUM_STEPS, table_name=table_name,
            local_server=self._server)
        self._prioritized = prioritized
        self._paths = None

    def insert(self, start, n):
        unbatched = self.stream.unbatched
        observers = list(enumerate(self._observers))
        for i in range(start, start + n):
            steps = unbatched[i % EPISODE_LENGTH]
            for env, observer in observers:
                observer(steps[env])
        for observer in self._observers:
            observer.flush()

    def _dataset(self):
        # Built only for reading, once per process: its TFClient has the fixed
        # shared_name 'rb_tf_client', so a second ReverbReplayBuffer in one
        # process reuses the first one's client and server (whose
        # update_priorities then hangs once that server is stopped).
        self._buffer = self._make_buffer()
        # As TF-Agents' Reverb examples read it (e.g. sac/examples/v2).
        return self._buffer.as_dataset(sample_batch_size=BATCH_SIZE,
                                       num_steps=NUM_STEPS).prefetch(50)

    def update_paths(self):
        if not self._prioritized:
            return []
        tf = self._tf
        self._open()
        # Its SampleInfo repeats each item's key per time step: [B, T] -> [B].
        keys = tf.reshape(next(self._iterator)[1].key, [BATCH_SIZE, -1])[:, 0]
        priorities = tf.constant(np.random.default_rng(1).uniform(0.1, 2.0, BATCH_SIZE),
                                 tf.float64)

        def eager():
            for i in range(K):
                self._buffer.update_priorities(keys, priorities * (i + 1))

        @tf.function
        def in_function():
            for i in tf.range(K):
                self._buffer.update_priorities(keys, priorities * tf.cast(i + 1, tf.float64))
            return tf.constant(0)
        return [('update_priorities, eager', eager, K * BATCH_SIZE),
                ('K x update_priorities in tf.function', in_function, K * BATCH_SIZE)]

    def memory(self, filled, rss_growth):
        return _rss_memory(filled, rss_growth)

    def close(self):
        self._iterator = self._paths = self._once = None
        for observer in self._observers:
            observer.close()
        self._server.stop()


def build(system, kind, num_envs):
    if system == 'numpy':
        return NumpySystem(kind, num_envs)
    if system.startswith('tfa_reverb_'):
        return TfaReverbSystem(kind, num_envs, prioritized=system.endswith('prioritized'))
    if system == 'tfa_uniform':
        return TfaUniformSystem(kind, num_envs)
    if system == 'tfa_episodic':
        return TfaEpisodicSystem(kind, num_envs)
    from buffers.episodic import EpisodicReplay
    from buffers.prioritized import PrioritizedReplay
    from buffers.reverb_replay import ReverbPrioritizedReplay, ReverbUniformReplay
    from buffers.uniform import UniformReplay
    classes = {'uniform': UniformReplay, 'prioritized': PrioritizedReplay,
               'episodic': EpisodicReplay, 'reverb_uniform': ReverbUniformReplay,
               'reverb_prioritized': ReverbPrioritizedReplay}
    return OurSystem(classes[system], kind, num_envs)


# -- Measurements -------------------------------------------------------------------------------


def rate_of(call, units, seconds, min_calls=3):
    """Units per second of `call()`, repeated for at least `seconds` (after one warm-up call)."""
    call()  # traces, compiles, opens streams
    calls, start = 0, time.perf_counter()
    while True:
        call()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and calls >= min_calls:
            return units * calls / elapsed


def measure_insert(system, seconds):
    """Batched steps/s of `system.insert`, in calls sized to ~1/5 of `seconds`.

    Returns (transitions per second, steps written so far).
    """
    num_envs = system.stream.num_envs
    system.insert(0, 4)  # traces
    start = time.perf_counter()
    system.insert(4, 16)
    per_step = max((time.perf_counter() - start) / 16, 1e-7)
    chunk = max(1, int(seconds / 5 / per_step))
    written, total_s = 20, 0.0
    while total_s < seconds:
        start = time.perf_counter()
        system.insert(written, chunk)
        total_s += time.perf_counter() - start
        written += chunk
    return (written - 20) * num_envs / total_s, written


def latency(call, seconds, calls_range):
    """p50 and p99 of single calls, in ms (after 3 warm-up calls)."""
    for _ in range(3):
        call()
    low, high = calls_range
    times, start = [], time.perf_counter()
    while len(times) < high and (len(times) < low or time.perf_counter() - start < seconds):
        begin = time.perf_counter()
        call()
        times.append(time.perf_counter() - begin)
    return (1e3 * float(np.percentile(times, 50)), 1e3 * float(np.percentile(times, 99)),
            len(times))


def measure_insert_only(name, kind, budget):
    """Only the 32-env insert rate: one of the interleaved repeats `bench/buffers.py` pairs."""
    system = build(name, kind, NUM_ENVS)
    rate, _ = measure_insert(system, budget['seconds'])
    log(f'{name}/{kind}: insert, {NUM_ENVS} envs: {rate:,.0f} transitions/s')
    system.close()
    return {'obs_bytes': Stream(kind, 1).obs_bytes, 'insert_32': rate}


def measure_kind(name, kind, budget):
    """Every measurement of system `name` on data `kind`; returns a JSON-able dict."""
    seconds = budget['seconds']
    result = {'obs_bytes': Stream(kind, 1).obs_bytes}

    system = build(name, kind, 1)
    result['insert_1'], _ = measure_insert(system, seconds)
    log(f'{name}/{kind}: insert, 1 env: {result["insert_1"]:,.0f} transitions/s')
    system.close()
    del system
    gc.collect()

    rss_before = rss_bytes()
    system = build(name, kind, NUM_ENVS)
    if hasattr(system, 'capacity_episodes'):
        result['capacity_episodes'] = system.capacity_episodes
    result['insert_32'], written = measure_insert(system, seconds)
    log(f'{name}/{kind}: insert, {NUM_ENVS} envs: {result["insert_32"]:,.0f} transitions/s')
    target = min(budget['reverb_fill'] if 'reverb' in name else budget['fill'][kind], CAPACITY)
    start = time.perf_counter()
    steps = math.ceil(target / NUM_ENVS)
    chunk = 256
    while written < steps:
        system.insert(written, min(chunk, steps - written))
        written = min(written + chunk, steps)
    result['fill_s'] = time.perf_counter() - start
    result['filled'] = min(written * NUM_ENVS, CAPACITY)
    memory, how = system.memory(result['filled'], rss_bytes() - rss_before)
    result['bytes_per_transition'], result['memory_method'] = memory, how
    log(f'{name}/{kind}: filled to {result["filled"]:,} transitions in {result["fill_s"]:.1f} s')

    result['sample'] = {}
    for label, call, units in system.read_paths():
        result['sample'][label] = rate_of(call, units, seconds)
        log(f'{name}/{kind}: {label}: {result["sample"][label]:,.0f} windows/s')
    p50, p99, count = latency(system.sample_once, budget['latency_s'], budget['latency_calls'])
    result['latency_ms'] = {'p50': p50, 'p99': p99, 'calls': count}
    log(f'{name}/{kind}: latency p50 {p50:.2f} ms, p99 {p99:.2f} ms ({count} calls)')
    result['update'] = {}
    for label, call, units in system.update_paths():
        result['update'][label] = rate_of(call, units, seconds)
        log(f'{name}/{kind}: {label}: {result["update"][label]:,.0f} keys/s')
    system.close()
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--system', required=True, choices=SYSTEMS)
    parser.add_argument('--kind', action='append', choices=KINDS,
                        help='Data kind (repeatable; default: all).')
    parser.add_argument('--quick', action='store_true', help='Shrink fills and timings.')
    parser.add_argument('--insert_only', action='store_true',
                        help=f'Measure only the insert rate with {NUM_ENVS} envs.')
    opts = parser.parse_args(argv)
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
    budget = QUICK if opts.quick else FULL
    started = time.perf_counter()
    results = {'system': opts.system, 'affinity': sorted(os.sched_getaffinity(0)), 'kinds': {}}
    for kind in opts.kind or KINDS:
        measure = measure_insert_only if opts.insert_only else measure_kind
        results['kinds'][kind] = measure(opts.system, kind, budget)
    results['wall_s'] = time.perf_counter() - started
    print('RESULT ' + json.dumps(results), flush=True)
    sys.stderr.flush()
    # Skip interpreter finalization: tf.data iterators and Reverb clients can
    # block it for seconds (see the DQN section's notes); everything is printed.
    os._exit(0)


if __name__ == '__main__':
    main()
