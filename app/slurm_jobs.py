"""Slurm batch scripts: written readable into the run directory, then submitted with sbatch.

Every job this application submits (a single run, a sweep's array of workers, a distributed
run) is a plain bash script a user can read, edit and resubmit by hand: `#SBATCH` lines for
the resources, then the command. Why generated scripts rather than a submission library
(submitit): the script is the documentation of what ran, it needs nothing installed on the
cluster beyond this checkout, and `sbatch` is the one interface every Slurm site has.

Preemption and time limits. A job asks for a warning signal before its time limit
(`--signal=B:USR1@<seconds>`, delivered to the batch shell) and may be requeued
(`--requeue`). The script runs the command in the background and, on the warning, sends it
SIGTERM -- what train.py, sweep.py and the launcher already answer by checkpointing after
the chunk in progress and exiting 0 -- waits for it, then requeues its own job
(`scontrol requeue`); the requeued job reruns the same command, which resumes from the
checkpoint in its run directory. A job Slurm itself preempts or cancels gets SIGTERM the
same way (forwarded to the command), and a preempted job that Slurm requeues (PreemptMode
REQUEUE) resumes the same way. Logs are appended (`--open-mode=append`), so a requeued
job's log continues its first run's.
"""

import dataclasses
import os
import re
import shlex
import shutil
import subprocess

from core.errors import UserError
from core.rundir import atomic_write_text

SBATCH_TIMEOUT_S = 60


@dataclasses.dataclass(frozen=True)
class Resources:
    """What a job asks Slurm for; None leaves a setting to the cluster's defaults.

    Attributes:
      time: the time limit, Slurm's format ('1:00:00', '2-00:00:00', '30' minutes).
      cpus_per_task: cores for each task (a single run: the one process).
      mem: memory per node, Slurm's format ('8G').
      partition, account, qos: where it runs and who pays; site-specific.
      warning_s: seconds before the time limit at which the job is told to save and requeue.
      gpus: GPUs per task (`--gpus-per-task`), 0 for none.
      extra: more `#SBATCH` options, verbatim (e.g. '--constraint=skylake').
    """

    time: str = '1:00:00'
    cpus_per_task: int = 2
    mem: str = None
    partition: str = None
    account: str = None
    qos: str = None
    warning_s: int = 120
    gpus: int = 0
    extra: tuple = ()


def add_resource_flags(parser):
    """The flags of `Resources` on an argparse parser (every `app.slurm` subcommand has them)."""
    group = parser.add_argument_group('Slurm resources (sbatch options)')
    group.add_argument('--time', default='1:00:00', help="time limit (default 1:00:00)")
    group.add_argument('--cpus_per_task', type=int, default=2, help='cores per task (default 2)')
    group.add_argument('--mem', default=None, help="memory per node, e.g. 8G (default: site's)")
    group.add_argument('--partition', default=None)
    group.add_argument('--account', default=None)
    group.add_argument('--qos', default=None)
    group.add_argument('--warning_s', type=int, default=120,
                       help='save and requeue this many seconds before the time limit '
                            '(default 120)')
    group.add_argument('--gpus', type=int, default=0, help='GPUs per task (default 0)')
    group.add_argument('--sbatch', action='append', default=[], metavar='OPTION',
                       help="one more #SBATCH option, verbatim (repeatable), e.g. "
                            "--sbatch=--constraint=skylake")
    group.add_argument('--dry_run', action='store_true',
                       help='write the script and print it; do not submit')


# Slurm's controller checks time limits periodically, so the warning can come up to about a
# minute before the `--warning_s` asked for (measured with the local cluster: a 45 s warning on
# a 1-minute job came 0-27 s after each start). A limit shorter than the warning plus this
# could warn a job before it has done anything, and a requeued one again, forever.
WARNING_EARLY_S = 60


def time_limit_s(text):
    """Seconds in a Slurm time limit ('30', '30:00', '4:00:00', '2-12', '2-12:00:00'), None for
    'UNLIMITED'/'infinite'; a UserError for anything else."""
    if text.lower() in ('unlimited', 'infinite'):
        return None
    days, _, clock = text.rpartition('-')
    parts = clock.split(':')
    if not (days == '' or days.isdigit()) or not all(p.isdigit() for p in parts) \
            or len(parts) > 3:
        raise UserError(f"--time={text!r} is not a Slurm time limit: give minutes ('30'), "
                        "'H:MM:SS' or 'D-HH:MM:SS'.")
    values = [int(p) for p in parts]
    if days:  # days-hours[:minutes[:seconds]]
        hours, minutes, seconds = (values + [0, 0])[:3]
        return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    if len(values) == 3:
        return (values[0] * 60 + values[1]) * 60 + values[2]
    return values[0] * 60 + (values[1] if len(values) == 2 else 0)


