"""sweep.py's work: plan, run and report a sweep (the entry point only calls `cli`)."""


import argparse
import fcntl
import os
import sys

from app.cli import add_gin_flags, one_line, start_up
from core.errors import UserError
from sweeps import spec as sweep_spec
from sweeps import trial

USAGE = """Sweep train.py over configurations and seeds: a grid, or an Optuna search.

  python sweep.py --gin_file=configs/dqn_cartpole.gin --sweep=configs/sweeps/dqn_lr.yaml \
      [--gin_file=configs/testing/tiny.gin] [--gin_bindings='run.use_xla=False'] \
      [--root_dir=runs/sweeps] [--workers 2] [--storage postgresql://user@host/db] [--force]

The sweep file (format: sweeps/spec.py) names the sweep, its seeds, fixed
bindings, and a grid of values or an Optuna search space. Each trial is one
train.py subprocess with its own seed and root_dir,
`<root_dir>/<sweep name>/<k=v,...>/seed_<n>`, so one crashing trial does not
stop the others. Every configuration is validated (unknown bindings, wrong
value types) before the first trial starts. Rerunning the same command skips
finished trials and resumes unfinished ones from their checkpoints; Ctrl-C
makes running trials checkpoint first. Run dirs holding another config (the
sweep file was edited) are refused unless --force resumes them with the new one.

When all trials are done the sweep writes, under `<root_dir>/<sweep name>/`:
results.csv and results.md (mean +- std over seeds per configuration, also
printed), curves.png and curves.csv (eval return vs env steps), TensorBoard
HParams summaries (`tensorboard --logdir <root_dir>/<sweep name>`), and
sweep.log (when each trial started and finished).

Searches keep their Optuna study in a database (default: study.db, SQLite, in
the sweep dir). Give several sweep.py processes the same storage URL to share
one study: on one machine SQLite works; across machines use a server database,
`--storage postgresql://user:password@host/dbname` (install its driver, e.g.
psycopg2-binary, on every machine). Each process runs its own trials in its
own --root_dir; the table each one prints covers every finished trial of the
study. See sweeps/search.py for how killed trials are retried.

Errors the user can fix are printed as one line (exit status 2). Exit status
1 means some trials failed (their train.log is named), 130 that the sweep was
interrupted (rerun it to resume).
"""

EXIT_TRIALS_FAILED = 1
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


