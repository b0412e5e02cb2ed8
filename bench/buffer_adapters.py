"""The replay buffers the buffer benchmark compares, behind one small interface each.

Ours (through the `ReplayBackend` contract) and the TF-Agents classes they replace, built
for one data kind and one number of env copies, fed by one synthetic collect stream
(`Stream`), so every system inserts the same items and samples the same windows.
bench/buffer_systems.py measures them, one system and data kind per process.
"""

import math

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
SYSTEMS = ('uniform', 'tfa_uniform', 'prioritized', 'episodic', 'tfa_episodic',
           'reverb_uniform', 'reverb_prioritized', 'tfa_reverb_prioritized', 'api_uniform',
           'api_episodic')


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
    so generating data costs nothing measurable. Step `i` is available per
    copy as numpy (`unbatched`), and batched as TF ops inside a tf.function.
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
        self.unbatched = [[trajectory.Trajectory(  # [phase][env]: one copy's item
            step_type[i, e], obs[i % pool, e], action[i % pool, e], (), next_step_type[i, e],
            reward[i % pool, e], discount[i, e]) for e in range(num_envs)]
            for i in range(EPISODE_LENGTH)]
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
        self._insert(start, n)
        if self._reverb:
            self._backend.metrics()  # flushes: the items are on the server

    def _sample(self):
        return self._backend.sample(BATCH_SIZE, NUM_STEPS)[0]

    def read_paths(self):
        label = 'K x sample in tf.function' + (' (XLA)' if self._jit else '')
        return [(label, _k_sample_function(self._sample, self._spec, self._jit), K * BATCH_SIZE)]

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


class _TfaSystem:
    """What TF-Agents' buffers share: the stream, and a dataset built once and read lazily
    (subclasses implement `_dataset()`): iterated eagerly, as TF-Agents' examples do, and
    also K times inside a tf.function, as its Learner does."""

    def __init__(self, kind, num_envs):
        self.stream = Stream(kind, num_envs)
        self._spec = data_spec(kind)
        self._paths = self._buffer = None

    def insert(self, start, n):  # through `self._insert`, an in-graph add
        self._insert(start, n)

    def read_paths(self):
        if self._paths is None:
            self._iterator = iter(self._dataset())

            def eager():
                for _ in range(K):
                    next(self._iterator)
            in_function = _k_sample_function(lambda: next(self._iterator)[0], self._spec, False)
            self._paths = [('as_dataset, iterated eagerly', eager, K * BATCH_SIZE),
                           ('as_dataset, K x next in tf.function', in_function, K * BATCH_SIZE)]
        return self._paths

    def sample_once(self):
        self.read_paths()
        return next(self._iterator)

    def update_paths(self):
        return []

    def memory(self, filled, rss_growth):
        return _rss_memory(filled, rss_growth)

    def close(self):
        self._iterator = self._paths = self._buffer = None