def resources_from(args):
    limit = time_limit_s(args.time)
    if limit is not None and limit < args.warning_s + WARNING_EARLY_S:
        raise UserError(f'--time={args.time} leaves no time to work: Slurm may send the '
                        f'--warning_s={args.warning_s} warning up to {WARNING_EARLY_S} s early, '
                        f'so give at least {args.warning_s + WARNING_EARLY_S} s, or a smaller '
                        '--warning_s.')
    if args.cpus_per_task < 1:
        raise UserError(f'--cpus_per_task must be >= 1, got {args.cpus_per_task}.')
    if args.warning_s < 0:
        raise UserError(f'--warning_s must be >= 0 seconds, got {args.warning_s}.')
    for option in args.sbatch:
        if not option.startswith('-'):
            raise UserError(f"--sbatch={option!r} is not an sbatch option: give it as "
                            "--sbatch=--name=value.")
    return Resources(time=args.time, cpus_per_task=args.cpus_per_task, mem=args.mem,
                     partition=args.partition, account=args.account, qos=args.qos,
                     warning_s=args.warning_s, gpus=args.gpus, extra=tuple(args.sbatch))


def header(job_name, resources, *, log_path, ntasks=1, array=None, requeue=True):
    """The `#SBATCH` lines of a job: its name, resources, log, warning signal and requeue."""
    lines = ['#!/bin/bash', f'#SBATCH --job-name={job_name}', f'#SBATCH --output={log_path}',
             '#SBATCH --open-mode=append', f'#SBATCH --ntasks={ntasks}',
             f'#SBATCH --cpus-per-task={resources.cpus_per_task}',
             f'#SBATCH --time={resources.time}']
    if array is not None:
        lines.append(f'#SBATCH --array={array}')
    for option, value in (('mem', resources.mem), ('partition', resources.partition),
                          ('account', resources.account), ('qos', resources.qos)):
        if value:
            lines.append(f'#SBATCH --{option}={value}')
    if resources.gpus:
        lines.append(f'#SBATCH --gpus-per-task={resources.gpus}')
    if requeue:
        lines += ['#SBATCH --requeue', f'#SBATCH --signal=B:USR1@{resources.warning_s}']
    lines += [f'#SBATCH {option}' for option in resources.extra]
    return lines


def save_then_requeue(command_lines):
    """Bash that runs the command (the lines given) in the background, turns the time-limit
    warning (USR1) into its SIGTERM and a requeue of this job, and forwards SIGTERM."""
    return [
        '# The time-limit warning (USR1): the command saves and exits 0 on SIGTERM; then this',
        '# job requeues itself and its rerun resumes from the checkpoint. SIGTERM from scancel',
        '# or preemption is passed on the same way, without the requeue.',
        'requeue=0',
        'child=0',
        "trap 'requeue=1; echo \"[slurm] $(date +%T) time-limit warning: saving, then requeue\"; "
        "kill -TERM $child 2>/dev/null' USR1",
        "trap 'kill -TERM $child 2>/dev/null' TERM",
        *command_lines[:-1],
        f'{command_lines[-1]} &',
        'child=$!',
        '# `wait` returns early when a trapped signal arrives: wait until the command is done.',
        'status=0',
        'while kill -0 $child 2>/dev/null; do wait $child; status=$?; done',
        'if [ $requeue = 1 ]; then',
        '  echo "[slurm] $(date +%T) saved (exit $status); requeueing job ${SLURM_JOB_ID}"',
        '  # An array task by its own name: the job id of an array\'s first task names the',
        '  # whole array, and `scontrol requeue` would requeue every task.',
        '  task=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}',
        '  scontrol requeue "${task:-$SLURM_JOB_ID}"',
        '  exit 0',
        'fi',
        'exit $status',
    ]


def quote(argv):
    return ' '.join(shlex.quote(str(arg)) for arg in argv)


def write_script(path, lines):
    """Writes the script whole or not at all, executable; returns its path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write_text(path, '\n'.join(lines) + '\n')
    os.chmod(path, 0o755)
    return path


def submit(script_path, *extra_args):
    """`sbatch --parsable SCRIPT`; returns the job id, or a one-line error naming the cause."""
    if shutil.which('sbatch') is None:
        raise UserError('sbatch not found: run this on a Slurm login node (or `make slurm` for '
                        'a local test cluster, then export the SLURM_CONF it prints).')
    try:
        done = subprocess.run(['sbatch', '--parsable', *extra_args, script_path],
                              capture_output=True, text=True, timeout=SBATCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise UserError(f'sbatch did not answer within {SBATCH_TIMEOUT_S} s: is slurmctld '
                        'reachable (SLURM_CONF)?') from None
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ['no message'])[-1]
        raise UserError(f'sbatch refused {script_path}: {reason}')
    job = done.stdout.strip().split(';')[0]
    if not re.fullmatch(r'\d+', job):
        raise UserError(f'sbatch gave no job id for {script_path}: {done.stdout.strip()!r}')
    return job


def refuse_if_queued(job_name):
    """Refuses, in one line, a submission while this user's job of the same name is queued or
    running: two jobs on one run directory would fight over it (a double submit). Where
    squeue cannot answer, it lets the submission through; the run's own lock still holds."""
    try:
        done = subprocess.run(['squeue', '-h', '--me', f'--name={job_name}', '-o', '%A'],
                              capture_output=True, text=True, timeout=SBATCH_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return
    queued = sorted(set(done.stdout.split())) if done.returncode == 0 else []
    if queued:
        raise UserError(f'{job_name} is already queued or running as job {", ".join(queued)}: '
                        f'wait for it (squeue --name={job_name}) or scancel it, then rerun.')
