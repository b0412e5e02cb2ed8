"""The experiment wiring: the only place that constructs and connects objects.

`run` builds the envs, the agent, the replay backend, the compiled loop, the
checkpointer and the summary writer, then trains: initial random collection,
collect/train chunks at the configured ratio, periodic greedy evaluation,
summaries and checkpoints, and finally a SavedModel of the greedy policy.
It returns the final metrics (tests and sweeps assert on them).
"""

import os
import signal

import gin
import tensorflow as tf
from tf_agents.environments import tf_py_environment
from tf_agents.metrics import tf_metrics

from buffers.mixing import MixedReplay
from buffers.uniform import UniformReplay
from core import rundir, tags
from core.errors import UserError
from core.export import export_policy, export_snapshot
from core.gin_utils import unused_bindings
from core.schedules import linear_schedule
from core.tf_setup import configure_tf
from envs.suite import make_env
from experiment.buffer_probe import BufferProbe
from experiment.checkpointing import Checkpointer
from experiment.evaluation import Evaluator
from experiment.loop import FusedLoop
from experiment.progress import Progress
from experiment.run_state import RunState
from experiment.summaries import SummaryWriter
from experiment.train_summaries import TrainSummaries
from rlds_io.files import Dataset
from rlds_io.importing import load_dataset_into_backend
from rlds_io.recording import ExperienceRecorder


