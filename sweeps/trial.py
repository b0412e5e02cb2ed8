"""One trial: a `train.py` run with its own root_dir and seed, in a subprocess.

A subprocess, not a call, so that a crash, an OOM kill or a leaked TF graph in
one trial cannot take the sweep (or the next trial) down with it. train.py
resumes from its last checkpoint by itself, so "resume" here is just running
the same command again; a trial counts as done once its metrics.json says it
reached its budget without being interrupted.
"""

import dataclasses
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time

from core import rundir
from sweeps import validate

TRAIN_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'train.py')
LOG_NAME = 'train.log'
_LOCK_NAME = '.sweep.lock'


@dataclasses.dataclass(frozen=True)
class Trial:
    """A configuration (label, params) run with one seed in its own root_dir."""

    label: str
    params: tuple  # ((binding key, value), ...)
    seed: int
    root_dir: str
    bindings: tuple  # every --gin_bindings of the run, swept ones last
    config: validate.TrialConfig

    @property
    def name(self):
        return f'{self.label}/seed_{self.seed}'


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a trial ended: finished, skipped (was already done), interrupted or crashed."""

    status: str
    metrics: dict = None
    detail: str = ''


def trial_dir(sweep_dir, label, seed):
    return os.path.join(sweep_dir, label, f'seed_{seed}')


def read_metrics(root_dir):
    """The run's metrics.json, or None when it has not written one (or it is unreadable)."""
    try:
        with open(os.path.join(root_dir, 'metrics.json')) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def is_finished(metrics, config):
    """True when the metrics show a complete, uninterrupted run of this TrialConfig."""
    if not metrics or metrics.get('interrupted', True):
        return False
    if metrics.get('env_steps', 0) >= config.num_env_steps:
        return True
    return config.stop_at_target_return and metrics.get('steps_to_target') is not None


def config_changed(trial):
    """True when the trial's root_dir holds a run started with another config.

    Skipping such a "finished" trial would report results of a config the
    sweep no longer describes; train.py would refuse to resume it without --force.
    """
    try:
        with open(os.path.join(trial.root_dir, rundir.CONFIG_FILE)) as f:
            return f.read() != trial.config.config_str
    except OSError:
        return False


def command(gin_files, trial, train_script=TRAIN_PY, force=False):
    """The train.py command line of a trial."""
    return ([sys.executable, train_script]
            + [f'--gin_file={path}' for path in gin_files]
            + [f'--gin_bindings={binding}' for binding in trial.bindings]
            + [f'--root_dir={trial.root_dir}', f'--seed={trial.seed}']
            + (['--force'] if force else []))


class Launcher:
    """Runs trial subprocesses and interrupts them all on request (Ctrl-C, SIGTERM)."""

    def __init__(self, gin_files, event_log, *, train_script=TRAIN_PY, force=False, echo=print):
        self._gin_files = list(gin_files)
        self._train_script = train_script
        self._force = force  # resume trials whose config changed (train.py --force)
        self._log = event_log
        self._echo = echo
        self._children = set()
        self._lock = threading.Lock()
        self.stop_requested = False
        self.crashed = []  # names of trials whose train.py failed in this sweep run

    def interrupt(self):
        """Stops new trials and asks running ones to checkpoint and exit (train.py's SIGINT)."""
        self.stop_requested = True
        with self._lock:
            children = list(self._children)
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGINT)

    def run(self, trial):
        """Runs the trial unless it already finished; returns its Outcome."""
        os.makedirs(trial.root_dir, exist_ok=True)
        with _TrialLock(trial.root_dir, lambda: self.stop_requested) as locked:
            if not locked:
                return Outcome('interrupted', detail='stopped while waiting for another worker')
            metrics = read_metrics(trial.root_dir)
            changed = config_changed(trial)
            if changed and not self._force:
                return self._crashed(trial, None, f'{trial.root_dir} holds a run of another '
                                     'config: pass --force to resume it with this one')
            if is_finished(metrics, trial.config) and not changed:
                self._log.write('skip', trial=trial.name)
                return Outcome('skipped', metrics)
            if self.stop_requested:
                return Outcome('interrupted')
            return self._run_subprocess(trial)

    def _run_subprocess(self, trial):
        self._log.write('start', trial=trial.name, root_dir=trial.root_dir)
        self._echo(f'start {trial.name}')
        log_path = os.path.join(trial.root_dir, LOG_NAME)
        with open(log_path, 'a') as log_file:
            log_start = log_file.tell()
            child = subprocess.Popen(command(self._gin_files, trial, self._train_script,
                                             self._force), stdout=log_file,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            with self._lock:
                self._children.add(child)
            if self.stop_requested:  # a stop that came while this trial was being launched
                child.send_signal(signal.SIGINT)
            try:
                returncode = child.wait()
            finally:
                with self._lock:
                    self._children.discard(child)
        return self._outcome(trial, returncode, log_path, log_start)

    def _outcome(self, trial, returncode, log_path, log_start):
        metrics = read_metrics(trial.root_dir)
        if returncode == 0 and is_finished(metrics, trial.config):
            self._log.write('finish', trial=trial.name, seconds=metrics.get('wall_time_s'))
            self._echo(f'done  {trial.name}: final eval return {metrics.get("final_eval_return")}')
            return Outcome('finished', metrics)
        if self.stop_requested or (metrics and metrics.get('interrupted')):
            self._log.write('interrupted', trial=trial.name)
            return Outcome('interrupted', metrics)
        detail = f'{_exit_text(returncode)}: {_last_line(log_path, log_start)} (log: {log_path})'
        return self._crashed(trial, metrics, detail)

    def _crashed(self, trial, metrics, detail):
        self._log.write('crash', trial=trial.name, detail=detail)
        with self._lock:
            self.crashed.append(trial.name)
        self._echo(f'FAILED {trial.name}: {detail}')
        return Outcome('crashed', metrics, detail)


class _TrialLock:
    """An exclusive lock on a trial directory, so two sweep processes never run one trial.

    Waiting polls, rather than blocks, so a Ctrl-C still stops a waiting worker.
    """

    def __init__(self, root_dir, stopped):
        self._path = os.path.join(root_dir, _LOCK_NAME)
        self._stopped = stopped
        self._file = None

    def __enter__(self):
        self._file = open(self._path, 'a')
        while True:
            try:
                fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if self._stopped():
                    return False
                time.sleep(1.0)

    def __exit__(self, *exc):
        self._file.close()  # closing releases the lock


def _exit_text(returncode):
    if returncode >= 0:
        return f'exit status {returncode}'
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f'signal {-returncode}'
    hint = ' (out of memory?)' if name == 'SIGKILL' else ''
    return f'killed by {name}{hint}'


def _last_line(path, start):
    """The most useful line this attempt wrote: its 'error:' line, else its last line."""
    try:
        with open(path, errors='replace') as f:
            f.seek(start)
            lines = [line.strip() for line in f.readlines()[-200:] if line.strip()]
    except OSError:
        return 'no log'
    errors = [line for line in lines if line.startswith('error:')]
    return (errors or lines or ['no output'])[-1][:300]
