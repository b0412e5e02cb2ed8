"""Online training: the Trainer with a fused collect/train chunk (`run.*` bindings).

`train_online` builds the envs, the agent, the replay backend (optionally
mixed with a logged dataset) and the compiled loop, then trains: initial
collection, collect/train chunks at the configured ratio, and the periodic
work as hooks (summaries, evaluation, policy snapshots, checkpoints). It
returns the final metrics (tests and sweeps assert on them).
"""

import os

import tensorflow as tf
from tf_agents.environments import tf_py_environment
from tf_agents.metrics import tf_metrics

from buffers.base import allow_concurrent_writes
from core import seeds, tags
from core.errors import UserError
from core.schedules import linear_schedule
from envs.suite import make_env
from experiment import config as config_lib
from experiment import staged_agent
from experiment.buffer_probe import BufferProbe
from experiment.judging import eval_env
from experiment.loop import FusedLoop
from experiment.replay import Mode, build_replay
from experiment.run_session import RunSession
from experiment.train_summaries import TrainSummaries
from experiment.trainer import Hook, Trainer
from rlds_io.recording import ExperienceRecorder


def train_online(root_dir, seed=0, force=False, config=None):
    """Trains one agent online; resumes if root_dir already holds this run.

    Args:
      root_dir: run directory (from --root_dir).
      seed: run seed (from --seed).
      force: resume even though the config changed (from --force).
      config: a `RunConfig`; default: the one Gin binds (`run.*`).

    Returns:
      A dict of final metrics (also written to root_dir/metrics.json).
    """
    config = config or config_lib.load(config_lib.RunConfig)
    with RunSession(root_dir, seed=seed, force=force, tf_threads=config.tf_threads,
                    verbose=config.verbose, unit='env steps') as session:
        return _train(session, config, seed)


