"""Submits runs to Slurm: a single training run, a sweep as a job array, a distributed run.

    python -m app.slurm train --gin_file=configs/sac_pendulum.gin --root_dir=runs/pendulum \\
        [train.py's other flags] [--time=4:00:00 --cpus_per_task=4 --partition=... ...]
    python -m app.slurm sweep ...          (see `python -m app.slurm sweep --help`)
    python -m app.slurm distributed ...    (see `python -m app.slurm distributed --help`)

Each writes a readable batch script into the run directory (`<root_dir>/slurm/*.sbatch`),
prints it with `--dry_run`, otherwise submits it and prints the job id and the log path.
Flags this command does not know are the entry point's own and are passed on unchanged, so
the same Gin files and bindings as a local run work. Jobs save and requeue themselves before
their time limit and resume from their checkpoint (app/slurm_jobs.py; docs/cluster.md).
The compute nodes must see this checkout and its .venv at the same path (a shared
filesystem), as on most clusters.
"""

import argparse
import importlib
import os
import sys

from app import slurm_jobs
from app.cli import run_cli
from core.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _train_parser():
    parser = argparse.ArgumentParser(
        prog='python -m app.slurm train',
        description='Submit one train.py run as a Slurm job that saves and requeues itself '
                    'before its time limit. Unknown flags go to train.py.')
    parser.add_argument('--root_dir', required=True,
                        help="the run directory (train.py's --root_dir); the script and the "
                             "job's log go to <root_dir>/slurm/")
    parser.add_argument('--job_name', default=None, help='default: the run directory name')
    slurm_jobs.add_resource_flags(parser)
    return parser


def _check_gin_files(train_args):
    """A missing --gin_file fails here, in one line, not minutes later on a compute node."""
    for i, arg in enumerate(train_args):
        path = None
        if arg.startswith('--gin_file='):
            path = arg.split('=', 1)[1]
        elif arg == '--gin_file' and i + 1 < len(train_args):
            path = train_args[i + 1]
        if path is not None and not os.path.isfile(os.path.join(REPO, path)) \
                and not os.path.isfile(path):
            raise UserError(f'--gin_file={path}: no such file (paths are relative to {REPO}).')


def _job_name(args):
    return args.job_name or os.path.basename(os.path.abspath(args.root_dir).rstrip('/'))


def train_script(args, train_args):
    """The batch script of one train.py run: (script path, its lines)."""
    root_dir = os.path.abspath(args.root_dir)
    name = _job_name(args)
    slurm_dir = os.path.join(root_dir, 'slurm')
    command = [sys.executable, os.path.join(REPO, 'train.py'), f'--root_dir={root_dir}',
               *train_args]
    lines = slurm_jobs.header(name, slurm_jobs.resources_from(args),
                              log_path=os.path.join(slurm_dir, 'train-%j.out'))
    lines += ['', '# Written by `python -m app.slurm train`; rerun the same command to resubmit.',
              'set -u', f'cd {slurm_jobs.quote([REPO])}',
              'echo "[slurm] $(date +%T) job ${SLURM_JOB_ID} on $(hostname), '
              'restart ${SLURM_RESTART_COUNT:-0}"']
    lines += slurm_jobs.save_then_requeue([slurm_jobs.quote(command)])
    return os.path.join(slurm_dir, 'train.sbatch'), lines


def train_main(argv):
    args, train_args = _train_parser().parse_known_args(argv)
    if any(arg == '--root_dir' or arg.startswith('--root_dir=') for arg in train_args):
        raise UserError('give --root_dir once.')
    _check_gin_files(train_args)
    path, lines = train_script(args, train_args)
    slurm_jobs.write_script(path, lines)
    if args.dry_run:
        print('\n'.join(lines))
        return {'script': path}
    slurm_jobs.refuse_if_queued(_job_name(args))
    job = slurm_jobs.submit(path)
    print(f'Submitted job {job}: {path}', flush=True)
    return {'job_id': job, 'script': path}


SUBCOMMANDS = {'train': 'app.slurm:train_main', 'sweep': 'sweeps.slurm_array:main',
               'distributed': 'app.slurm_distributed:main'}


def main(argv=None):
    """Runs the subcommand named first; each imports only what it needs."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in SUBCOMMANDS:
        raise UserError(f"give a subcommand first: {' | '.join(SUBCOMMANDS)} "
                        "(python -m app.slurm SUBCOMMAND --help).")
    module, function = SUBCOMMANDS[argv[0]].split(':')
    return getattr(importlib.import_module(module), function)(argv[1:])


if __name__ == '__main__':
    sys.exit(run_cli(main, result_label='slurm'))
