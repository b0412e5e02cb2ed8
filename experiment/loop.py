"""The hot path: collection and training, each a whole chunk per call.

`Collection` and `Training` are the two halves every mode composes (online,
offline, the distributed collector and learner); `FusedLoop` joins them.
One call of `iterate` steps the batched environment `steps` times with the
collect policy inside a `tf.function` (the env is a py_function there), writes
every step to the replay backend, then samples and takes `train_steps`
gradient steps in a nested function compiled with XLA when the backend
supports it. Python sees the loop only once per chunk, which is what makes the
loop fast; summaries read counters between chunks, never per step.
"""

from concurrent import futures

import numpy as np
import tensorflow as tf
from tf_agents.policies import random_tf_policy
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory as trajectory_lib

from agents import frame_stack
from buffers.base import SampleInfo, importance_weights
from core.errors import UserError

# The diagnostics key of the chunk's "every value finite" flag (not a summary).
ALL_FINITE = 'all_finite'



def nonfinite(diagnostics):
    """Names of a chunk's diagnostics (scalars or arrays) holding a NaN or an infinity."""
    if ALL_FINITE in diagnostics and bool(diagnostics[ALL_FINITE]):
        return []  # the usual case: one read of the chunk's own flag
    return [name for name, value in diagnostics.items()
            if name != ALL_FINITE and not np.all(np.isfinite(np.asarray(value)))]


def divergence_error(who, bad, where, kept, then):
    """The one-line error of a process that stops on non-finite diagnostics `bad`.

    Args:
      who: what diverged ('Training', 'the learner').
      bad: the names `nonfinite` gave.
      where: the step, e.g. 'env step 1,234'.
      kept: which checkpoint stays the latest.
      then: what to do after lowering the learning rate.
    """
    return UserError(
        f"{who} diverged: train/{', train/'.join(bad)} not finite at {where}; {kept} and "
        f"nothing non-finite was saved. Lower the learning rate or clip gradients, then {then}.")


def agent_numerics_checked(compiled):
    """Turns an agent's own numerics check firing into non-finite diagnostics.

    TF-Agents' DQN (and our SAC) call `tf.debugging.check_numerics` on the loss,
    which raises `InvalidArgumentError` out of the compiled chunk when it is not
    compiled with XLA (XLA drops the check). Without this, a diverging run
    would end in a traceback (single process) or retry forever (the distributed
    learner took it for a sampling error), instead of the divergence stop.
    """
    def call(*args):
        try:
            return compiled(*args)
        except tf.errors.InvalidArgumentError as error:
            if 'CheckNumerics' not in str(error):
                raise
            return {'loss': float('nan'), ALL_FINITE: False}
    return call


