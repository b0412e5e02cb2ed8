"""A sweep as a Slurm job array, every task one sweep worker (`python -m app.slurm sweep`).

    python -m app.slurm sweep --sweep=configs/sweeps/dqn_search.yaml \\
        --gin_file=configs/dqn_cartpole.gin --root_dir=runs/sweeps \\
        --storage=postgresql://user@dbhost/sweeps --array=4 [--time=4:00:00 ...] \\
        [sweep.py's other flags: --gin_bindings, --force, --train_script, --workers]

writes `<root_dir>/slurm/sweep-<name>.sbatch` (an array `0-<N-1>`, log
`<root_dir>/slurm/sweep-%A_%a.out`), prints it with --dry_run, otherwise submits it. Flags this
command does not know go to sweep.py unchanged. The sweep file is the one sweep.py takes: grid and
search specs are unchanged.

How the work is split. Every array task works in the same sweep directory, `<root_dir>/<name>`,
on the shared filesystem the checkout already has to be on: a trial's run directory
(`<name>/<k=v,...>/seed_<n>`) then belongs to the configuration, not to the task that happened to
start it, so whichever task runs a configuration next -- the same task after a requeue, or another
one -- resumes its checkpoint. (Separate `task_<i>` folders would lose that: a trial re-queued in
the study and picked up by another task would start from step 0.) sweep.py's trial lock
(`flock` on `<trial dir>/.sweep.lock`) keeps two tasks from running one trial directory at once;
it needs a filesystem with working flock (NFS does; Lustre needs its `flock` mount option).

* A search: each task runs `sweep.py --workers=1` (one trial at a time; pass `--workers=W` with
  matching `--cpus_per_task` for more) against the study in `--storage`. The study hands out
  configurations and never counts more than `num_trials` (sweeps/search.py). With more than one
  task the storage must be a database server (PostgreSQL): refused otherwise, because SQLite
  over a network filesystem relies on POSIX locks that NFS and Lustre do not implement reliably,
  and several nodes writing one study.db can corrupt it. One task (`--array=1`) may use SQLite
  (the default study.db in the sweep dir): there is one writer at a time. A `sampler_seed` is
  refused with several tasks, as every task would propose the same configurations.
* A grid: each task runs `python -m sweeps.slurm_array grid_task`, which plans the same trials as
  sweep.py and then claims them one at a time: it skips finished trials and trials whose lock
  another task holds, runs the first free one (starting at its own index, so tasks do not race
  for the same first trial), and waits while the only unfinished trials are held elsewhere.
  Running plain `sweep.py` in every task would not do: its workers walk the grid in the same
  order and wait on each other's locks, so the array would run one trial at a time. A lock is
  released when its process ends, so the trial of a task that was requeued, preempted or killed
  is free again and the next task to claim it resumes it from its checkpoint. (This module is
  in sweeps/, as it plans sweeps, and is its own entry point: the `sweep` subcommand of
  `python -m app.slurm`.) A trial that
  crashed (train.py exited with an error) is tried at most once per task; rerun to retry it.

Requeue and resume (app/slurm_jobs.py). Tasks ask for `--signal=B:USR1@<warning_s>` and
`--requeue`. On the warning the batch script sends sweep.py SIGTERM: running trials checkpoint
after the chunk in progress and exit, an interrupted search trial is marked FAIL and its
configuration re-queued in the study at once (not counted twice), and the script requeues its
own array task (`scontrol requeue <array id>_<task id>`: the bare job id of an array's first
task names the whole array). A task that Slurm requeues (preemption, `scontrol requeue`) gets
SIGTERM the same way. When the task runs again it asks the study (or the grid's locks) for work:
the re-queued configuration goes to the first task that asks, and its run resumes from the
checkpoint in the shared trial directory. A task killed before it could say so leaves a trial
whose heartbeat stops; after 3 x heartbeat_s it is failed and re-queued the same way.

Rerunning the same command resumes: it rewrites the script and submits a new array; the tasks
skip finished trials (a complete study adds no trials; finished grid runs are skipped) and resume
the rest. It refuses to submit while a job of the same name is still queued or running.
"""

import argparse
import math
import os
import sys
import threading
import time

