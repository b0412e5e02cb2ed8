"""The learn role: the single-process `Training` on the replay server; checkpoints, weights out.

Sampling goes through the run's Reverb replay backend pointed at the server:
`ReplayBackend.as_dataset` batches, stacked `learner_steps_per_call` at a time
(`Training.stacked_dataset`), are sampled, decoded and stacked on tf.data's threads
while the previous chunk trains, and the chunk itself holds no sampling op, so it
is compiled with XLA where the run's `use_xla` says so. The learner masks
LAST -> FIRST boundary windows and, on a prioritized table
(`run.replay_backend = @ReverbPrioritizedReplay`), feeds the TD errors back as
priorities, once per chunk; importance weights anneal beta from
`run.importance_beta_start` to 1 over the learner's gradient-step budget. When
the table gives no sample within `timeout_s` (the rate limiter waits for
collectors) or the server is away, a fresh iterator replaces the old one (no new
trace).

The learner owns the training state: agent, optimizers and train step are
checkpointed in `<root>/learner/checkpoints` every
`learner_checkpoint_interval` steps and on SIGINT/SIGTERM; a restarted
learner resumes there and pushes its weights before its first step. Later pushes
go out on a thread of their own (pusher.py), off the gradient loop. It
stops after the single-process run's gradient-step budget, or when the
collectors are done and no batch comes any more.
"""

import contextlib
import os
import time

import tensorflow as tf

from buffers.reverb.shards import ShardedReplay
from core import rundir, tags
from core.export import export_policy
from core.schedules import linear_schedule
from experiment.checkpointing import Checkpointer
from experiment.distributed import common, config, tables, tier
from experiment.distributed.held import HeldReplay
from experiment.distributed.learner_shards import SHARD_REFRESH_TIMEOUT_S, ShardedSampling
from experiment.distributed.pusher import BackgroundPusher
from experiment.distributed.waiting import TRANSIENT, Stopped, Watchdog, one_line, retry
from experiment.loop import Training, divergence_error, nonfinite
from experiment.replay import Mode, num_steps_of

# Batch iterators a stopped learner leaves open (see `_Learner.disconnect`).
_LEFT_OPEN = []