class Collection:
    """Compiled collection: the batched env stepped with a policy, every step to the observers.

    The single-process loop, the distributed collector and the offline-to-online
    start all collect through this, so there is one collection path.
    """

    def __init__(self, *, tf_env, collect_policy, observers, env_steps, chunk_observers=()):
        """Builds (but does not trace) the compiled collect functions.

        Args:
          tf_env: a batched `TFPyEnvironment`.
          collect_policy: the agent's collect policy.
          observers: callables fed each batched `Trajectory` (backend.add, metrics).
          env_steps: int64 variable counting env steps over all copies.
          chunk_observers: callables run once after each chunk's steps (graph code), e.g.
            folding the preprocessing statistics gathered step by step.
        """
        self._env = tf_env
        self._observers = list(observers)
        self._chunk_observers = list(chunk_observers)
        self._env_steps = env_steps
        random_policy = random_tf_policy.RandomTFPolicy(
            collect_policy.time_step_spec, tf_env.action_spec(),
            info_spec=collect_policy.info_spec)
        if frame_stack.frames_to_stack(collect_policy.time_step_spec.observation.shape,
                                       tf_env.observation_spec().shape):
            # The env yields single frames, the policy reads stacks: stack them per copy, in
            # one ring that the random warm-up keeps filled too.
            collect_policy = frame_stack.FrameStackingPolicy(collect_policy,
                                                             tf_env.time_step_spec())
            random_policy = frame_stack.FrameStackingPolicy(random_policy, tf_env.time_step_spec(),
                                                            ring=collect_policy.ring)
        self.collect_policy = collect_policy
        # A recurrent policy's state, per env copy, carried from chunk to chunk (its network
        # resets it at each episode's FIRST step). Not checkpointed: a resumed run restarts
        # its episodes, and so their states.
        self._policy_state = tf.nest.map_structure(
            lambda spec: tf.Variable(tf.zeros([tf_env.batch_size, *spec.shape], spec.dtype),
                                     trainable=False),
            collect_policy.policy_state_spec)
        self._recurrent = bool(tf.nest.flatten(collect_policy.policy_state_spec))
        step_count = tf.TensorSpec([], tf.int32)
        self.collect_random = tf.function(
            lambda steps: self.run_policy(random_policy, steps), input_signature=[step_count])
        # Collection without training, for runs that start from trained weights and
        # for distributed collectors.
        self.collect_with_agent = tf.function(
            lambda steps: self.run_policy(collect_policy, steps), input_signature=[step_count])

    def run_policy(self, policy, steps):
        """Steps every env copy `steps` times with `policy`, feeding the observers (graph code)."""
        time_step = self._env.current_time_step()
        stateful = bool(tf.nest.flatten(policy.policy_state_spec))
        state = tf.nest.map_structure(lambda var: var.read_value(), self._policy_state)
        for _ in tf.range(steps):
            if stateful:
                action_step = policy.action(time_step, state)
                state = action_step.state
            else:
                action_step = policy.action(time_step)
                if self._recurrent:
                    # The random warm-up of a recurrent agent acts without a state: its steps
                    # record a zero one (RandomTFPolicy would record random numbers).
                    action_step = action_step._replace(
                        info=tf.nest.map_structure(tf.zeros_like, action_step.info))
            next_time_step = self._env.step(action_step.action)
            transition = trajectory_lib.from_transition(time_step, action_step, next_time_step)
            for observer in self._observers:
                observer(transition)
            time_step = next_time_step
        if stateful:
            tf.nest.map_structure(lambda var, value: var.assign(value), self._policy_state, state)
        for chunk_observer in self._chunk_observers:
            chunk_observer()
        self._env_steps.assign_add(tf.cast(steps * self._env.batch_size, tf.int64))
        return self._env_steps.read_value()


