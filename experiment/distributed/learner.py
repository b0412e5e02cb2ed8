"""The learn role: Reverb batches into K gradient steps per compiled call, checkpoints, weights out.

Sampling is Reverb's own `TrajectoryDataset`, read inside the `tf.function`
that takes `learner_steps_per_call` gradient steps, so Python runs once per
call. The iterator is an argument of that function: when a dataset ends (no
sample within `timeout_s`: the rate limiter waits for collectors) or fails
(the server is away), a fresh iterator is passed in without retracing.

The learner owns the training state: agent, optimizers and train step are
checkpointed in `<root>/learner/checkpoints` every
`learner_checkpoint_interval` steps and on SIGINT/SIGTERM; a restarted
learner resumes there and pushes its weights before its first step. It
stops after the single-process run's gradient-step budget, or when the
collectors are done and no batch comes any more.
"""

import os
import time

import tensorflow as tf
from tf_agents.trajectories import time_step as ts

from core import rundir, tags
from core.export import export_policy
from core.tf_setup import configure_tf
from experiment.checkpointing import Checkpointer
from experiment.distributed import common, config, tables
from experiment.distributed.waiting import TRANSIENT, Role, Stopped, Watchdog, one_line, retry


class _Learner:
    """The agent, its checkpoint, the weight store and the sampling dataset."""

    def __init__(self, role, settings, params, *, address, directory, seed):
        self.role, self.settings, self.params = role, settings, params
        self.address = address
        self.agent, self.train_step, tf_env = common.build_agent(params, seed=seed)
        self.num_steps = common.num_steps_of(self.agent)
        self.checkpointer = Checkpointer(os.path.join(directory, 'checkpoints'),
                                         agent=self.agent, train_step=self.train_step)
        self.store = tables.WeightStore(address, timeout_s=settings.timeout_s)
        self.whom_server = f'the replay server at {address}'
        self.train = tf.function(self._train_chunk)
        del tf_env

    def probe(self):
        return common.limiter_state(common.replay_counters(self.store.server_info()))

    def counters(self):
        return retry(self.role, lambda: common.replay_counters(self.store.server_info()),
                     what='reading the replay table', whom=self.whom_server,
                     timeout_s=self.settings.timeout_s)

    def push(self):
        retry(self.role, lambda: self.store.push(self.agent.collect_policy.variables(),
                                                 int(self.train_step.numpy())),
              what='pushing weights', whom=self.whom_server, timeout_s=self.settings.timeout_s)

    def iterator(self):
        """A fresh iterator over batches of windows (retried while the server is away)."""
        import reverb

        batch_size = self.params['batch_size']
        timeout_ms = int(self.settings.timeout_s * 1000)

        def make():
            dataset = reverb.TrajectoryDataset.from_table_signature(
                server_address=self.address, table=config.REPLAY_TABLE,
                max_in_flight_samples_per_worker=2 * batch_size,
                rate_limiter_timeout_ms=timeout_ms,
                get_signature_timeout_secs=max(1, int(self.settings.timeout_s)))
            # Without repeat(), a stream that timed out ends the dataset: the
            # learner then sees OutOfRangeError and says whom it waits on.
            return iter(dataset.batch(batch_size, drop_remainder=True).prefetch(1))

        return retry(self.role, make, what='opening the replay dataset', whom=self.whom_server,
                     timeout_s=self.settings.timeout_s)

    def _train_chunk(self, iterator):
        total = tf.constant(0.0)
        for _ in tf.range(self.settings.learner_steps_per_call):
            sample = iterator.get_next()
            window = tf.nest.pack_sequence_as(self.agent.collect_data_spec,
                                              tf.nest.flatten(sample.data[0]))
            # Windows starting on a LAST -> FIRST boundary step are no transitions.
            weights = tf.cast(window.step_type[:, 0] != ts.StepType.LAST, tf.float32)
            total += self.agent.train(window, weights=weights).loss
        return total / float(self.settings.learner_steps_per_call)