from app import slurm_jobs
from core.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP_PY = os.path.join(REPO, 'sweep.py')
GRID_TASK = 'grid_task'
_CLAIM_POLL_S = 5.0


def _parser():
    parser = argparse.ArgumentParser(
        prog='python -m app.slurm sweep',
        description='Submit a sweep (grid or Optuna search) as a Slurm job array: every task '
                    'is one sweep worker in the same sweep directory; tasks save and requeue '
                    'themselves before their time limit. Unknown flags go to sweep.py.')
    parser.add_argument('--sweep', required=True, help='the sweep file, e.g. '
                        'configs/sweeps/dqn_search.yaml (sweep.py\'s --sweep)')
    parser.add_argument('--root_dir', required=True,
                        help="sweep.py's --root_dir (the sweep dir is <root_dir>/<name>, shared "
                             "by every task); the script and logs go to <root_dir>/slurm/")
    parser.add_argument('--array', type=int, required=True, metavar='N',
                        help='number of array tasks (workers), at most the number of trials')
    parser.add_argument('--max_running', type=int, default=None, metavar='M',
                        help='run at most M tasks at once (--array=0-<N-1>%%M)')
    parser.add_argument('--storage', default=None,
                        help="the Optuna study's database URL, e.g. "
                             "postgresql://user@host/dbname; needed by a search with --array > 1")
    parser.add_argument('--job_name', default=None, help='default: sweep-<sweep name>')
    slurm_jobs.add_resource_flags(parser)
    return parser


def _spec(path):
    from sweeps import spec as sweep_spec

    return sweep_spec.load(path)


def num_trials(spec):
    """Trials the array can share: grid configurations x seeds, or the search's num_trials."""
    if spec.grid is not None:
        return math.prod(len(values) for _, values in spec.grid) * len(spec.seeds)
    return spec.search.num_trials


def check(spec, args):
    """Refuses, in one line, what cannot work as a job array (raises UserError)."""
    tasks = args.array
    if tasks < 1:
        raise UserError(f'--array must be at least 1 task, got {tasks}.')
    if args.max_running is not None and args.max_running < 1:
        raise UserError(f'--max_running must be at least 1, got {args.max_running}.')
    trials = num_trials(spec)
    if tasks > trials:
        raise UserError(f'--array={tasks} but sweep {spec.name} has {trials} trial(s): give '
                        f'--array={trials} or fewer (a task without a trial would only wait).')
    if spec.search is None or tasks == 1:
        return
    url = args.storage or spec.search.storage
    if not url or url.startswith('sqlite'):
        where = f'storage {url}' if url else 'no --storage (the default is SQLite)'
        raise UserError(f'search sweep {spec.name} with --array={tasks} has {where}: tasks on '
                        'several nodes need a database server, e.g. '
                        '--storage=postgresql://user@host/dbname (SQLite on a shared filesystem '
                        'is not safe); or give --array=1.')
    if spec.search.sampler_seed is not None:
        raise UserError(f'{spec.path} sets sampler_seed: with --array={tasks} every task would '
                        'propose the same configurations; remove it or give --array=1.')


def _path_flags(sweep_args):
    """sweep.py's flags with --gin_file paths checked; one only found from here is made absolute
    (the job runs in the checkout, as sweep.py resolves paths from its working directory)."""
    result, args = [], list(sweep_args)
    while args:
        arg = args.pop(0)
        if arg == '--gin_file' and args:
            arg = f'--gin_file={args.pop(0)}'
        if arg.startswith('--gin_file='):
            path = arg.split('=', 1)[1]
            if not os.path.isfile(os.path.join(REPO, path)):
                if not os.path.isfile(path):
                    raise UserError(f'--gin_file={path}: no such file (paths are relative to '
                                    f'{REPO}).')
                arg = f'--gin_file={os.path.abspath(path)}'
        result.append(arg)
    return result


