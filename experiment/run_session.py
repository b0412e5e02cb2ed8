"""A training process's hold on its run directory, before the Trainer exists.

A `RunSession` is what a mode needs while it builds its parts: the run
directory (config check, resume, a lock held for the process's lifetime), one
TF set-up, the train-step counter, run-level results (`RunState`), the stop
flag (SIGINT/SIGTERM) and the checkpoint restore. Once the mode has built its
agent, replay and loop and restored them, it builds the `Trainer` whole from
the session and the restored step (experiment/trainer.py): nothing waits at
None for a later call.
"""

import contextlib
import os

import gin
import tensorflow as tf

from core import rundir
from core.errors import UserError
from core.signals import StopSignal
from core.tf_setup import configure_tf
from experiment.checkpointing import Checkpointer
from experiment.run_state import RunState


class RunSession:
    """Run directory, TF set-up, train step, run state, stop flag and checkpoint restore."""

    def __init__(self, root_dir, *, seed, force, tf_threads, verbose, unit):
        """Checks the run directory and sets TF up; builds nothing of the experiment.

        Args:
          root_dir: the run directory; resumed if it holds this config's run.
          seed: the run seed.
          force: resume even though the config changed.
          tf_threads: TF intra/inter-op threads.
          verbose: print progress lines.
          unit: what the step axis counts, e.g. 'env steps' or 'train steps'.
        """
        self.root_dir = root_dir
        self.seed = seed
        self.verbose = verbose
        self.unit = unit
        self.resuming, self._lock = rundir.open_run(root_dir, gin.config_str(), force=force)
        configure_tf(seed, tf_threads)
        self.train_step = tf.Variable(0, dtype=tf.int64, name='train_step')
        self.run_state = RunState()
        self.checkpointer = None
        self._stop = StopSignal()

    def say(self, text):
        if self.verbose:
            print(text, flush=True)

    @property
    def stop_requested(self):
        return self._stop.requested

    def __enter__(self):
        self._stop.install()
        return self

    def __exit__(self, *exc):
        self._stop.restore()
        self._lock.release()

    def restore(self, step_counter, **trackables):
        """Checkpoints `trackables` (with the train step and run state) and resumes them.

        Args:
          step_counter: the variable the step axis reads (env or train steps).
          **trackables: what else the mode's checkpoint holds (agent, replay, ...).

        Returns:
          The step restored (0 for a new run).
        """
        self.checkpointer = Checkpointer(
            os.path.join(self.root_dir, 'checkpoints'), train_step=self.train_step,
            run_state=self.run_state, **trackables)
        if self.resuming:
            restored = self.checkpointer.restore_latest()
            if restored:
                self.say(f"Resuming from {restored} at {self.unit[:-1]} "
                         f"{int(step_counter.numpy()):,}.")
        return int(step_counter.numpy())

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
            latest = self.checkpointer.latest if self.checkpointer else None
            state = (f"the last good checkpoint is {latest}" if latest
                     else "no checkpoint was written yet")
            raise UserError(
                f"Could not write {what} under {self.root_dir} at {self.unit[:-1]} {step:,} "
                f"({reason}); {state}. Free space (or fix the directory) and rerun the same "
                "command to resume.") from None