class _Learner(ShardedSampling):
    """The agent, its checkpoint, the weight store and the replay backend it samples."""

    def __init__(self, role, settings, params, *, address, directory, seed):
        self.role, self.settings, self.params = role, settings, params
        self.address, self.seed = address, seed
        self.agent, self.train_step, tf_env = common.build_agent(params, seed=seed)
        settings = self.settings = config.for_agent(settings, self.agent)
        self.num_envs = tf_env.batch_size
        # Listed once: TF-Agents walks the policy's module tree on every `variables()` call
        # (~4 ms for SAC's, on every weight push).
        self.policy_variables = tuple(self.agent.collect_policy.variables())
        # The replay in this process (held.py), or None: the server holds it.
        self.held = HeldReplay(settings, params, self.agent, seed=seed) \
            if settings.learner_holds_replay else None
        held_items = {'held_replay': self.held.checkpoint_items()} if self.held else {}
        self.checkpointer = Checkpointer(os.path.join(directory, 'checkpoints'),
                                         **self.agent.checkpoint_items(), **held_items,
                                         train_step=self.train_step)
        self.tier = tier.ReplayTier(tier.parse_addresses(address, settings.replay_shards),
                                    timeout_s=settings.timeout_s, settings=settings)
        self.store = tables.WeightStore(self.tier.weights_address, timeout_s=settings.timeout_s)
        self.whom_server = self.tier.describe()
        self.next_refresh = 0.0
        # Sharded replay: the whole buffer's ratio, kept here (see experiment/distributed/tier.py)
        self.gate = tier.RatioGate(settings) if settings.replay_shards > 1 else None
        self.allowance = 0  # samples the gate allowed and not yet used
        self.importance_beta = linear_schedule(self.train_step, params.importance_beta_start,
                                               1.0, config.max_train_steps(params))
        self.backend = None
        self.training = None
        self.batches = None
        self.sampled_shards = None  # sharded replay: the shards the open dataset samples
        self.reported_live = None  # ...and those last reported live in the log
        self.sharded = None  # sharded replay: the `ShardedReplay` the backend samples through
        self.steady_from = None  # (time.monotonic(), train step) after the first chunk
        self.pusher = None  # the BackgroundPusher, from the first push in the loop on

    def probe(self):
        return common.limiter_state(self.tier.counters())

    def counters(self):
        return retry(self.role, self.tier.counters,
                     what='reading the replay table', whom=self.whom_server,
                     timeout_s=self.settings.timeout_s)

    def save_checkpoint(self, step):
        """Saves the training state; a held replay's drain taken in meanwhile waits for it
        (a checkpoint never holds half a drain)."""
        with self.held.lock if self.held else contextlib.nullcontext():
            self.checkpointer.save(step)

    def _snapshot(self):
        """The policy weights and train step now, copied (the next steps change them)."""
        return ([v.numpy() for v in self.policy_variables],
                int(self.train_step.numpy()))

    def _push_values(self, values, train_step):
        retry(self.role, lambda: self.store.push(values, train_step),
              what='pushing weights', whom=self.whom_server, timeout_s=self.settings.timeout_s)

    def push(self):
        """Pushes the weights now, on this thread (before training and after the last step)."""
        self._push_values(*self._snapshot())

    def push_in_background(self):
        """Hands a copy of the weights to the pusher thread (pusher.py), off the gradient loop."""
        if self.pusher is None:
            self.pusher = BackgroundPusher(self._push_values)
        self.pusher.submit(*self._snapshot())

    def stop_pushing(self):
        """Drops a background push not yet started and waits for one under way."""
        if self.pusher is not None:
            self.pusher.close()

    def connect(self):
        """Opens the run's replay backend on the server (read-only) and traces the train chunk.

        Batches come stacked, `learner_steps_per_call` at a time, from an iterator over
        `backend.as_dataset` that samples and decodes ahead on tf.data's threads; the
        chunk itself holds no sampling op, so it is compiled with XLA when the run's
        `use_xla` says so. After a timeout or an outage `reopen` makes a fresh iterator
        without a new trace.
        """
        def remote(address):
            return common.remote_backend(Mode.LEARNER, self.params, self.settings, self.agent,
                                         num_envs=self.num_envs, address=address,
                                         seed=self.seed)

        def open_backend():
            if self.tier.num_shards == 1:
                return remote(self.tier.addresses[0])
            # Every shard's table is checked when its backend opens: all must be up now.
            shards = [remote(address) for address in self.tier.addresses]
            pixels = self.params.frame_stack > 1
            self.sharded = ShardedReplay([shard.inner for shard in shards] if pixels else shards,
                                         seed=self.seed, timeout_s=SHARD_REFRESH_TIMEOUT_S)
            if not pixels:
                return self.sharded
            # Pixels: the shards hold single frames; mix them, then stack (one
            # FrameStackedReplay reading through the mix).
            shards[0].read_through(self.sharded)
            return shards[0]

        self.backend = retry(self.role, open_backend, what='opening the replay table',
                             whom=self.whom_server, timeout_s=self.settings.timeout_s)
        if self.held:  # the single-process chunk, sampling the store in this process
            self.training = Training(
                agent=self.agent, backend=self.held.store, batch_size=self.params.batch_size,
                num_steps=num_steps_of(self.agent),
                train_steps=self.settings.learner_steps_per_call, use_xla=self.params.use_xla,
                importance_beta=self.importance_beta, sample_ahead=self.params.sample_ahead)
            self.reopen()
            self.training.compiled_train.get_concrete_function()
            return
        self.training = Training(agent=self.agent, backend=self.backend,
                                 batch_size=self.params.batch_size,
                                 num_steps=num_steps_of(self.agent),
                                 train_steps=self.settings.learner_steps_per_call,
                                 use_xla=self.params.use_xla, importance_beta=self.importance_beta)
        self.reopen()
        self.training.trace_stacked(self.batches.element_spec)

    def reopen(self, abandon=False):
        """A fresh iterator over the table's stacked batches (retried while the server is away).

        `abandon`: the old iterator may be waiting on a dead shard, so it is left open
        (dropping it would wait as long).
        """
        if self.held:
            _LEFT_OPEN.append(self.held.drop())  # closing it could wait: left open
            retry(self.role, lambda: self.held.open(self.backend),
                  what='opening the window queue', whom=self.whom_server,
                  timeout_s=self.settings.timeout_s)
            return

        def make():
            dataset = self.backend.as_dataset(self.params.batch_size,
                                              num_steps_of(self.agent))
            return iter(self.training.stacked_dataset(dataset))

        if abandon and self.batches is not None:
            _LEFT_OPEN.append(self.batches)
        self.batches = retry(self.role, make, what='opening the replay dataset',
                             whom=self.whom_server, timeout_s=self.settings.timeout_s)
        if self.tier.num_shards > 1:
            self.sampled_shards = self.live_shards()
            self._report_shards(self.sampled_shards)

    def train(self):
        if self.held:
            self.held.ready_for_call()
            return self.training.train()
        if self.tier.num_shards == 1:
            return self.training.train_stacked(self.batches.get_next())
        return self.training.train_stacked(self._next_sharded_batch())


    def disconnect(self):
        """Closes the backend; the open batch iterator is left open until the process ends.

        Closing that iterator waits for every sample request the rate limiter still
        holds, up to `timeout_s` each: 21 s at the end of a 60k-step DQN CartPole run,
        when the collectors had stopped inserting. Nothing needs it closed: the
        server forgets a dead client's requests, and the role's process exits at
        once after `main` returns (train.py).
        """
        if self.batches is not None:
            _LEFT_OPEN.append(self.batches)
        self.batches = None
        if self.held:
            _LEFT_OPEN.append(self.held.drop())
        if self.backend is not None:
            _close_quietly(self.backend)
        self.backend = self.training = None

    def wait_for_data(self, watchdog):
        """Blocks (bounded, stoppable) until the table holds enough windows to sample."""
        wanted = self.settings.min_size_to_sample
        if self.held:  # the queue never holds them all: `fill` takes them in after `connect`
            return
        with watchdog.waiting(f'waiting for {wanted:,} windows in the table',
                              f'the collectors or {self.whom_server}', self.probe):
            while self.counters()['size'] < wanted:
                self.role.sleep(min(self.settings.timeout_s, 1.0))


    def fill(self, watchdog):
        """Held replay: takes windows from the queue until the store holds the run's minimum
        (at once when restored from a checkpoint that holds it)."""
        if not self.held:
            return
        wanted = self.settings.min_size_to_sample
        with watchdog.waiting(f'waiting for {wanted:,} windows from the collectors',
                              f'the collectors or {self.whom_server}', self.probe):
            while not self.role.stop.is_set():
                try:
                    if self.held.fill_step():
                        return
                except TRANSIENT as error:
                    if not _no_sample(error):
                        self.role.log(f"taking windows failed ({one_line(error)}); reopening "
                                      "the window queue")
                        self.role.sleep(min(self.settings.timeout_s, 2.0))
                    self.reopen()