def task_command(spec, args, sweep_args):
    """The command every array task runs (one line; the task id comes from Slurm's env)."""
    root_dir = os.path.abspath(args.root_dir)
    flags = [f'--sweep={os.path.abspath(args.sweep)}', f'--root_dir={root_dir}']
    if args.storage:
        flags.append(f'--storage={args.storage}')
    if not any(arg == '--workers' or arg.startswith('--workers=') for arg in sweep_args):
        flags.append('--workers=1')
    flags += sweep_args
    if spec.grid is not None:
        command = [sys.executable, '-m', 'sweeps.slurm_array', GRID_TASK]
        return (slurm_jobs.quote(command) + ' --task="${SLURM_ARRAY_TASK_ID}" '
                + f'--tasks={args.array} ' + slurm_jobs.quote(flags))
    return slurm_jobs.quote([sys.executable, SWEEP_PY, *flags])


def sweep_script(spec, args, sweep_args):
    """(script path, its lines)."""
    root_dir = os.path.abspath(args.root_dir)
    slurm_dir = os.path.join(root_dir, 'slurm')
    array = f'0-{args.array - 1}' + (f'%{args.max_running}' if args.max_running else '')
    lines = slurm_jobs.header(args.job_name or f'sweep-{spec.name}',
                              slurm_jobs.resources_from(args),
                              log_path=os.path.join(slurm_dir, 'sweep-%A_%a.out'), array=array)
    if spec.grid is not None:
        what = (f'grid of {num_trials(spec)} trials (configurations x seeds); each task claims '
                'free trials (sweeps/slurm_array.py)')
    else:
        where = _without_password(args.storage or spec.search.storage or 'study.db in the sweep '
                                                                          'dir (SQLite)')
        what = (f'Optuna {spec.search.sampler} search, {spec.search.num_trials} trials; study in '
                f'{where}')
    sweep_dir = os.path.join(root_dir, spec.name)
    lines += ['',
              '# Written by `python -m app.slurm sweep`; rerun the same command to resubmit (it',
              '# resumes: finished trials are skipped, unfinished ones resume from checkpoints).',
              f'# Sweep {spec.name}: {what}.',
              f'# {args.array} array task(s), each one worker in {sweep_dir}',
              'set -u',
              f'cd {slurm_jobs.quote([REPO])}',
              'echo "[slurm] $(date +%T) task ${SLURM_ARRAY_TASK_ID} (job ${SLURM_JOB_ID}) on '
              '$(hostname), restart ${SLURM_RESTART_COUNT:-0}"']
    lines += slurm_jobs.save_then_requeue([task_command(spec, args, sweep_args)])
    return os.path.join(slurm_dir, f'sweep-{spec.name}.sbatch'), lines


def _without_password(url):
    scheme, sep, rest = url.partition('://')
    if not sep or '@' not in rest:
        return url
    credentials, at, host = rest.rpartition('@')
    user = credentials.split(':', 1)[0]
    return f'{scheme}://{user}{":***" if ":" in credentials else ""}{at}{host}'


def main(argv):
    """Writes the array's script; submits it unless --dry_run. Returns a summary dict."""
    args, sweep_args = _parser().parse_known_args(argv)
    spec = _spec(args.sweep)
    check(spec, args)
    sweep_args = _path_flags(sweep_args)
    path, lines = sweep_script(spec, args, sweep_args)  # refuses bad resources
    slurm_jobs.write_script(path, lines)
    if args.dry_run:
        print('\n'.join(lines), flush=True)
        return {'script': path}
    job_name = args.job_name or f'sweep-{spec.name}'
    slurm_jobs.refuse_if_queued(job_name)
    job = slurm_jobs.submit(path)
    log = os.path.join(os.path.abspath(args.root_dir), 'slurm', f'sweep-{job}_<task>.out')
    print(f'Submitted array job {job} ({args.array} task(s)): {path}\nlogs: {log}', flush=True)
    return {'job_id': job, 'script': path, 'tasks': args.array}


# ---- The array task of a grid sweep ---------------------------------------------------------


