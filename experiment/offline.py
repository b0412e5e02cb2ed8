"""Offline training: the Trainer without collection (`train_offline.*` bindings).

Selected by `experiment.kind = 'offline'` (see configs/base/cql_sac.gin). The
dataset is loaded into the configured replay backend (all of it, checked) and
the agent takes gradient steps in compiled chunks through the same `Training`
as online runs; TensorBoard's step axis is the gradient step. The dataset is
not checkpointed: a resumed run reloads it from disk, which gives the same
buffer.
"""

import time

import tensorflow as tf
from tf_agents.environments import tf_py_environment

from core import seeds, tags
from experiment import config as config_lib
from experiment import staged_agent
from experiment.judging import eval_env
from experiment.loop import ALL_FINITE, Training
from experiment.replay import Mode, build_replay
from experiment.run_session import RunSession
from experiment.trainer import Hook, Trainer
from rlds_io.files import Dataset


def train_offline(root_dir, seed=0, force=False, config=None):
    """Trains the configured agent on a dataset; resumes if root_dir holds this run.

    Args:
      root_dir, seed, force: as for `train_online` (from the command line).
      config: an `OfflineConfig`; default: the one Gin binds (`train_offline.*`).

    Returns:
      A dict of final metrics (also written to root_dir/metrics.json).
    """
    config = config or config_lib.load(config_lib.OfflineConfig)
    dataset = Dataset(config.dataset_dir)
    with RunSession(root_dir, seed=seed, force=force, tf_threads=config.tf_threads,
                    verbose=config.verbose, unit='train steps') as session:
        return _train(session, config, dataset, seed)


def _train(session, config, dataset, seed):
    evaluation_env = eval_env(config.num_eval_episodes, seeds.evaluation(seed))
    tf_env = tf_py_environment.TFPyEnvironment(evaluation_env)
    dataset.check_specs(tf_env.time_step_spec(), tf_env.action_spec())
    # No collection here: observation statistics follow the batches sampled from the dataset.
    agent = staged_agent.build_agent(
        config.make_agent, config.preprocessing, tf_env.time_step_spec(), tf_env.action_spec(),
        session.train_step, num_envs=tf_env.batch_size, collects=False,
        frame_stack=config.frame_stack)
    # With frame stacks (a pixel dataset holds one frame per step), replay keeps single frames
    # (FrameStackedReplay.storage='memmap' puts them in root_dir/replay_frames) and samples stacks.
    replay = build_replay(Mode.OFFLINE, config, agent, num_envs=1, seed=seed,
                          root_dir=session.root_dir, dataset=dataset)
    backend, num_steps = replay.backend, replay.num_steps
    start_step = session.restore(session.train_step, **agent.checkpoint_items())
    if start_step > 0:
        tf.random.set_seed(seeds.resumed(seed, start_step))
    training = Training(agent=agent, backend=backend, batch_size=config.batch_size,
                        num_steps=num_steps, train_steps=config.train_steps_per_iteration,
                        use_xla=config.use_xla, sample_ahead=config.sample_ahead)
    trainer = Trainer(session, start_step, budget=config.num_train_steps, policy=agent.policy,
                      eval_env=evaluation_env, config=config, on_nonfinite=config.on_nonfinite)
    if start_step == 0:
        trainer.evaluate(0)  # the untrained policy: the baseline the curve starts from
    rate = _Rate(start_step)

    def write_summaries(step, diagnostics):
        values = {'train/' + name: value.numpy() for name, value in diagnostics.items()
                  if name != ALL_FINITE}
        values.update({name: float(value) for name, value in agent.summary_scalars().items()})
        values[tags.TRAIN_STEPS_PER_SEC] = rate(step)
        trainer.writer.scalars(values, step)
        trainer.writer.kinds(agent.stage_summaries(), step)

    hooks = [Hook(config.summary_interval, write_summaries),
             Hook(config.eval_interval, trainer.evaluate),
             Hook(config.video_interval, trainer.record_video),
             Hook(config.checkpoint_interval, trainer.save_checkpoint)]
    step = trainer.run(lambda step: training.train(), step_of=lambda: int(
        trainer.train_step.numpy()), budget=config.num_train_steps, hooks=hooks)
    trainer.close_out(step, export=config.export_final_policy)
    metrics = trainer.report(step, {
        'train_steps': step,
        'dataset_steps': int(backend.metrics()['size']),
        'dataset_episodes': dataset.num_episodes,
        'behaviour_return': dataset.metadata.get('average_return'),
        'train_steps_per_sec': trainer.rate(step),
    })
    backend.close()
    evaluation_env.close()
    return metrics


class _Rate:
    """Steps per second since the previous call."""

    def __init__(self, step):
        self._time, self._step = time.perf_counter(), step

    def __call__(self, step):
        now = time.perf_counter()
        rate = (step - self._step) / max(now - self._time, 1e-9)
        self._time, self._step = now, step
        return rate