class TfaUniformSystem(_TfaSystem):
    """`TFUniformReplayBuffer`, read the way TF-Agents' DQN example reads it."""

    def __init__(self, kind, num_envs):
        super().__init__(kind, num_envs)
        self._buffer = self._buffer_class()(
            self._spec, batch_size=num_envs, max_length=CAPACITY // num_envs)
        self._insert = _insert_function(self._buffer.add_batch, self.stream)

    def _buffer_class(self):
        from tf_agents.replay_buffers import tf_uniform_replay_buffer
        return tf_uniform_replay_buffer.TFUniformReplayBuffer

    def _dataset(self):
        # As dqn/examples/v2/train_eval.py builds it.
        return self._buffer.as_dataset(num_parallel_calls=3, sample_batch_size=BATCH_SIZE,
                                       num_steps=NUM_STEPS).prefetch(3)

    def memory(self, filled, rss_growth):
        return _tf_variable_bytes(self._buffer) / CAPACITY, 'TF variables / capacity'


class ApiUniformSystem(TfaUniformSystem):
    """Ours behind TF-Agents' interface (`buffers.tf_agents_api.UniformReplayBuffer`), built
    and read exactly as `TfaUniformSystem` builds and reads TF-Agents' class."""

    def _buffer_class(self):
        from buffers.tf_agents_api import UniformReplayBuffer
        return UniformReplayBuffer


class TfaEpisodicSystem(_TfaSystem):
    """TF-Agents' `EpisodicReplayBuffer` (capacity in episodes) fed by its stateful wrapper.

    Its TensorLists grow as they fill, so its memory is the RSS growth.
    """

    def __init__(self, kind, num_envs):
        super().__init__(kind, num_envs)
        episodic, stateful = self._buffer_classes()
        # Capacity counts episodes: 100k transitions of EPISODE_LENGTH-item episodes,
        # plus one slot per env copy for the episodes still being written.
        capacity = math.ceil(CAPACITY / EPISODE_LENGTH) + num_envs
        self._buffer = episodic(self._spec, capacity=capacity, seed=0)
        self._stateful = stateful(self._buffer, num_episodes=num_envs)
        self._insert = _insert_function(self._stateful.add_batch, self.stream)

    def _buffer_classes(self):
        from tf_agents.replay_buffers import episodic_replay_buffer as erb
        return erb.EpisodicReplayBuffer, erb.StatefulEpisodicReplayBuffer

    def _dataset(self):
        return self._buffer.as_dataset(sample_batch_size=BATCH_SIZE, num_steps=NUM_STEPS)


class ApiEpisodicSystem(TfaEpisodicSystem):
    """Ours behind TF-Agents' interface (`buffers.tf_agents_api.EpisodicReplayBuffer` and its
    stateful wrapper), built and read exactly as `TfaEpisodicSystem` does TF-Agents' classes."""

    def _buffer_classes(self):
        from buffers.tf_agents_api import EpisodicReplayBuffer, StatefulEpisodicReplayBuffer
        return EpisodicReplayBuffer, StatefulEpisodicReplayBuffer


class TfaReverbSystem(_TfaSystem):
    """TF-Agents' PER: a Prioritized Reverb table, its observers and `ReverbReplayBuffer`.

    Built as TF-Agents' Reverb examples build it (sequence_length 2, stride 1,
    Fifo remover, MinSize(1) limiter, signature with an outer time dim). The
    observer takes unbatched steps only, so N env copies get N observers (one
    writer each), as N actors would.
    """

    def __init__(self, kind, num_envs):
        import reverb
        import tensorflow as tf
        from tf_agents.replay_buffers import reverb_replay_buffer, reverb_utils
        from tf_agents.specs import tensor_spec

        super().__init__(kind, num_envs)
        self._tf = tf
        table_name = 'prioritized_replay'
        sampler = reverb.selectors.Prioritized(priority_exponent=ALPHA)
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
        tf = self._tf
        self.read_paths()
        # Its SampleInfo repeats each item's key per time step: [B, T] -> [B].
        keys = tf.reshape(next(self._iterator)[1].key, [BATCH_SIZE, -1])[:, 0]
        priorities = tf.constant(np.random.default_rng(1).uniform(0.1, 2.0, BATCH_SIZE),
                                 tf.float64)

        def eager():  # its documented use
            for i in range(K):
                self._buffer.update_priorities(keys, priorities * (i + 1))
        return [('update_priorities, eager', eager, K * BATCH_SIZE)]

    def close(self):
        super().close()
        for observer in self._observers:
            observer.close()
        self._server.stop()


def build(system, kind, num_envs):
    theirs = {'tfa_uniform': TfaUniformSystem, 'tfa_episodic': TfaEpisodicSystem,
              'tfa_reverb_prioritized': TfaReverbSystem, 'api_uniform': ApiUniformSystem,
              'api_episodic': ApiEpisodicSystem}
    if system in theirs:
        return theirs[system](kind, num_envs)
    from buffers.episodic import EpisodicReplay
    from buffers.prioritized import PrioritizedReplay
    from buffers.reverb_replay import ReverbPrioritizedReplay, ReverbUniformReplay
    from buffers.uniform import UniformReplay
    classes = {'uniform': UniformReplay, 'prioritized': PrioritizedReplay,
               'episodic': EpisodicReplay, 'reverb_uniform': ReverbUniformReplay,
               'reverb_prioritized': ReverbPrioritizedReplay}
    return OurSystem(classes[system], kind, num_envs)