class Training:
    """Compiled training: `train_steps` sampled batches and gradient steps per call.

    Used by the single-process loop, offline training and the distributed
    learner alike, so every mode masks boundary windows and feeds priorities
    back the same way.
    """

    def __init__(self, *, agent, backend, batch_size, num_steps, train_steps, use_xla,
                 importance_beta=lambda: 1.0, sample_ahead=False):
        """Builds (but does not trace) the compiled train chunk.

        Args:
          agent: the TF-Agents agent being trained.
          backend: the `ReplayBackend` batches are sampled from.
          batch_size: windows per gradient step.
          num_steps: window length, `agent.train_sequence_length`.
          train_steps: gradient steps per `train` call.
          use_xla: jit-compile `train` (only if the backend supports it).
          importance_beta: callable giving the importance-sampling exponent now
            (annealed towards 1 by the caller); irrelevant for uniform backends.
          sample_ahead: sample batch i + 1 while gradient step i runs (no data flows
            between them, so TF runs them side by side when it has a second thread:
            run.tf_threads=2). The same batches in the same order; with prioritized
            replay, though, a batch is drawn before the previous step's priorities are
            written back.
        """
        self._agent = agent
        self._sample_ahead = sample_ahead
        self._backend = backend
        self._batch_size = batch_size
        self._num_steps = num_steps
        self._train_steps = train_steps
        self._importance_beta = importance_beta
        self.uses_xla = bool(use_xla and backend.capabilities.xla)
        # Decided once, here: a prioritized backend gets every agent's priorities back.
        self._feeds_priorities = backend.capabilities.priorities
        self.compiled_train = tf.function(self.train_chunk, jit_compile=self.uses_xla)
        self.train = agent_numerics_checked(self.compiled_train)
        # Stacked chunks hold no sampling op, so XLA depends on the agent alone.
        self._compiled_stacked = tf.function(self._stacked_chunk, jit_compile=bool(use_xla))
        self.train_stacked = agent_numerics_checked(self._train_stacked)

    def train_chunk(self):
        """Takes `train_steps` gradient steps on `backend.sample` batches; returns diagnostics.

        The diagnostics (mean loss, the agent's batch diagnostics, the global weight
        norm) are what the trainer checks for non-finite values after every chunk.
        """
        total_loss = tf.constant(0.0)
        if self._sample_ahead:
            experience, info = self._next_batch()
            for _ in tf.range(self._train_steps - 1):
                next_experience, next_info = self._next_batch()
                total_loss += self._step(experience, info)
                experience, info = next_experience, next_info
        else:
            for _ in tf.range(self._train_steps - 1):
                experience, info = self._next_batch()
                total_loss += self._step(experience, info)
            experience, info = self._next_batch()
        # The last step stays outside the loop so its batch can feed diagnostics.
        loss = self._step(experience, info)
        return self._diagnostics(experience, total_loss + loss)

    def _diagnostics(self, experience, total_loss):
        """The chunk's mean loss, the last batch's diagnostics, the weight norm, a finite flag."""
        diagnostics = dict(self._agent.batch_diagnostics(experience))
        diagnostics['loss'] = total_loss / float(self._train_steps)
        # One cheap number that is non-finite as soon as any weight is (divergence check).
        # Floating-point variables only: the agent's int64 step counter is a tf.Variable
        # with TF's default trainable=True, and counted here it made the "norm" grow with
        # the step count.
        diagnostics['weight_norm'] = tf.sqrt(tf.add_n([
            tf.reduce_sum(tf.square(tf.cast(v, tf.float32)))
            for v in self._agent.trainable_variables if v.dtype.is_floating]))
        # One boolean for the trainer's divergence check: a single read per chunk.
        diagnostics[ALL_FINITE] = tf.reduce_all(
            [tf.reduce_all(tf.math.is_finite(tf.cast(value, tf.float32)))
             for value in diagnostics.values()])
        return diagnostics

    def _next_batch(self):
        return self._backend.sample(self._batch_size, self._num_steps)

    def _step(self, experience, info):
        """One gradient step; prioritized backends get the agent's priorities back."""
        loss_info = self._learn(experience, info)
        if self._feeds_priorities:
            self._backend.update_priorities(info.keys,
                                            self._agent.sample_priorities(loss_info))
        return loss_info.loss

    def _learn(self, experience, info):
        """One gradient step on one batch, importance-weighted; returns the `LossInfo`."""
        weights = importance_weights(info.probabilities, self._importance_beta())
        # Batched auto-resetting envs store LAST -> FIRST boundary steps; a window starting
        # on one is no transition at all. DQN masks them itself, SAC does not: zero them here.
        weights *= tf.cast(experience.step_type[:, 0] != ts.StepType.LAST, weights.dtype)
        return self._agent.train(experience, weights=weights)

    def stacked_dataset(self, dataset):
        """`dataset` of `(window, SampleInfo)` batches -> chunks of `train_steps` stacked.

        For `train_stacked`: a remote learner's batches arrive whole, so the chunk
        needs no sampling op inside and compiles with XLA; Reverb's sampling and the
        decoding run on tf.data's threads while the previous chunk trains.
        """
        return dataset.batch(self._train_steps, drop_remainder=True).prefetch(2)

    def trace_stacked(self, element_spec):
        """Traces `train_stacked`'s compiled chunk for `stacked_dataset`'s elements."""
        windows, info = element_spec
        self._compiled_stacked.get_concrete_function(windows, info.probabilities)

    def _train_stacked(self, stacked):
        """Trains on one stacked chunk; a prioritized backend gets its priorities after it.

        The priorities of the whole chunk go back in one call when it ends: the batches
        were drawn before it started anyway (sampling runs ahead of training).
        """
        windows, info = stacked
        diagnostics, priorities = self._compiled_stacked(windows, info.probabilities)
        if self._feeds_priorities:
            self._backend.update_priorities(info.keys, priorities)
        return diagnostics

    def _stacked_chunk(self, windows, probabilities):
        """`train_steps` gradient steps on `[train_steps, B, ...]` windows; XLA-compilable."""
        def batch(i):
            return (tf.nest.map_structure(lambda x: x[i], windows),
                    SampleInfo(keys=None, probabilities=probabilities[i]))

        priorities = tf.TensorArray(tf.float32, size=self._train_steps)
        total_loss = tf.constant(0.0)
        for i in tf.range(self._train_steps - 1):
            loss_info = self._learn(*batch(i))
            total_loss += loss_info.loss
            if self._feeds_priorities:
                priorities = priorities.write(i, self._priorities(loss_info))
        experience, info = batch(self._train_steps - 1)
        loss_info = self._learn(experience, info)
        if self._feeds_priorities:
            priorities = priorities.write(self._train_steps - 1, self._priorities(loss_info))
            stacked_priorities = priorities.stack()
        else:
            stacked_priorities = tf.zeros([0])
        diagnostics = self._diagnostics(experience, total_loss + loss_info.loss)
        return diagnostics, stacked_priorities

    def _priorities(self, loss_info):
        return tf.cast(self._agent.sample_priorities(loss_info), tf.float32)