@contextlib.contextmanager
def _timed(role, what, report_after_s=1.0):
    """Logs how long `what` took when it took longer than `report_after_s`."""
    started = time.monotonic()
    yield
    seconds = time.monotonic() - started
    if seconds > report_after_s:
        role.log(f"{what} took {seconds:.1f} s")


def _close_quietly(backend):
    try:
        backend.close()
    except Exception:  # noqa: BLE001  (a dead server's writer may fail to close)
        pass


def _no_sample(error):
    """Whether a failed chunk only found no sample in time (the backend's dataset ended)."""
    return isinstance(error, tf.errors.OutOfRangeError) or 'gave no sample' in str(error)


def main(root_dir, *, address, seed=0, force=False, verbose=True):
    """Trains to the gradient-step budget (or until stopped); returns final metrics."""
    params, settings, role, directory = common.start_role('learn', root_dir, force=force,
                                                          seed=seed)
    learner = _Learner(role, settings, params, address=address, directory=directory, seed=seed)
    restored = learner.checkpointer.restore_latest()
    if restored:
        role.log(f"resumed from {restored} at train step {int(learner.train_step.numpy()):,}")
    budget = config.max_train_steps(params)
    summaries = common.RateSummaries(directory)
    watchdog = Watchdog(role)
    role.install_signal_handlers()
    start_step, start = int(learner.train_step.numpy()), time.monotonic()
    finished_at = None
    try:
        learner.push()
        role.log(f"pushed weights at train step {start_step:,}; training to {budget:,}")
        _loop(learner, role, settings, params, budget, summaries, watchdog)
        finished_at = time.time()
    except Stopped:
        pass
    interrupted = role.stop.is_set()
    step = int(learner.train_step.numpy())
    train_end = time.monotonic()
    # The close-out waits on nobody: every phase is timed, and one that lasts is logged.
    with _timed(role, 'saving the final checkpoint'):
        learner.save_checkpoint(step)  # first: whatever happens next, the training is safe
    role.log(f"checkpoint saved at train step {step:,}")
    try:
        with watchdog.waiting('pushing the final weights', learner.whom_server), \
                _timed(role, 'pushing the final weights'):
            learner.stop_pushing()  # an older push must not land after the final one
            learner.push()
    except Stopped:  # asked to stop while the server is away: the checkpoint has it all
        pass
    finally:
        watchdog.close()
        role.restore_signal_handlers()
        with _timed(role, 'closing the replay dataset'):
            learner.disconnect()
    summaries.close()
    if not interrupted:  # exporting takes seconds: not when asked to stop
        with _timed(role, 'exporting the policy'):
            export_policy(learner.agent.policy, os.path.join(directory, 'policy'),
                          learner.train_step)
    if learner.steady_from is not None:  # after the first chunk: tracing and XLA left out
        since, from_step = learner.steady_from
        rate = (step - from_step) / max(train_end - since, 1e-9)
    else:
        rate = (step - start_step) / max(train_end - start, 1e-9)
    metrics = {'train_steps': step, 'interrupted': interrupted, 'train_steps_per_sec': rate,
               'budget_reached_at': finished_at}
    rundir.write_metrics(directory, metrics)
    role.log(f"stopped at train step {step:,}")
    return metrics