def grid_task_main(argv):
    """One array task of a grid sweep: sweep.py's planning and report, trials claimed by lock.

    Returns sweep.py's exit status (0, 1 some trials failed, 130 interrupted).
    """
    from app.cli import start_up
    from sweeps import cli as sweep_cli
    from sweeps import trial

    own = argparse.ArgumentParser(prog=f'python -m sweeps.slurm_array {GRID_TASK}')
    own.add_argument('--task', type=int, default=int(os.environ.get('SLURM_ARRAY_TASK_ID', 0)))
    own.add_argument('--tasks', type=int, default=1)
    mine, rest = own.parse_known_args(argv)
    args = sweep_cli.parse_args(rest)
    spec = _spec(args.sweep)
    if spec.grid is None:
        raise UserError(f'{spec.path} is a search: its array tasks run sweep.py itself.')
    workers = args.workers or 1
    start_up()
    from sweeps import grid, log, validate

    base_bindings = list(spec.bindings) + list(args.gin_bindings)
    validate.check_base(args.gin_file, base_bindings, spec.path)
    sweep_dir = os.path.join(args.root_dir, spec.name)
    plan = grid.plan(spec, args.gin_file, base_bindings, sweep_dir, force=args.force)
    os.makedirs(sweep_dir, exist_ok=True)
    event_log = log.EventLog(sweep_dir)
    launcher = trial.Launcher(args.gin_file, event_log, train_script=args.train_script,
                              force=args.force)
    event_log.write('sweep_start', workers=workers, task=mine.task, argv=list(argv))
    print(f'sweep {spec.name}: {len(plan)} trials, task {mine.task} of {mine.tasks}, '
          f'{workers} worker(s), in {sweep_dir}', flush=True)
    claims = _Claims(plan, launcher, start=mine.task * workers)
    from sweeps import executor

    executor.run_jobs([claims.work] * workers, workers, launcher)
    event_log.write('sweep_end', interrupted=launcher.stop_requested, failed=launcher.crashed)
    summary = sweep_cli._report(spec, sweep_dir, grid.collect(plan), launcher)
    if summary['interrupted']:
        print('Interrupted: the requeued task (or a rerun) resumes.', flush=True)
        return sweep_cli.EXIT_INTERRUPTED
    return sweep_cli.EXIT_TRIALS_FAILED if summary['failed'] else 0


class _Claims:
    """The grid's trials, claimed one at a time by this task's workers (threads)."""

    def __init__(self, trials, launcher, *, start=0, poll_s=_CLAIM_POLL_S):
        start %= max(1, len(trials))
        self._trials = list(trials[start:]) + list(trials[:start])  # tasks start apart
        self._launcher = launcher
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._taken = set()  # root dirs a worker of this task runs or has run (crashed)

    def work(self):
        waiting_announced = False
        while not self._launcher.stop_requested:
            todo = [one for one in self._trials if not _finished(one)]
            if not todo:
                return
            one = self._claim(todo)
            if one is None:
                if all(one.root_dir in self._taken for one in todo):
                    return  # the rest crashed here or run on this task's other workers
                if not waiting_announced:
                    print('waiting for trials running in other tasks', flush=True)
                    waiting_announced = True
                time.sleep(self._poll_s)
                continue
            waiting_announced = False
            outcome = self._launcher.run(one)  # locks the trial dir itself; skips if finished
            if outcome.status == 'interrupted':
                with self._lock:
                    self._taken.discard(one.root_dir)

    def _claim(self, todo):
        with self._lock:
            for one in todo:
                if one.root_dir not in self._taken and _unlocked(one.root_dir):
                    self._taken.add(one.root_dir)
                    return one
        return None


def _finished(one):
    from sweeps import trial

    return (trial.is_finished(trial.read_metrics(one.root_dir), one.config)
            and not trial.config_changed(one))


def _unlocked(root_dir):
    """True when no process holds the trial's lock (sweeps/trial.py's _TrialLock) now."""
    import fcntl

    from sweeps import trial

    os.makedirs(root_dir, exist_ok=True)
    with open(os.path.join(root_dir, trial._LOCK_NAME), 'a') as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
    # Closing released it; Launcher.run takes it for real. Should another task take it in
    # between, Launcher.run waits for that task's run and then skips the finished trial.
    return True


def cli():
    """`python -m sweeps.slurm_array [grid_task] ...`: a grid task, else a submission."""
    from app.cli import one_line

    argv = sys.argv[1:]
    try:
        if argv[:1] == [GRID_TASK]:
            return grid_task_main(argv[1:])
        main(argv)
        return 0
    except UserError as error:
        print(f'error: {one_line(error)}', file=sys.stderr, flush=True)
        return 2


if __name__ == '__main__':
    sys.exit(cli())
