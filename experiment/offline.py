"""Offline training: learn from an RLDS dataset only; the env is used for evaluation.

`train_offline` is selected by `experiment.kind = 'offline'` (see
configs/base/cql_sac.gin). The dataset is loaded into the configured replay
backend (all of it, checked) and the agent takes gradient steps in compiled
chunks, exactly as the online loop's train half does; TensorBoard's step axis
is the gradient step. The dataset is not checkpointed: a resumed run reloads
it from disk, which gives the same buffer.
"""

import os
import time

import gin
import tensorflow as tf
from tf_agents.environments import tf_py_environment

from buffers.uniform import UniformReplay
from core import rundir, tags
from core.errors import UserError
from core.export import export_policy
from core.gin_utils import unused_bindings
from core.tf_setup import configure_tf
from envs.suite import make_env
from experiment.checkpointing import Checkpointer
from experiment.evaluation import Evaluator
from experiment.loop import FusedLoop
from experiment.progress import Progress
from experiment.run import Interrupt, crossed
from experiment.run_state import RunState
from experiment.summaries import SummaryWriter
from rlds_io.files import Dataset
from rlds_io.importing import load_dataset_into_backend


@gin.configurable(denylist=['root_dir', 'seed', 'force'])
def train_offline(root_dir, seed=0, force=False, *,
                  make_agent=gin.REQUIRED,
                  dataset_dir=gin.REQUIRED,
                  num_train_steps=50_000,
                  train_steps_per_iteration=500,
                  batch_size=256,
                  replay_backend=UniformReplay,
                  eval_interval=5_000,
                  num_eval_episodes=10,
                  checkpoint_interval=10_000,
                  summary_interval=1_000,
                  use_xla=False,
                  tf_threads=1,
                  export_final_policy=True,
                  verbose=True):
    """Trains `make_agent`'s agent on a dataset; resumes if root_dir holds this run.

    Args:
      root_dir, seed, force: as for `run` (from the command line).
      make_agent: agent factory, e.g. `@cql_sac.make_agent`.
      dataset_dir: an RLDS dataset directory (make_dataset.py or run.record_dataset).
      num_train_steps: gradient steps in total.
      train_steps_per_iteration: gradient steps per compiled chunk.
      batch_size: windows per gradient step.
      replay_backend: the backend class the dataset is loaded into.
      eval_interval: gradient steps between greedy evaluations.
      num_eval_episodes: episodes per evaluation, played side by side.
      checkpoint_interval: gradient steps between checkpoints.
      summary_interval: gradient steps between training summaries.
      use_xla: jit-compile the train chunk when the backend supports it.
      tf_threads: TF intra/inter-op threads.
      export_final_policy: write the greedy policy as a SavedModel at the end.
      verbose: print progress lines.

    Returns:
      A dict of final metrics (also written to root_dir/metrics.json).
    """
    if num_train_steps < 1 or train_steps_per_iteration < 1:
        raise UserError("train_offline.num_train_steps and train_steps_per_iteration must be "
                        "positive.")
    dataset = Dataset(dataset_dir)
    resuming = rundir.prepare(root_dir, gin.config_str(), force=force)
    configure_tf(seed, tf_threads)
    train_step = tf.Variable(0, dtype=tf.int64, name='train_step')
    with gin.config_scope('eval'):
        eval_env = make_env(num_envs=num_eval_episodes, seed=seed + 10_000)
    tf_env = tf_py_environment.TFPyEnvironment(eval_env)
    dataset.check_specs(tf_env.time_step_spec(), tf_env.action_spec())
    agent = make_agent(tf_env.time_step_spec(), tf_env.action_spec(), train_step)
    num_steps = agent.train_sequence_length or 2
    backend = load_dataset_into_backend(
        dataset, replay_backend, spec=agent.collect_data_spec, batch_size=batch_size,
        num_steps=num_steps, seed=seed, verbose=verbose)
    run_state = RunState()
    checkpointer = Checkpointer(os.path.join(root_dir, 'checkpoints'), agent=agent,
                                train_step=train_step, run_state=run_state)
    if resuming:
        restored = checkpointer.restore_latest()
        if restored and verbose:
            print(f"Resuming from {restored} at train step {int(train_step.numpy()):,}.",
                  flush=True)
    if train_step.numpy() > 0:
        tf.random.set_seed(seed * 1_000_003 + int(train_step.numpy()))
    loop = FusedLoop(agent=agent, tf_env=tf_env, backend=backend, observers=[],
                     env_steps=tf.Variable(0, dtype=tf.int64), batch_size=batch_size,
                     num_steps=num_steps, train_steps=train_steps_per_iteration,
                     use_xla=use_xla)
    evaluator = Evaluator(eval_env, agent.policy)
    start_step = int(train_step.numpy())
    writer = SummaryWriter(root_dir, resume_step=start_step or None)
    progress = Progress(num_train_steps, start_step=start_step, enabled=verbose,
                        unit='train steps')
    behaviour_return = dataset.metadata.get('average_return')

    def evaluate(step):
        average_return, average_length = evaluator()
        writer.scalars({tags.EVAL_AVERAGE_RETURN: average_return,
                        tags.EVAL_AVERAGE_EPISODE_LENGTH: average_length}, step)
        run_state.record_eval(step, average_return, None)
        progress.line(step, average_return)

    def save_checkpoint(step):
        writer.flush()
        run_state.add_wall_time(progress.lap())
        checkpointer.save(step)

    if start_step == 0:
        writer.operative_config(gin.config_str(), 0)
        evaluate(0)  # the untrained policy: the baseline the curve starts from
    interrupted = False
    step = start_step
    last_time, last_step = time.perf_counter(), step
    with Interrupt() as interrupt:
        while step < num_train_steps:
            if interrupt.requested:
                interrupted = True
                break
            diagnostics = loop.train()
            before, step = step, int(train_step.numpy())
            if crossed(summary_interval, before, step):
                now = time.perf_counter()
                values = {'train/' + name: value.numpy() for name, value in diagnostics.items()}
                values.update({name: float(fn()) for name, fn in agent.summary_scalars.items()})
                values[tags.TRAIN_STEPS_PER_SEC] = (step - last_step) / max(now - last_time, 1e-9)
                last_time, last_step = now, step
                writer.scalars(values, step)
            if crossed(eval_interval, before, step):
                evaluate(step)
            else:
                progress.maybe_line(step, run_state.last_eval_return)
            if crossed(checkpoint_interval, before, step):
                save_checkpoint(step)
        step = int(train_step.numpy())
        if not interrupted and run_state.last_eval_step != step:
            evaluate(step)
        save_checkpoint(step)
    writer.operative_config(gin.operative_config_str(), step)
    writer.close()
    rundir.atomic_write_text(os.path.join(root_dir, 'operative_config.gin'),
                             gin.operative_config_str())
    if export_final_policy and not interrupted:
        export_policy(agent.policy, os.path.join(root_dir, 'policy'), train_step)
    metrics = {
        'train_steps': step,
        'dataset_steps': int(backend.metrics()['size']),
        'dataset_episodes': dataset.num_episodes,
        'behaviour_return': behaviour_return,
        'final_eval_return': run_state.last_eval_return,
        'best_eval_return': run_state.best_eval_return,
        'interrupted': interrupted,
        'wall_time_s': run_state.wall_time_s,
        'train_steps_per_sec': (step - start_step) / max(progress.elapsed(), 1e-9),
        'unused_bindings': unused_bindings(),
    }
    rundir.write_metrics(root_dir, metrics)
    backend.close()
    eval_env.close()
    if interrupted and verbose:
        print(f"Interrupted at train step {step:,}: checkpoint saved; rerun the same command "
              "to resume.", flush=True)
    return metrics