def main(root_dir, *, address, seed=0, force=False, verbose=True):
    """Trains to the gradient-step budget (or until stopped); returns final metrics."""
    params, settings = config.run_params(), config.settings()
    config.validate(settings, params)
    role = Role('learner', give_up_after_s=settings.give_up_after_s)
    directory = common.role_dir(root_dir, 'learn')
    common.prepare_dir(directory, force=force)
    configure_tf(seed, params['tf_threads'])
    learner = _Learner(role, settings, params, address=address, directory=directory, seed=seed)
    restored = learner.checkpointer.restore_latest()
    if restored:
        role.log(f"resumed from {restored} at train step {int(learner.train_step.numpy()):,}")
    budget = config.max_train_steps(params)
    summaries = common.RateSummaries(directory)
    watchdog = Watchdog(role)
    role.install_signal_handlers()
    start_step, start = int(learner.train_step.numpy()), time.monotonic()
    try:
        learner.push()
        role.log(f"pushed weights at train step {start_step:,}; training to {budget:,}")
        _loop(learner, role, settings, params, budget, summaries, watchdog)
    except Stopped:
        pass
    interrupted = role.stop.is_set()
    step = int(learner.train_step.numpy())
    learner.checkpointer.save(step)  # first: whatever happens next, the training is safe
    role.log(f"checkpoint saved at train step {step:,}")
    try:
        with watchdog.waiting('pushing the final weights', learner.whom_server):
            learner.push()
    except Stopped:  # asked to stop while the server is away: the checkpoint has it all
        pass
    finally:
        watchdog.close()
        role.restore_signal_handlers()
    summaries.close()
    if not interrupted:  # exporting takes seconds: not when asked to stop
        export_policy(learner.agent.policy, os.path.join(directory, 'policy'),
                      learner.train_step)
    metrics = {'train_steps': step, 'interrupted': interrupted,
               'train_steps_per_sec': (step - start_step) / max(time.monotonic() - start, 1e-9)}
    rundir.write_metrics(directory, metrics)
    role.log(f"stopped at train step {step:,}")
    return metrics


def _loop(learner, role, settings, params, budget, summaries, watchdog):
    iterator = learner.iterator()
    # Trace outside the watched section: tracing SAC's train step can take longer than
    # any sample wait on a busy machine, and it is no waiting on peers.
    traced = time.monotonic()
    learner.train.get_concrete_function(iterator)
    role.log(f"traced the train function in {time.monotonic() - traced:.1f} s")
    step = int(learner.train_step.numpy())
    next_summary = time.monotonic() + settings.summary_interval_s
    while step < budget and not role.stop.is_set():
        try:
            with watchdog.waiting('sampling a batch', f'the collectors or {learner.whom_server}',
                                  learner.probe):
                loss = learner.train(iterator)
        except tf.errors.OutOfRangeError:
            counters = learner.counters()
            if counters['inserted'] >= params['num_env_steps']:
                role.log(f"collection is done ({counters['inserted']:,} transitions) and no "
                         f"batch came within {settings.timeout_s:g} s: stopping at {step:,}")
                return
            role.log(f"no batch within {settings.timeout_s:g} s, waiting on the collectors: "
                     f"{common.limiter_state(counters)}")
            iterator = learner.iterator()
            continue
        except TRANSIENT as error:
            role.log(f"sampling failed ({one_line(error)}); reopening the dataset")
            role.sleep(min(settings.timeout_s, 2.0))
            iterator = learner.iterator()
            continue
        before, step = step, int(learner.train_step.numpy())
        if step // settings.weight_push_interval > before // settings.weight_push_interval:
            with watchdog.waiting('pushing weights', learner.whom_server):
                learner.push()
        if step // settings.learner_checkpoint_interval > \
                before // settings.learner_checkpoint_interval:
            learner.checkpointer.save(step)
        if time.monotonic() >= next_summary:
            with watchdog.waiting('reading the replay table', learner.whom_server):
                counters = learner.counters()
            values = summaries.write(counters['inserted'], {
                tags.TRAIN_LOSS: float(loss),
                **{tag: float(fn()) for tag, fn in
                   getattr(learner.agent, 'summary_scalars', {}).items()}},
                {'learner/train_steps': step})
            if 'learner/train_steps_per_sec' in values:
                summaries.write(counters['inserted'], {
                    tags.TRAIN_STEPS_PER_SEC: values['learner/train_steps_per_sec']})
            next_summary = time.monotonic() + settings.summary_interval_s