def _train(session, config, seed):
    env_step = tf.Variable(0, dtype=tf.int64, name='env_step')
    env = make_env(seed=seed)
    num_envs = env.batch_size
    config.check_num_envs(num_envs)
    tf_env = tf_py_environment.TFPyEnvironment(env)
    agent = staged_agent.build_agent(
        config.make_agent, config.preprocessing, tf_env.time_step_spec(), tf_env.action_spec(),
        session.train_step, num_envs=num_envs, collects=True, frame_stack=config.frame_stack)
    replay = build_replay(Mode.SINGLE, config, agent, num_envs=num_envs, seed=seed,
                          root_dir=session.root_dir,
                          env_specs=(tf_env.time_step_spec(), tf_env.action_spec()))
    backend, num_steps = replay.backend, replay.num_steps
    if config.overlap_collection:
        allow_concurrent_writes(backend, config.collect_steps_per_iteration // num_envs)
    train_metrics = {
        tags.TRAIN_AVERAGE_RETURN: tf_metrics.AverageReturnMetric(batch_size=num_envs),
        tags.TRAIN_AVERAGE_EPISODE_LENGTH:
            tf_metrics.AverageEpisodeLengthMetric(batch_size=num_envs),
        tags.TRAIN_EPISODES: tf_metrics.NumberOfEpisodes(),
    }
    start_step = session.restore(env_step, **agent.checkpoint_items(),
                                 env_step=env_step,
                                 replay=backend.checkpoint_items(),
                                 metrics=list(train_metrics.values()))
    if config.initialize_from and start_step == 0:
        _initialize_agent(agent, config.initialize_from, session)
    if start_step > 0:
        # Restarted RNG streams must not replay the first run's random numbers.
        tf.random.set_seed(seeds.resumed(seed, start_step))
        env.close()
        env = make_env(seed=seeds.resumed(seed, start_step))
        tf_env = tf_py_environment.TFPyEnvironment(env)
    evaluation_env = eval_env(config.num_eval_episodes, seeds.evaluation(seed))
    importance_beta = linear_schedule(env_step, config.importance_beta_start, 1.0,
                                      config.importance_beta_anneal_steps or config.num_env_steps)
    recorder = None
    if config.record_dataset:
        recorder = ExperienceRecorder(os.path.join(session.root_dir, 'recorded'),
                                      agent.collect_data_spec, num_envs, resume_step=start_step)
    loop = FusedLoop(agent=agent, tf_env=tf_env, backend=backend,
                     observers=(list(train_metrics.values()) + ([recorder] if recorder else [])
                                + agent.collection_observers()),
                     env_steps=env_step, batch_size=config.batch_size, num_steps=num_steps,
                     train_steps=config.train_steps_per_iteration, use_xla=config.use_xla,
                     importance_beta=importance_beta,
                     chunk_observers=agent.chunk_observers(),
                     sample_ahead=config.sample_ahead,
                     overlap_collection=config.overlap_collection)
    trainer = Trainer(session, start_step, budget=config.num_env_steps, policy=agent.policy,
                      eval_env=evaluation_env, config=config,
                      target_return=config.target_return, on_nonfinite=config.on_nonfinite,
                      snapshot_collect_policy=(agent.collect_policy
                                               if config.snapshot_collect_policy else None))
    if recorder:
        trainer.on_checkpoint(recorder.save_shard)
    summaries = TrainSummaries(
        trainer.writer, agent=agent, backend=backend, train_metrics=train_metrics,
        train_step=trainer.train_step, extra=lambda: agent.stage_summaries('scalar'),
        probe=BufferProbe(backend, batch_size=config.batch_size, num_steps=num_steps,
                          importance_beta=importance_beta))
    if start_step == 0 and config.initialize_from:
        trainer.evaluate(0)  # where the initial weights start: the bar online training must beat

    step = _collect_initial(trainer, loop, config, env_step, num_envs,
                            minimum=_one_window_per_copy(session, config, num_steps, num_envs,
                                                         int(env_step.numpy())))
    agent.end_warmup()
    summaries.start(step)
    steps_per_chunk = config.collect_steps_per_iteration // num_envs

    def chunk(step):
        # The last chunk is clipped so the run stops exactly at its budget.
        steps = min(steps_per_chunk, -(-(config.num_env_steps - step) // num_envs))
        return loop.iterate(tf.constant(steps, tf.int32))

    def write_statistics(step, diagnostics):
        # Histograms cost milliseconds each to write: with checkpoints, not every summary.
        del diagnostics
        trainer.writer.kinds(agent.stage_summaries('histogram'), step)

    hooks = [Hook(config.summary_interval, summaries.write),
             Hook(config.checkpoint_interval or config.summary_interval, write_statistics),
             Hook(config.eval_interval, trainer.evaluate),
             Hook(config.policy_snapshot_interval, trainer.snapshot),
             Hook(config.video_interval, trainer.record_video),
             Hook(config.checkpoint_interval, trainer.save_checkpoint)]
    solved = lambda: (config.stop_at_target_return  # noqa: E731
                      and trainer.run_state.steps_to_target is not None)
    step = trainer.run(chunk, step_of=lambda: int(env_step.numpy()),
                       budget=config.num_env_steps, hooks=hooks, done=solved)
    trainer.close_out(step, export=config.export_final_policy)
    if recorder and not trainer.interrupted:
        _write_recorded_dataset(recorder, trainer, tf_env)
    metrics = trainer.report(step, {
        'env_steps': step,
        'train_steps': int(trainer.train_step.numpy()),
        'steps_to_target': trainer.run_state.steps_to_target,
        'uses_xla': loop.uses_xla,
        'env_steps_per_sec': trainer.rate(step),
        'buffer_size': backend.metrics()['size'],
    })
    backend.close()
    env.close()
    evaluation_env.close()
    return metrics


def _one_window_per_copy(session, config, num_steps, num_envs, step):
    """Env steps the warm-up needs so that every copy holds one whole sampled window.

    Only recurrent agents' sequences (tens of steps) can be longer than
    `run.initial_collect_steps` spreads over the copies (e.g. a smoke-test mixin's 64
    steps); sampling before then would draw windows that do not exist yet. The warm-up then
    runs longer, and says so.
    """
    minimum = num_steps * num_envs
    if config.initial_collect_steps < minimum and step < minimum:
        session.say(f"Warm-up: {minimum:,} env steps, not run.initial_collect_steps="
                    f"{config.initial_collect_steps:,}: one {num_steps}-step sequence per env "
                    f"copy ({num_envs}) must be stored before the first one is sampled.")
    return minimum


def _collect_initial(trainer, loop, config, env_step, num_envs, minimum=0):
    """Random actions (or the initial agent's) until `initial_collect_steps` (and at least
    `minimum`); returns the step."""
    collect = loop.collect_with_agent if config.initialize_from else loop.collect_random
    steps = tf.constant(config.collect_steps_per_iteration // num_envs, tf.int32)
    warmup = max(config.initial_collect_steps, minimum)
    while int(env_step.numpy()) < warmup and not trainer.stop_requested:
        collect(steps)
    return int(env_step.numpy())


def _initialize_agent(agent, run_dir, session):
    """Loads the agent's weights (and optimizer state, and the preprocessing statistics) from
    another run's latest checkpoint."""
    path = tf.train.latest_checkpoint(os.path.join(run_dir, 'checkpoints'))
    if path is None:
        raise UserError(f"run.initialize_from={run_dir!r} holds no checkpoint: point it at a "
                        "finished run directory (one with checkpoints/).")
    items = agent.checkpoint_items()
    has_statistics = any(name.startswith('preprocess/')
                         for name, _ in tf.train.list_variables(path))
    if has_statistics != ('preprocess' in items):
        that, this = ('with', 'has none') if has_statistics else ('without', 'has one')
        raise UserError(
            f"Cannot start from {path}: that run was trained {that} a preprocessing stage and "
            f"this one {this}; its weights expect other inputs. Use the same run.preprocessing "
            "as that run.")
    optimizers = [(optimizer, optimizer.get_config()) for optimizer in _optimizers(items)]
    try:
        # The stage's statistics come along: the weights were trained on inputs they shaped.
        tf.train.Checkpoint(**items).restore(path).expect_partial() \
            .assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as error:
        reason = str(error).strip().splitlines()[0][:160]
        raise UserError(f"Cannot start from {path} ({reason}): the agent there must be the "
                        "same kind and size as this run's.") from None
    for optimizer, configured in optimizers:
        _keep_configured_hyperparameters(optimizer, configured)
    session.say(f"Starting from the agent weights of {path}.")


OPTIMIZER_HYPERPARAMETERS = ('learning_rate', 'beta_1', 'beta_2', 'rho', 'momentum', 'decay')


def _optimizers(items):
    """Every Keras optimizer the checkpointed objects hold (the agent's, however nested)."""
    found = []
    for item in items.values():
        for trackable in tf.train.TrackableView(item).descendants():
            if isinstance(trackable, tf.keras.optimizers.legacy.Optimizer) and \
                    all(trackable is not other for other in found):
                found.append(trackable)
    return found


def _keep_configured_hyperparameters(optimizer, configured):
    """This run's learning rate (and the other hyperparameters) over the checkpoint's.

    The source run's checkpoint holds its optimizer's hyperparameters as variables, which
    Keras creates lazily and the pending restore then fills: a different learning rate in
    this run's config would silently lose to the old one. Reading `learning_rate` creates
    them now (the restore fills them), then this run's values are written over them; the
    optimizer's moments (its slots) stay the checkpoint's.
    """
    created = optimizer.learning_rate  # reading one hyperparameter creates them all
    del created
    for name in OPTIMIZER_HYPERPARAMETERS:
        # A learning-rate schedule is an object of this run's, never a restored variable.
        if isinstance(configured.get(name), (int, float)):
            setattr(optimizer, name, configured[name])


def _write_recorded_dataset(recorder, trainer, tf_env):
    metadata = recorder.write_dataset(
        os.path.join(trainer.root_dir, 'dataset'), observation_spec=tf_env.observation_spec(),
        action_spec=tf_env.action_spec(),
        metadata={'kind': 'replay', 'source': trainer.root_dir})
    trainer.say(f"Wrote the recorded experience to {trainer.root_dir}/dataset: "
                f"{metadata['num_steps']:,} steps in {metadata['num_episodes']:,} episodes, "
                f"average return {metadata['average_return']:.1f}.")