class FusedLoop:
    """One compiled call per iteration: a collect chunk, then a train chunk.

    With `overlap_collection`, an iteration instead runs the collect chunk on a
    collector thread while the train chunk runs on the caller's, and returns when
    both are done: TF kernels release the GIL, so with two cores (and two TF
    threads) the chunks overlap, while checkpoints, evaluations and summaries still
    see the loop between iterations, at rest.
    """

    def __init__(self, *, agent, tf_env, backend, observers, env_steps, batch_size, num_steps,
                 train_steps, use_xla, importance_beta=lambda: 1.0, chunk_observers=(),
                 sample_ahead=False, overlap_collection=False):
        """Builds (but does not trace) the compiled chunks.

        Args:
          agent: the TF-Agents agent being trained.
          tf_env: a batched `TFPyEnvironment`.
          backend: the `ReplayBackend` receiving every collected step.
          observers: extra callables fed each batched `Trajectory` (metrics).
          env_steps: int64 variable counting env steps over all copies.
          batch_size, num_steps, train_steps, use_xla, importance_beta, sample_ahead: as
            for `Training`.
          chunk_observers: as for `Collection`.
          overlap_collection: collect and train each chunk side by side (see the class
            doc); the backend must already allow concurrent writes
            (`allow_concurrent_writes`).
        """
        self.collection = Collection(tf_env=tf_env, collect_policy=agent.collect_policy,
                                     observers=[backend.add, *observers], env_steps=env_steps,
                                     chunk_observers=chunk_observers)
        self.training = Training(agent=agent, backend=backend, batch_size=batch_size,
                                 num_steps=num_steps, train_steps=train_steps, use_xla=use_xla,
                                 importance_beta=importance_beta, sample_ahead=sample_ahead)
        self.collect_random = self.collection.collect_random
        self.collect_with_agent = self.collection.collect_with_agent
        self.train = self.training.train
        self.uses_xla = self.training.uses_xla
        # One Python->TF call per iteration: collect (a py_function env, so never XLA)
        # then the train chunk, which keeps its own XLA compilation when nested.
        self.iterate = agent_numerics_checked(tf.function(
            self._iterate, input_signature=[tf.TensorSpec([], tf.int32)]))
        if overlap_collection:
            self._collector = futures.ThreadPoolExecutor(max_workers=1,
                                                         thread_name_prefix='collector')
            self.iterate = self._overlapped_iterate

    def _iterate(self, steps):
        self.collection.run_policy(self.collection.collect_policy, steps)
        return self.training.compiled_train()

    def _overlapped_iterate(self, steps):
        collected = self._collector.submit(self.collect_with_agent, steps)
        try:
            return self.train()
        finally:
            collected.result()  # a collector's error surfaces here, in the caller