def parse_args(argv):
    parser = argparse.ArgumentParser(description=USAGE.splitlines()[0], epilog=USAGE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_gin_flags(parser, example='run.use_xla=False')
    parser.add_argument('--sweep', required=True, help='The sweep file (YAML), e.g. '
                        'configs/sweeps/dqn_lr.yaml.')
    parser.add_argument('--root_dir', default=os.path.join('runs', 'sweeps'),
                        help='Parent of the sweep directory (default: runs/sweeps).')
    parser.add_argument('--workers', type=int, default=None,
                        help="Trials run in parallel (default: the sweep file's workers, or 1).")
    parser.add_argument('--storage', default=None,
                        help="Optuna storage URL for searches (overrides the sweep file's).")
    parser.add_argument('--force', action='store_true',
                        help='Resume trials whose run dir holds another config (train.py '
                             '--force), e.g. after raising run.num_env_steps in the sweep file.')
    parser.add_argument('--train_script', default=trial.TRAIN_PY,
                        help='The script each trial runs with train.py\'s flags (default: '
                             'train.py); e.g. a wrapper that sets up a cluster job.')
    return parser.parse_args(argv)


def main(argv=None):
    """Runs a sweep; returns a summary dict (raises UserError on bad input).

    The summary has sweep_dir, results (one row dict per configuration, see
    sweeps/results.py), markdown, failed (names of crashed trials) and
    interrupted.
    """
    args = parse_args(sys.argv[1:] if argv is None else argv)
    spec = sweep_spec.load(args.sweep)  # before importing TF: bad input fails fast
    if args.workers is not None and args.workers < 1:
        raise UserError(f"--workers must be at least 1, got {args.workers}.")
    start_up()
    from sweeps import log, validate

    base_bindings = list(spec.bindings) + list(args.gin_bindings)
    validate.check_base(args.gin_file, base_bindings, spec.path)
    sweep_dir = os.path.join(args.root_dir, spec.name)
    workers = args.workers or spec.workers or 1
    plan = _plan(spec, args, base_bindings, sweep_dir)  # validates; starts nothing
    os.makedirs(sweep_dir, exist_ok=True)
    event_log = log.EventLog(sweep_dir)
    launcher = trial.Launcher(args.gin_file, event_log, train_script=args.train_script,
                              force=args.force)
    event_log.write('sweep_start', workers=workers, argv=list(argv or sys.argv[1:]))
    config_results = _run(plan, spec, args, base_bindings, sweep_dir, launcher, workers)
    event_log.write('sweep_end', interrupted=launcher.stop_requested, failed=launcher.crashed)
    return _report(spec, sweep_dir, config_results, launcher)


def _plan(spec, args, base_bindings, sweep_dir):
    """Validates the sweep: the grid's trials, or the search's study URL."""
    from sweeps import grid, search

    if spec.grid is not None:
        return grid.plan(spec, args.gin_file, base_bindings, sweep_dir, force=args.force)
    search.check(spec, args.gin_file, base_bindings)
    os.makedirs(sweep_dir, exist_ok=True)
    return search.storage_url(spec, sweep_dir, args.storage)


def _run(plan, spec, args, base_bindings, sweep_dir, launcher, workers):
    """Runs the planned trials; returns the per-configuration results."""
    from sweeps import grid, search

    if spec.grid is not None:
        print(f'sweep {spec.name}: {len(plan)} trials, {workers} worker(s), in {sweep_dir}',
              flush=True)
        grid.run(plan, launcher, workers)
        return grid.collect(plan)
    print(f'sweep {spec.name}: Optuna {spec.search.sampler} search, {spec.search.num_trials} '
          f'trials x {len(spec.seeds)} seed(s), {workers} worker(s), study in {plan}', flush=True)
    search.run(spec, args.gin_file, base_bindings, sweep_dir, launcher, workers, plan)
    return search.collect(spec, plan, sweep_dir)


def _report(spec, sweep_dir, config_results, launcher):
    """Writes the tables, curves and HParams (one process at a time) and prints the table."""
    from sweeps import curves, hparams, naming, results

    names = naming.short_names(spec.swept_keys)
    with open(os.path.join(sweep_dir, '.report.lock'), 'a') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # processes sharing a sweep dir may finish together
        markdown = results.write(sweep_dir, config_results, names)
        plot = curves.write(sweep_dir, spec.name, config_results)
        hparams.write(sweep_dir, spec, names, config_results)
    print('\n' + markdown, flush=True)
    print(f'results: {os.path.join(sweep_dir, results.CSV_NAME)}'
          + (f'\ncurves:  {plot}' if plot else '')
          + f'\nTensorBoard (HParams tab): tensorboard --logdir {sweep_dir}', flush=True)
    if launcher.crashed:
        print(f'{len(launcher.crashed)} trial(s) failed: ' + ', '.join(launcher.crashed),
              flush=True)
    return {
        'sweep_dir': sweep_dir,
        'results': [results.summarize(result) for result in config_results],
        'markdown': markdown,
        'failed': list(launcher.crashed),
        'interrupted': launcher.stop_requested,
    }


def cli():
    try:
        summary = main()
    except UserError as error:
        print(f"error: {one_line(error)}", file=sys.stderr, flush=True)
        return EXIT_USER_ERROR
    if summary['interrupted']:
        print('Interrupted: rerun the same command to resume.', flush=True)
        return EXIT_INTERRUPTED
    return EXIT_TRIALS_FAILED if summary['failed'] else 0


