"""The experiment core every training process shares, built whole once a mode has its parts.

A mode (experiment/online.py, experiment/offline.py) holds a `RunSession`
(experiment/run_session.py: run directory, TF set-up, train step, stop flag,
restore) while it builds its agent, replay and loop and restores them; then it
builds the `Trainer` from the session and the restored step. The Trainer owns
what online and offline training have in common from there on: TensorBoard,
greedy evaluation and the best policy (experiment/judging.py), progress lines,
a loop of compiled chunks with periodic work as `Hook`s on step intervals, and
the close-out (final evaluation and checkpoint, operative config, exported
policy, metrics.json). A mode only says what one chunk is.
"""

import dataclasses
import os
from typing import Callable

import gin

from core import rundir, seeds, tags
from core.export import export_policy, export_snapshot
from core.gin_utils import unused_bindings
from core.quiet import native_log_lines_hidden
from experiment import takeaway
from experiment.judging import Judging
from experiment.loop import divergence_error, nonfinite
from experiment.progress import Progress
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
    """TensorBoard, evaluation, best policy, videos, progress, hooks and the close-out."""

    def __init__(self, session, start_step, *, budget, policy, eval_env, config,
                 target_return=None, snapshot_collect_policy=None, on_nonfinite='stop'):
        """Opens TensorBoard and progress at `start_step`; `policy` is evaluated on `eval_env`.

        Args:
          session: the `RunSession` the mode built and restored its parts with.
          start_step: the step restored (0 for a new run).
          budget: the step the run ends at.
          policy: the greedy policy: evaluated, exported, kept as the best.
          eval_env: the periodic evaluation env (`judging.eval_env`).
          config: the mode's `_TrainingConfig`: whether to keep a best policy, record
            videos and write the end-of-run report.
          target_return: the return that counts as solved (for steps_to_target).
          snapshot_collect_policy: also exported with each policy snapshot, if given.
          on_nonfinite: 'stop' or 'warn' on a non-finite diagnostic (see `RunConfig`).
        """
        self.session = session
        self.start_step = start_step
        self.interrupted = False
        self._policy = policy
        self._snapshot_collect_policy = snapshot_collect_policy
        self._target_return = target_return
        self._config = config
        self._on_nonfinite = on_nonfinite
        self._warned_nonfinite = False
        self._video_problem = None
        self._on_checkpoint = []
        self.evaluation = None
        self._judging = Judging(session.root_dir, policy, eval_env, config=config,
                                seed=session.seed, train_step=session.train_step,
                                unit=session.unit, say=session.say)
        self._evaluator, self._best = self._judging.evaluator, self._judging.best
        self.writer = SummaryWriter(session.root_dir, resume_step=start_step or None)
        self.progress = Progress(budget, start_step=start_step, enabled=session.verbose,
                                 unit=session.unit)
        self.videos = VideoRecorder(session.root_dir, self._evaluator.act, self.writer,
                                    seed=seeds.evaluation(session.seed))
        if start_step == 0:
            self.writer.operative_config(gin.config_str(), 0)

    # What the modes read of the session, under the names they always had.
    root_dir = property(lambda self: self.session.root_dir)
    seed = property(lambda self: self.session.seed)
    unit = property(lambda self: self.session.unit)
    train_step = property(lambda self: self.session.train_step)
    run_state = property(lambda self: self.session.run_state)
    stop_requested = property(lambda self: self.session.stop_requested)

    def say(self, text):
        self.session.say(text)

    def writing(self, what, step):
        return self.session.writing(what, step)

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
            self.session.checkpointer.save(step)

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
        latest = self.session.checkpointer.latest
        kept = (f"the last finite checkpoint ({latest}) stays the latest" if latest
                else "no checkpoint had been written yet")
        raise divergence_error('Training', bad, where, kept,
                               "rerun (on_nonfinite='warn' trains on instead)")

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
                self.evaluation = self._judging.final_report(
                    self.root_dir, self._config.final_eval_episodes, self.say)
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