def _loop(learner, role, settings, params, budget, summaries, watchdog):
    learner.wait_for_data(watchdog)
    # Trace outside the watched section: tracing SAC's train step can take longer than
    # any sample wait on a busy machine, and it is no waiting on peers.
    traced = time.monotonic()
    learner.connect()
    role.log(f"traced the train function in {time.monotonic() - traced:.1f} s")
    learner.fill(watchdog)
    step = int(learner.train_step.numpy())
    next_summary = time.monotonic() + settings.summary_interval_s
    while step < budget and not role.stop.is_set():
        learner.wait_for_ratio(watchdog)
        try:
            with watchdog.waiting('sampling a batch', f'the collectors or {learner.whom_server}',
                                  learner.probe):
                diagnostics = learner.train()
        except TRANSIENT as error:
            if _no_sample(error):
                counters = learner.counters()
                if counters['inserted'] >= params.num_env_steps:
                    role.log(f"collection is done ({counters['inserted']:,} transitions) and "
                             f"no batch came within {settings.timeout_s:g} s: stopping at "
                             f"{step:,}")
                    return
                role.log(f"no batch within {settings.timeout_s:g} s, waiting on the "
                         f"collectors: {common.limiter_state(counters)}")
            else:
                role.log(f"sampling failed ({one_line(error)}); reopening the replay dataset")
                role.sleep(min(settings.timeout_s, 2.0))
            learner.reopen()
            continue
        learner.refresh_shards()
        before, step = step, int(learner.train_step.numpy())
        if learner.steady_from is None:
            learner.steady_from = (time.monotonic(), step)
        bad = nonfinite(diagnostics)
        if bad:  # before any checkpoint or push: nothing non-finite leaves the learner
            raise divergence_error('the learner', bad, f'train step {step:,}',
                                   'its last checkpoint (the last finite one) stays the latest',
                                   'restart the run')
        loss = diagnostics['loss']
        if step // settings.weight_push_interval > before // settings.weight_push_interval:
            learner.push_in_background()
        if step // settings.learner_checkpoint_interval > \
                before // settings.learner_checkpoint_interval:
            learner.save_checkpoint(step)
        if time.monotonic() >= next_summary:
            with watchdog.waiting('reading the replay table', learner.whom_server):
                counters = learner.counters()
            scalars, totals = {}, {}
            if learner.held:
                scalars['replay/learner_size'] = learner.held.size()
            if learner.tier.num_shards > 1:
                # The whole buffer (each shard's own is in its replay_<i> run), and how long
                # each shard took to answer the learner's last check (a round trip).
                scalars = {'replay/size': counters['size'],
                           **{f'replay/shard_{k}_latency_ms': value for k, value in
                              enumerate(learner.sharded.latencies_ms)}}
                totals = {'replay/inserted': counters['inserted'],
                          'replay/sampled': counters['sampled']}
            values = summaries.write(counters['inserted'], {
                tags.TRAIN_LOSS: float(loss), **scalars,
                **{tag: float(value) for tag, value in
                   learner.agent.summary_scalars().items()}},
                {'learner/train_steps': step, **totals},
                kinds=learner.agent.stage_summaries())
            if 'learner/train_steps_per_sec' in values:
                summaries.write(counters['inserted'], {
                    tags.TRAIN_STEPS_PER_SEC: values['learner/train_steps_per_sec']})
            next_summary = time.monotonic() + settings.summary_interval_s