class Interrupt:
    """Turns SIGINT into a flag the loop checks between chunks."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self):
        try:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread: leave signals alone
            self._previous = None
        return self

    def _handle(self, signum, frame):
        del signum, frame
        self.requested = True

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _validate(*, num_env_steps, collect_steps_per_iteration, num_envs, train_steps_per_iteration,
              initial_collect_steps, batch_size):
    if collect_steps_per_iteration % num_envs:
        raise UserError(
            f"run.collect_steps_per_iteration={collect_steps_per_iteration} is not a multiple of "
            f"make_env.num_envs={num_envs}: every env copy steps equally, so pick a multiple.")
    if train_steps_per_iteration < 1 or num_env_steps < 1 or batch_size < 1:
        raise UserError("run.train_steps_per_iteration, run.num_env_steps and run.batch_size "
                        "must be positive.")
    if initial_collect_steps < batch_size:
        raise UserError(
            f"run.initial_collect_steps={initial_collect_steps} is below batch_size={batch_size}: "
            "the first gradient step would sample from a nearly empty buffer; raise it.")


def _resume_seed(seed, env_step):
    """A fresh, reproducible seed for RNG streams restarted at a resume."""
    return seed if env_step == 0 else (seed * 1_000_003 + env_step) % (2**31 - 1)


def crossed(interval, before, after):
    return interval > 0 and after // interval > before // interval


def _initialize_agent(agent, run_dir, verbose):
    """Loads the agent's weights (and optimizer state) from another run's latest checkpoint."""
    path = tf.train.latest_checkpoint(os.path.join(run_dir, 'checkpoints'))
    if path is None:
        raise UserError(f"run.initialize_from={run_dir!r} holds no checkpoint: point it at a "
                        "finished run directory (one with checkpoints/).")
    try:
        tf.train.Checkpoint(agent=agent).restore(path).expect_partial() \
            .assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as error:
        reason = str(error).strip().splitlines()[0][:160]
        raise UserError(f"Cannot start from {path} ({reason}): the agent there must be the "
                        "same kind and size as this run's.") from None
    if verbose:
        print(f"Starting from the agent weights of {path}.", flush=True)


def _write_recorded_dataset(recorder, root_dir, tf_env, verbose):
    metadata = recorder.write_dataset(
        os.path.join(root_dir, 'dataset'), observation_spec=tf_env.observation_spec(),
        action_spec=tf_env.action_spec(),
        metadata={'kind': 'replay', 'source': root_dir})
    if verbose:
        print(f"Wrote the recorded experience to {root_dir}/dataset: "
              f"{metadata['num_steps']:,} steps in {metadata['num_episodes']:,} episodes, "
              f"average return {metadata['average_return']:.1f}.", flush=True)


@gin.configurable(denylist=['root_dir', 'seed', 'force'])
def run(root_dir, seed=0, force=False, *,
        make_agent=gin.REQUIRED,
        num_env_steps=50_000,
        initial_collect_steps=1_000,
        collect_steps_per_iteration=32,
        train_steps_per_iteration=32,
        batch_size=64,
        replay_backend=UniformReplay,
        replay_capacity=100_000,
        importance_beta_start=0.4,
        importance_beta_anneal_steps=None,
        eval_interval=5_000,
        num_eval_episodes=10,
        target_return=None,
        stop_at_target_return=False,
        checkpoint_interval=10_000,
        summary_interval=1_000,
        use_xla=True,
        tf_threads=1,
        export_final_policy=True,
        policy_snapshot_interval=0,
        record_dataset=False,
        logged_dataset=None,
        logged_fraction=0.25,
        initialize_from=None,
        verbose=True):
    """Trains one agent; resumes if root_dir already holds this run.

    Args:
      root_dir: run directory (not configurable; from --root_dir).
      seed: run seed (not configurable; from --seed).
      force: resume even though the config changed (from --force).
      make_agent: agent factory, e.g. `@dqn.make_agent`.
      num_env_steps: total env steps, summed over env copies, initial collection included.
      initial_collect_steps: env steps of uniform-random actions before training.
      collect_steps_per_iteration: env steps (over all copies) per collect chunk.
      train_steps_per_iteration: gradient steps per train chunk; the ratio of the
        two is the replay ratio (1:1 is one gradient step per env step).
      batch_size: windows per gradient step.
      replay_backend: the backend class, e.g. `@UniformReplay`.
      replay_capacity: transitions kept (over all env copies).
      importance_beta_start: prioritized replay's importance-sampling exponent
        at the start; it rises linearly to 1 (full correction).
      importance_beta_anneal_steps: env steps over which beta reaches 1
        (default: the whole run). Uniform backends get weights of exactly 1.
      eval_interval: env steps between greedy evaluations.
      num_eval_episodes: episodes per evaluation, played side by side.
      target_return: eval return that counts as solved (reported as steps_to_target).
      stop_at_target_return: stop training once target_return is reached.
      checkpoint_interval: env steps between checkpoints.
      summary_interval: env steps between training summaries.
      use_xla: jit-compile the train chunk when the backend supports it.
      tf_threads: TF intra/inter-op threads (1 is fastest for small networks).
      export_final_policy: write the greedy policy as a SavedModel at the end.
      policy_snapshot_interval: env steps between snapshots of the greedy policy
        (with their eval return) under root_dir/policies/; 0 = none. They are
        the behaviour policies of 'medium' datasets (make_dataset.py).
      record_dataset: record every collected episode and write them at the end
        as an RLDS dataset in root_dir/dataset (the 'replay' dataset kind).
      logged_dataset: an RLDS dataset directory mixed into every batch
        (offline-to-online); None trains on online experience only.
      logged_fraction: the share of each batch drawn from `logged_dataset`.
      initialize_from: a run directory (e.g. an offline CQL-SAC run) whose
        latest checkpoint's agent weights this run starts from; its initial
        collection then uses that agent's collect policy, not random actions.
      verbose: print progress lines.

    Returns:
      A dict of final metrics (also written to root_dir/metrics.json).
    """
    resuming = rundir.prepare(root_dir, gin.config_str(), force=force)
    configure_tf(seed, tf_threads)
    env_step = tf.Variable(0, dtype=tf.int64, name='env_step')
    train_step = tf.Variable(0, dtype=tf.int64, name='train_step')

    probe_env = make_env(seed=seed)
    num_envs = probe_env.batch_size
    _validate(num_env_steps=num_env_steps, collect_steps_per_iteration=collect_steps_per_iteration,
              num_envs=num_envs, train_steps_per_iteration=train_steps_per_iteration,
              initial_collect_steps=initial_collect_steps, batch_size=batch_size)
    tf_env = tf_py_environment.TFPyEnvironment(probe_env)
    agent = make_agent(tf_env.time_step_spec(), tf_env.action_spec(), train_step)
    num_steps = agent.train_sequence_length or 2
    backend_options = {}
    if getattr(replay_backend, 'writes_own_checkpoints', False):
        # Reverb writes its table checkpoints itself; they must outlive the process to resume.
        backend_options['checkpoint_dir'] = os.path.join(root_dir, 'checkpoints', 'replay')
    backend = replay_backend(agent.collect_data_spec, capacity=replay_capacity, num_envs=num_envs,
                             batch_size=batch_size, num_steps=num_steps, seed=seed,
                             **backend_options)
    if logged_dataset:
        dataset = Dataset(logged_dataset)
        dataset.check_specs(tf_env.time_step_spec(), tf_env.action_spec())
        logged = load_dataset_into_backend(
            dataset, UniformReplay, spec=agent.collect_data_spec, batch_size=batch_size,
            num_steps=num_steps, seed=seed, verbose=verbose)
        backend = MixedReplay(backend, logged, logged_fraction=logged_fraction,
                              batch_size=batch_size)
    train_metrics = {
        tags.TRAIN_AVERAGE_RETURN: tf_metrics.AverageReturnMetric(batch_size=num_envs),
        tags.TRAIN_AVERAGE_EPISODE_LENGTH:
            tf_metrics.AverageEpisodeLengthMetric(batch_size=num_envs),
        tags.TRAIN_EPISODES: tf_metrics.NumberOfEpisodes(),
    }
    run_state = RunState()
    checkpointer = Checkpointer(
        os.path.join(root_dir, 'checkpoints'), agent=agent, env_step=env_step, run_state=run_state,
        train_step=train_step, replay=backend.checkpoint_items(),
        metrics=list(train_metrics.values()))
    if resuming:
        restored = checkpointer.restore_latest()
        if restored and verbose:
            print(f"Resuming from {restored} at env step {int(env_step.numpy()):,}.", flush=True)
    if initialize_from and env_step.numpy() == 0:
        _initialize_agent(agent, initialize_from, verbose)
    if env_step.numpy() > 0:
        # Restarted RNG streams must not replay the first run's random numbers.
        tf.random.set_seed(_resume_seed(seed, int(env_step.numpy())))
        probe_env.close()
        probe_env = make_env(seed=_resume_seed(seed, int(env_step.numpy())))
        tf_env = tf_py_environment.TFPyEnvironment(probe_env)

    with gin.config_scope('eval'):
        eval_env = make_env(num_envs=num_eval_episodes, seed=seed + 10_000)
    evaluator = Evaluator(eval_env, agent.policy)
    importance_beta = linear_schedule(env_step, importance_beta_start, 1.0,
                                      importance_beta_anneal_steps or num_env_steps)
    recorder = None
    if record_dataset:
        recorder = ExperienceRecorder(os.path.join(root_dir, 'recorded'), agent.collect_data_spec,
                                      num_envs, resume_step=int(env_step.numpy()))
    loop = FusedLoop(agent=agent, tf_env=tf_env, backend=backend,
                     observers=list(train_metrics.values()) + ([recorder] if recorder else []),
                     env_steps=env_step,
                     batch_size=batch_size, num_steps=num_steps,
                     train_steps=train_steps_per_iteration, use_xla=use_xla,
                     importance_beta=importance_beta)
    resume_step = int(env_step.numpy()) or None
    writer = SummaryWriter(root_dir, resume_step=resume_step)
    summaries = TrainSummaries(
        writer, agent=agent, backend=backend, train_metrics=train_metrics, train_step=train_step,
        probe=BufferProbe(backend, batch_size=batch_size, num_steps=num_steps,
                          importance_beta=importance_beta))
    progress = Progress(num_env_steps, start_step=int(env_step.numpy()), enabled=verbose)
    steps_per_chunk = collect_steps_per_iteration // num_envs
    interrupted = False

    def evaluate(step):
        average_return, average_length = evaluator()
        writer.scalars({tags.EVAL_AVERAGE_RETURN: average_return,
                        tags.EVAL_AVERAGE_EPISODE_LENGTH: average_length}, step)
        run_state.record_eval(step, average_return, target_return)
        progress.line(step, average_return)

    def save_checkpoint(step):
        writer.flush()  # flush first: events never outrun the checkpoint they belong to
        run_state.add_wall_time(progress.lap())
        if recorder:
            recorder.save_shard(step)
        checkpointer.save(step)

    def snapshot(step):
        if run_state.last_eval_step != step:
            evaluate(step)
        export_snapshot(agent.policy, root_dir, step, train_step, run_state.last_eval_return)

    start_step = int(env_step.numpy())
    if start_step == 0:
        writer.operative_config(gin.config_str(), 0)
        if initialize_from:
            evaluate(0)  # where the initial weights start: the bar online training must beat
    initial_collect = loop.collect_with_agent if initialize_from else loop.collect_random
    with Interrupt() as interrupt:
        while int(env_step.numpy()) < initial_collect_steps and not interrupt.requested:
            initial_collect(tf.constant(steps_per_chunk, tf.int32))
        summaries.start(int(env_step.numpy()))
        step = int(env_step.numpy())
        while step < num_env_steps:
            if interrupt.requested:
                interrupted = True
                break
            # The last chunk is clipped so the run stops exactly at its budget.
            chunk = min(steps_per_chunk, -(-(num_env_steps - step) // num_envs))
            diagnostics = loop.iterate(tf.constant(chunk, tf.int32))
            before, step = step, int(env_step.numpy())
            if crossed(summary_interval, before, step):
                summaries.write(step, diagnostics)
            if crossed(eval_interval, before, step):
                evaluate(step)
                if stop_at_target_return and run_state.steps_to_target is not None:
                    break
            else:
                progress.maybe_line(step, run_state.last_eval_return)
            if crossed(policy_snapshot_interval, before, step):
                snapshot(step)
            if crossed(checkpoint_interval, before, step):
                save_checkpoint(step)
        step = int(env_step.numpy())
        if not interrupted and run_state.last_eval_step != step:
            evaluate(step)
        save_checkpoint(step)
    writer.operative_config(gin.operative_config_str(), step)
    writer.close()
    rundir.atomic_write_text(os.path.join(root_dir, 'operative_config.gin'),
                             gin.operative_config_str())
    if export_final_policy and not interrupted:
        export_policy(agent.policy, os.path.join(root_dir, 'policy'), train_step)
    if recorder and not interrupted:
        _write_recorded_dataset(recorder, root_dir, tf_env, verbose)
    metrics = {
        'env_steps': step,
        'train_steps': int(train_step.numpy()),
        'final_eval_return': run_state.last_eval_return,
        'best_eval_return': run_state.best_eval_return,
        'steps_to_target': run_state.steps_to_target,
        'interrupted': interrupted,
        'uses_xla': loop.uses_xla,
        'wall_time_s': run_state.wall_time_s,
        'env_steps_per_sec': (step - start_step) / max(progress.elapsed(), 1e-9),
        'buffer_size': backend.metrics()['size'],
        'unused_bindings': unused_bindings(),
    }
    rundir.write_metrics(root_dir, metrics)
    backend.close()
    probe_env.close()
    eval_env.close()
    if metrics['unused_bindings'] and verbose:
        print("warning: these Gin bindings had no effect (check scope and spelling): "
              + ', '.join(metrics['unused_bindings']), flush=True)
    if interrupted and verbose:
        print(f"Interrupted at env step {step:,}: checkpoint saved; rerun the same command "
              "to resume.", flush=True)
    return metrics

