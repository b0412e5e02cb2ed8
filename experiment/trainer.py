"""The experiment core every training process shares.

A `Trainer` owns what online and offline training have in common: the run
directory (config check, resume), TF set-up, the train-step counter, the
checkpoint of whatever trackables the mode adds, run-level results
(`RunState`), TensorBoard, greedy evaluation, progress lines, the stop flag
(SIGINT/SIGTERM), a loop of compiled chunks with periodic work as `Hook`s on
step intervals, and the close-out (final evaluation and checkpoint, operative
config, exported policy, metrics.json). A mode (experiment/online.py,
experiment/offline.py) only builds its own parts and says what one chunk is.
"""

import contextlib
import dataclasses
import os
from typing import Callable

import gin
import numpy as np
import tensorflow as tf

from core import rundir, seeds, tags
from core.errors import UserError
from core.export import export_policy, export_snapshot
from core.gin_utils import unused_bindings
from core.quiet import native_log_lines_hidden
from core.signals import StopSignal
from core.tf_setup import configure_tf
from envs.suite import make_env
from experiment import takeaway
from experiment.best_policy import BestPolicy
from experiment.checkpointing import Checkpointer
from experiment.evaluation import Evaluator, play_episodes
from experiment.loop import ALL_FINITE
from experiment.progress import Progress
from experiment.run_state import RunState
from experiment.summaries import SummaryWriter
from experiment.video import RenderError, VideoRecorder


def crossed(interval, before, after):
    """Whether a multiple of `interval` lies in (before, after]; never for interval <= 0."""
    return interval > 0 and after // interval > before // interval


@dataclasses.dataclass
class Hook:
    """Periodic work: `fn(step, diagnostics)` whenever a multiple of `interval` is crossed."""

    interval: int
    fn: Callable


class Trainer:
    """Run directory, counters, checkpoint, summaries, evaluation, hooks and stop flag."""

    def __init__(self, root_dir, *, seed, force, tf_threads, verbose, unit, on_nonfinite='stop'):
        """Checks the run directory and sets TF up; builds nothing of the experiment.

        Args:
          root_dir: the run directory; resumed if it holds this config's run.
          seed: the run seed.
          force: resume even though the config changed.
          tf_threads: TF intra/inter-op threads.
          verbose: print progress lines.
          unit: what the step axis counts, e.g. 'env steps' or 'train steps'.
          on_nonfinite: 'stop' or 'warn' on a non-finite diagnostic (see `RunConfig`).
        """
        self.root_dir = root_dir
        self.seed = seed
        self.verbose = verbose
        self.unit = unit
        self._on_nonfinite = on_nonfinite
        self._warned_nonfinite = False
        self.resuming, self._lock = rundir.open_run(root_dir, gin.config_str(), force=force)
        configure_tf(seed, tf_threads)
        self.train_step = tf.Variable(0, dtype=tf.int64, name='train_step')
        self.run_state = RunState()
        self.interrupted = False
        self._stop = StopSignal()
        self._checkpointer = None
        self._evaluator = None
        self._policy = None
        self._snapshot_collect_policy = None
        self._target_return = None
        self._config = None
        self._best = None
        self._confirm_env = None
        self.videos = None
        self._video_problem = None
        self.evaluation = None
        self._on_checkpoint = []
        self.writer = None
        self.progress = None
        self.start_step = 0

    def say(self, text):
        if self.verbose:
            print(text, flush=True)

    # -- Set-up, in this order: restore, then start -------------------------------------------

    def restore(self, step_counter, **trackables):
        """Checkpoints `trackables` (with the train step and run state) and resumes them.

        Args:
          step_counter: the variable the step axis reads (env or train steps).
          **trackables: what else the mode's checkpoint holds (agent, replay, ...).

        Returns:
          The step restored (0 for a new run).
        """
        self._checkpointer = Checkpointer(
            os.path.join(self.root_dir, 'checkpoints'), train_step=self.train_step,
            run_state=self.run_state, **trackables)
        if self.resuming:
            restored = self._checkpointer.restore_latest()
            if restored:
                self.say(f"Resuming from {restored} at {self.unit[:-1]} "
                         f"{int(step_counter.numpy()):,}.")
        return int(step_counter.numpy())

    def start(self, step, *, budget, policy, eval_env, config, target_return=None,
              snapshot_collect_policy=None):
        """Opens TensorBoard and progress at `step`; `policy` is evaluated on `eval_env`.

        `config` (the mode's `_TrainingConfig`) says whether to keep a best policy,
        record videos and write the end-of-run report. Policy snapshots also
        export `snapshot_collect_policy`, if given.
        """
        self.start_step = step
        self._policy = policy
        self._snapshot_collect_policy = snapshot_collect_policy
        self._evaluator = Evaluator(eval_env, policy, config.eval_epsilon,
                                    seeds.evaluation_actions(self.seed))
        self._target_return = target_return
        self._config = config
        self.writer = SummaryWriter(self.root_dir, resume_step=step or None)
        self.progress = Progress(budget, start_step=step, enabled=self.verbose, unit=self.unit)
        if config.best_policy_episodes:
            self._confirm_env = self.eval_env(config.best_policy_episodes, seeds.CONFIRMATION)
            self._best = BestPolicy(
                self.root_dir, policy, self.train_step, unit=self.unit, say=self.say,
                confirm=lambda: play_episodes(self._confirm_env, self._evaluator.act,
                                              seed=seeds.CONFIRMATION)[0])
        self.videos = VideoRecorder(self.root_dir, self._evaluator.act, self.writer,
                                    seed=seeds.evaluation(self.seed))
        if step == 0:
            self.writer.operative_config(gin.config_str(), 0)

    @staticmethod
    def eval_env(num_envs, seed):
        """`num_envs` copies of the run's env as evaluation makes them (Gin scope 'eval')."""
        with gin.config_scope('eval'):
            return make_env(num_envs=num_envs, seed=seed)

    def on_checkpoint(self, fn):
        """Also runs `fn(step)` right before every checkpoint (e.g. a recorder's shard)."""
        self._on_checkpoint.append(fn)

    # -- Periodic work ----------------------------------------------------------------------------

    def evaluate(self, step, diagnostics=None):
        """Plays the greedy policy; writes eval/* and a progress line."""
        del diagnostics
        average_return, average_length = self._evaluator()
        self.writer.scalars({tags.EVAL_AVERAGE_RETURN: average_return,
                             tags.EVAL_AVERAGE_EPISODE_LENGTH: average_length}, step)
        self.run_state.record_eval(step, average_return, self._target_return)
        self.progress.line(step, average_return)
        if self._best is not None:
            with self.writing('the best policy', step):
                self._best.consider(step, average_return)

    def record_video(self, step, diagnostics=None):
        """The `video_interval` hook: one greedy episode as a GIF and in TensorBoard."""
        with self.writing('a video', step):
            self._try_video(lambda: self.videos.record(step, diagnostics))

    def _try_video(self, record):
        """A video that cannot be rendered is a warning (once), never the end of a run."""
        if self._video_problem:
            return None  # the renderer failed before: do not try (and warn) every interval
        try:
            return record()
        except RenderError as error:
            self._video_problem = str(error)
            self.say(f"warning: no videos for this run: {error}")
            return None

    def save_checkpoint(self, step, diagnostics=None):
        del diagnostics
        with self.writing('a checkpoint', step):
            self.writer.flush()  # flush first: events never outrun their checkpoint
            self.run_state.add_wall_time(self.progress.lap())
            for fn in self._on_checkpoint:
                fn(step)
            self._checkpointer.save(step)

    @contextlib.contextmanager
    def writing(self, what, step):
        """Turns a full disk or an I/O error under root_dir into one line with the run's state."""
        try:
            yield
        except (tf.errors.OpError, OSError) as error:
            if isinstance(error, tf.errors.OpError) and not isinstance(
                    error, (tf.errors.ResourceExhaustedError, tf.errors.DataLossError,
                            tf.errors.UnknownError, tf.errors.FailedPreconditionError,
                            tf.errors.PermissionDeniedError, tf.errors.NotFoundError)):
                raise
            reason = ' '.join(str(getattr(error, 'message', '') or error).split())[:160]
            latest = self._checkpointer.latest if self._checkpointer else None
            state = (f"the last good checkpoint is {latest}" if latest
                     else "no checkpoint was written yet")
            raise UserError(
                f"Could not write {what} under {self.root_dir} at {self.unit[:-1]} {step:,} "
                f"({reason}); {state}. Free space (or fix the directory) and rerun the same "
                "command to resume.") from None

    def snapshot(self, step, diagnostics=None):
        """Exports the greedy policy with its (fresh) eval return under root_dir/policies/."""
        del diagnostics
        if self.run_state.last_eval_step != step:
            self.evaluate(step)
        with self.writing('a policy snapshot', step):
            export_snapshot(self._policy, self.root_dir, step, self.train_step,
                            self.run_state.last_eval_return,
                            collect_policy=self._snapshot_collect_policy)

    # -- The loop -------------------------------------------------------------------------------

    @property
    def stop_requested(self):
        return self._stop.requested

    def __enter__(self):
        self._stop.install()
        return self

    def __exit__(self, *exc):
        self._stop.restore()
        self._lock.release()

    def run(self, chunk, *, step_of, budget, hooks, done=lambda: False):
        """Runs `chunk(step)` until `step_of()` reaches `budget`, a stop, or `done()`.

        Args:
          chunk: runs one compiled chunk; returns its diagnostics (tensors).
          step_of: reads the step counter.
          budget: the step to stop at.
          hooks: `Hook`s, run in order after each chunk whose interval was crossed.
          done: checked after the hooks; True ends training early (target reached).

        Returns:
          The step reached.
        """
        step = step_of()
        first_chunk = True
        while step < budget:
            if self.stop_requested:
                self.interrupted = True
                break
            if first_chunk:  # mostly tracing and compiling: not the speed, and XLA's log line
                with native_log_lines_hidden():
                    diagnostics = chunk(step)
                self.progress.restart_rate(step_of())
                first_chunk = False
            else:
                diagnostics = chunk(step)
            before, step = step, step_of()
            self._check_finite(step, diagnostics)  # before any hook can save the weights
            with self.progress.paused():  # evaluation, videos, checkpoints: not the speed
                for hook in hooks:
                    if crossed(hook.interval, before, step):
                        hook.fn(step, diagnostics)
            self.progress.maybe_line(step, self.run_state.last_eval_return)
            if done():
                break
        return step_of()

    def _check_finite(self, step, diagnostics):
        """Stops (or warns once) when a chunk's loss, diagnostics or weights are not finite."""
        bad = nonfinite(diagnostics)
        if not bad:
            return
        where = f"{self.unit[:-1]} {step:,}"
        if self._on_nonfinite == 'warn':
            if not self._warned_nonfinite:
                self._warned_nonfinite = True
                self.say(f"warning: train/{', train/'.join(bad)} not finite at {where}; "
                         "training on (on_nonfinite='warn').")
            return
        latest = self._checkpointer.latest
        kept = (f"the last finite checkpoint ({latest}) stays the latest" if latest
                else "no checkpoint had been written yet")
        raise UserError(
            f"Training diverged: train/{', train/'.join(bad)} not finite at {where}; {kept} and "
            "nothing non-finite was saved. Lower the learning rate or clip gradients, then "
            "rerun (on_nonfinite='warn' trains on instead).")

    # -- Close-out ------------------------------------------------------------------------------

    def close_out(self, step, *, export):
        """Final evaluation and checkpoint, operative config, and the exported policy."""
        if not self.interrupted and self.run_state.last_eval_step != step:
            self.evaluate(step)
        self.save_checkpoint(step)
        with self.writing('the final summaries and exported policy', step):
            self.writer.operative_config(gin.operative_config_str(), step)
            self.writer.close()
            rundir.atomic_write_text(os.path.join(self.root_dir, 'operative_config.gin'),
                                     gin.operative_config_str())
            if export and not self.interrupted:
                export_policy(self._policy, os.path.join(self.root_dir, 'policy'),
                              self.train_step)
        if self.interrupted:
            return
        if self._config.final_eval_episodes:
            with self.writing(takeaway.EVALUATION_FILE, step):
                env = self.eval_env(self._config.final_eval_episodes, seeds.REPORT)
                try:
                    self.evaluation = takeaway.final_report(
                        self.root_dir, env, self._evaluator.act, self._best, self.say,
                        explore=self._evaluator.explore)
                finally:
                    env.close()
        if self._config.final_video:
            with self.writing('the final video', step):
                self.videos.last_path = self._try_video(lambda: takeaway.final_video(
                    self.root_dir, step, self._evaluator.act, self._best,
                    explore=self._evaluator.explore)) \
                    or self.videos.last_path

    def report(self, step, metrics):
        """Adds the run-level results to `metrics`, writes metrics.json, prints warnings."""
        metrics = {
            **metrics,
            'final_eval_return': self.run_state.last_eval_return,
            'best_eval_return': self.run_state.best_eval_return,
            'interrupted': self.interrupted,
            'wall_time_s': self.run_state.wall_time_s,
            'unused_bindings': unused_bindings(),
        }
        if self._best is not None and self._best.best is not None:
            metrics['best_policy'] = self._best.best
        if self.evaluation:
            metrics['final_report'] = takeaway.report_metrics(self.evaluation)
        with self.writing('metrics.json', step):
            rundir.write_metrics(self.root_dir, metrics)
        if metrics['unused_bindings']:
            self.say("warning: these Gin bindings had no effect (check scope and spelling): "
                     + ', '.join(metrics['unused_bindings']))
        if self.interrupted:
            self.say(f"Interrupted at {self.unit[:-1]} {step:,}: checkpoint saved; rerun the "
                     "same command to resume.")
        else:
            for line in takeaway.summary_lines(
                    self.root_dir, step, self.unit, report=self.evaluation, best=self._best,
                    video_path=self.videos.last_path if self.videos else None):
                self.say(line)
        return metrics

    def rate(self, step):
        """Steps per second of this process's training so far."""
        return (step - self.start_step) / max(self.progress.elapsed(), 1e-9)


def nonfinite(diagnostics):
    """Names of the diagnostics (scalars or arrays) holding a NaN or an infinity."""
    if ALL_FINITE in diagnostics and bool(diagnostics[ALL_FINITE]):
        return []  # the usual case: one read of the chunk's own flag
    return [name for name, value in diagnostics.items()
            if name != ALL_FINITE and not np.all(np.isfinite(np.asarray(value)))]
