"""`python -m app.slurm distributed`: a whole distributed run as one Slurm job.

    python -m app.slurm distributed --gin_file=configs/sac_pendulum_distributed.gin \\
        --root_dir=runs/dist --collectors=2 [--replay_shards=2] [--nodes=1] \\
        [--learner_cpus=2 --collector_cpus=1 --replay_cpus=1 --eval_cpus=1] \\
        [--time=4:00:00 --mem=16G --partition=... ...] [--dry_run]

writes `<root_dir>/slurm/distributed.sbatch` (log `<root_dir>/slurm/distributed-%j.out`) and
submits it; every role logs to `<root_dir>/logs/<role>.log`, as under the local launcher. The
same Gin files and bindings as a local run (`python -m app.launch`); `--replay_shards=K` is
short for `--gin_bindings=distributed.settings.replay_shards=K` (with K > 1 also
`learner_holds_replay=False`: the shards hold the replay). The config is loaded and
checked here, before anything is submitted.

Design: srun steps of one job, supervised by the local launcher's own code. The batch script
runs `python -m app.slurm_distributed roles ...` (the supervisor) on the job's first node, and
the supervisor runs `experiment.distributed.cluster.run_cluster` -- the launcher's start order
(replay shards, wait until each answers, then learner, collectors, evaluator), its restarts of
a crashed role (3 at most), its progress lines, its end (the evaluator's last evaluation) and
its stop order (collectors, evaluator and learner, then the replay shards) -- with one thing
swapped: `SrunStarter` (app/slurm_steps.py) starts each role as `srun --ntasks=1
--cpus-per-task=K --exact --nodelist=HOST --job-name=ROLE train.py --role=...`, a step of this
job, and signals a role with `scancel --signal=INT JOB.STEP` (why not a signal to srun: see
there). Why steps of one ordinary job and not a heterogeneous job: one job id to watch, cancel
and requeue; every role is a named step (`squeue -s`) with exactly its own cores (`--exact`),
placed on the node chosen for it; steps are restartable one by one inside the allocation (a
heterogeneous job still needs srun steps for that, and is refused or badly backfilled at some
sites). Why the launcher's code rather than a bash supervisor: the ordering, the wait for the
replay server and the restarts stay in one tested place.

Placement. `--nodes=N` (default 1) nodes, one node list from Slurm. Replay shard i runs on
node i mod N, collector j on node j mod N (so every node that has collectors has a shard, and
its collectors write to it locally: a collector prefers a shard on its own host), the learner
and the evaluator on node 0 with shard 0 (which also holds the weights). N must not exceed the
number of shards. The job asks for `--nodes=N --ntasks-per-node=1 --cpus-per-task=C`, C the
cores of the busiest node (roles' cores added up); `--mem` is per node and each step gets its
cores' share (`--mem-per-cpu`); `--gpus=G` gives the learner G GPUs (`--gpus-per-node`).

Addresses come from Slurm's own environment: the batch script expands `$SLURM_JOB_NODELIST`
with `scontrol show hostnames` and picks the shards' ports from the job id (20000 + 16 x (job
id mod 1000) + shard; `--port=P` for fixed ports P, P+1, ...): a requeued job keeps its id, so
its shards come back at the same addresses. Every role gets every shard's HOST:PORT in order.

Security: the local launcher's private network namespace (loopback only) cannot span nodes.
Here the replay shards run with `--bind_all_interfaces`: Reverb listens on every interface of
its node, unauthenticated, so anyone who can reach that node and port can read the replay
data, overwrite the policy weights or fill the table. Run it only on a cluster network you
trust (as compute networks usually are: reachable by the cluster's users, not the internet).

Stopping. `scancel JOB` (the job's Ctrl-C): Slurm sends SIGTERM to every step and to the batch
script at once; each role saves as it does on Ctrl-C (learner and replay shards checkpoint)
within the cluster's KillWait. The supervisor then sends nothing more (a role's second signal
ends it at once, unsaved): `SrunStarter` sends no signal while the job is no longer RUNNING.
All stop together, so the learner's last weight push finds the shards gone and gives up after
`distributed.settings.timeout_s` (its checkpoint is saved before). `scancel --batch
--signal=TERM JOB` stops in the launcher's order instead (only the batch script is signalled:
it passes SIGTERM to the supervisor), and the job ends without a requeue.
Time limit: the job asks for `--signal=B:USR1@<warning_s>`; the batch script turns the warning
into SIGTERM to the supervisor, which stops the roles in the launcher's order (all but the
replay shards, then the shards), and requeues the job (`slurm_jobs.save_then_requeue`); the
requeued job reruns the script, and every role resumes from its checkpoint in the run
directory, as a rerun of the local launcher does. Preemption that requeues works like scancel.
"""

import argparse
import os
import re
import signal
import sys

from app import slurm_jobs
from app.slurm_steps import SrunStarter
from core.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROLES_COMMAND = 'roles'
SCRIPT_NAME = 'distributed.sbatch'
DEFAULT_CPUS = {'learner': 2, 'collector': 1, 'replay': 1, 'eval': 1}
PORT_BASE, PORT_SPAN, PORTS_PER_JOB = 20000, 1000, 16


# ---- Placement -------------------------------------------------------------------------------

def placement(*, nodes, shards, collectors, eval_role, cpus):
    """[(name, role, index, node, cores)] in start order: shards, learner, collectors, eval."""
    from experiment.distributed.common import role_name

    roles = [(role_name('replay', i, shards), 'replay', i, i % nodes, cpus['replay'])
             for i in range(shards)]
    roles.append(('learner', 'learn', 0, 0, cpus['learner']))
    roles += [(role_name('collect', j, shards), 'collect', j, j % nodes, cpus['collector'])
              for j in range(collectors)]
    if eval_role:
        roles.append(('eval', 'eval', 0, 0, cpus['eval']))
    return roles


def node_cores(roles, nodes):
    """Cores each node needs: its roles' cores added up."""
    cores = [0] * nodes
    for _, _, _, node, count in roles:
        cores[node] += count
    return cores


def job_ports(job_id, port=None):
    """The first shard's port: `port`, else one derived from the job id (stable on requeue)."""
    if port:
        return int(port)
    return PORT_BASE + PORTS_PER_JOB * (int(job_id) % PORT_SPAN)


def _mem_mb(mem):
    """Slurm's memory size ('16G', '500M', '1T', plain number = MB) in MB."""
    match = re.fullmatch(r'(\d+)([KMGT]?)B?', str(mem).strip().upper())
    if not match:
        raise UserError(f"--mem={mem!r} is not a Slurm memory size (e.g. 16G, 500M).")
    scale = {'K': 1 / 1024, '': 1, 'M': 1, 'G': 1024, 'T': 1024 * 1024}[match.group(2)]
    return int(int(match.group(1)) * scale)


# ---- The batch script ------------------------------------------------------------------------

def _parser():
    parser = argparse.ArgumentParser(
        prog='python -m app.slurm distributed',
        description='Submit a distributed run (replay shards, learner, collectors, evaluator) '
                    'as one Slurm job: every role an srun step, supervised as by app.launch.')
    from app import cli

    cli.add_gin_flags(parser)
    parser.add_argument('--root_dir', required=True,
                        help='the run directory; the script and the job log go to '
                             '<root_dir>/slurm/, the roles\' logs to <root_dir>/logs/')
    parser.add_argument('--collectors', type=int, default=1, help='collector roles (default 1)')
    parser.add_argument('--replay_shards', type=int, default=None,
                        help='short for --gin_bindings=distributed.settings.replay_shards=K '
                             '(and, K > 1, learner_holds_replay=False; default: the '
                             'config\'s, 1 unless bound)')
    parser.add_argument('--nodes', type=int, default=1,
                        help='nodes (default 1); shard i and collector j on node i (j) mod N')
    parser.add_argument('--no_eval', action='store_true',
                        help='no evaluator: the run ends when the learner does')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--force', action='store_true',
                        help='resume a run even though its config changed')
    parser.add_argument('--port', type=int, default=None,
                        help='replay shard i listens on PORT+i (default: from the job id)')
    parser.add_argument('--job_name', default=None, help='default: the run directory name')
    for role, cores in DEFAULT_CPUS.items():
        parser.add_argument(f'--{role}_cpus', type=int, default=cores,
                            help=f'cores for each {role} role (default {cores})')
    slurm_jobs.add_resource_flags(parser)
    return parser


def _check_args(args, argv):
    if any(arg == '--cpus_per_task' or arg.startswith('--cpus_per_task=') for arg in argv):
        raise UserError('a distributed job asks cores per role: give --learner_cpus, '
                        '--collector_cpus, --replay_cpus or --eval_cpus, not --cpus_per_task.')
    for role in DEFAULT_CPUS:
        if getattr(args, f'{role}_cpus') < 1:
            raise UserError(f'--{role}_cpus must be >= 1, got {getattr(args, f"{role}_cpus")}.')
    for flag in ('collectors', 'nodes'):
        if getattr(args, flag) < 1:
            raise UserError(f'--{flag} must be >= 1, got {getattr(args, flag)}.')
    if args.replay_shards is not None and args.replay_shards < 1:
        raise UserError(f'--replay_shards must be >= 1, got {args.replay_shards}.')
    if args.port is not None and not 1024 <= args.port < 65536 - PORTS_PER_JOB:
        raise UserError(f'--port must be in 1024..{65535 - PORTS_PER_JOB}, got {args.port}.')
    if not args.gin_file:
        raise UserError('no --gin_file given: pass e.g. '
                        '--gin_file=configs/sac_pendulum_distributed.gin.')


def _bindings(args):
    bindings = list(args.gin_bindings)
    if args.replay_shards is not None:
        bindings.append(f'distributed.settings.replay_shards={args.replay_shards}')
        if args.replay_shards > 1:  # sharded replay lives on the servers, not the learner
            bindings.append('distributed.settings.learner_holds_replay=False')
    return bindings


def _load_config(gin_files, bindings):
    """Loads and checks the run's config as every role will; returns (settings, params)."""
    from app import cli

    cli.start_up()
    cwd = os.getcwd()
    os.chdir(REPO)  # config paths and includes are relative to the checkout, as in the job
    try:
        cli.load_gin_config(gin_files, bindings)
        from experiment.distributed import config

        params, settings = config.run_params(), config.settings()
        config.validate(settings, params)
    finally:
        os.chdir(cwd)
    return settings, params


def _cpus(args):
    return {role: getattr(args, f'{role}_cpus') for role in DEFAULT_CPUS}


def roles_command(args, root_dir, bindings):
    """The supervisor's command line (without the --hosts and --port the script adds)."""
    command = [sys.executable, '-m', 'app.slurm_distributed', ROLES_COMMAND,
               *[f'--gin_file={f}' for f in args.gin_file],
               *[f'--gin_bindings={b}' for b in bindings],
               f'--root_dir={root_dir}', f'--collectors={args.collectors}',
               f'--nodes={args.nodes}', f'--seed={args.seed}',
               *[f'--{role}_cpus={count}' for role, count in _cpus(args).items()]]
    if args.resources.mem:
        command.append(f'--mem_per_node_mb={_mem_mb(args.resources.mem)}')
    if args.resources.gpus:
        command.append(f'--learner_gpus={args.resources.gpus}')
    if args.no_eval:
        command.append('--no_eval')
    if args.force:
        command.append('--force')
    return command


def distributed_script(args, shards):
    """(script path, its lines) of the job that runs every role of the run."""
    root_dir = os.path.abspath(args.root_dir)
    name = args.job_name or os.path.basename(root_dir.rstrip('/'))
    slurm_dir = os.path.join(root_dir, 'slurm')
    roles = placement(nodes=args.nodes, shards=shards, collectors=args.collectors,
                      eval_role=not args.no_eval, cpus=_cpus(args))
    cores = node_cores(roles, args.nodes)
    resources = args.resources
    header = slurm_jobs.header(
        name, slurm_jobs.Resources(time=resources.time, cpus_per_task=max(cores),
                                   mem=resources.mem, partition=resources.partition,
                                   account=resources.account, qos=resources.qos,
                                   warning_s=resources.warning_s, gpus=0,
                                   extra=resources.extra),
        log_path=os.path.join(slurm_dir, 'distributed-%j.out'), ntasks=args.nodes)
    at = header.index(f'#SBATCH --ntasks={args.nodes}') + 1
    header[at:at] = [f'#SBATCH --nodes={args.nodes}', '#SBATCH --ntasks-per-node=1']
    if resources.gpus:
        header.append(f'#SBATCH --gpus-per-node={resources.gpus}')
    if args.port:
        port_line = f'port={args.port}  # --port: shard i listens on port+i'
    else:
        port_line = (f'port=$(( {PORT_BASE} + {PORTS_PER_JOB} * (SLURM_JOB_ID % {PORT_SPAN}) ))'
                     '  # shard i on port+i; a requeued job keeps its id, so its ports')
    by_node = []
    for node in range(args.nodes):
        here = ', '.join(f'{role} ({count} core{"s" * (count > 1)})'
                         for role, _, _, at_node, count in roles if at_node == node)
        by_node.append(f'#   node {node} ({cores[node]} cores): {here}')
    shard_lines = [f'#   {role_name}: node {node}, port+{index}'
                   for role_name, role, index, node, _ in roles if role == 'replay']
    command = roles_command(args, root_dir, _bindings(args))
    lines = header + [
        '',
        '# Written by `python -m app.slurm distributed`; rerun the same command to resubmit.',
        '# Every role is an srun step of this job (`squeue -s -j <job>`), started, restarted',
        '# and stopped by the supervisor below as `python -m app.launch` does locally:',
        '#   srun --ntasks=1 --cpus-per-task=<cores> --exact --nodelist=<node> '
        '--job-name=<role> train.py --role=...',
        *by_node,
        '# Replay shards (every role gets every shard\'s HOST:PORT, in order):',
        *shard_lines,
        f'# Logs: this file (the supervisor), {root_dir}/logs/<role>.log (each role).',
        '# scancel <job>: every role saves and exits (learner and shards checkpoint);',
        '# scancel --batch --signal=TERM <job>: the same, in order (shards last).',
        '# Time limit: USR1 -> the roles stop in order and save, the job requeues and resumes.',
        'set -u',
        f'cd {slurm_jobs.quote([REPO])}',
        'echo "[slurm] $(date +%T) job ${SLURM_JOB_ID} on $(hostname), '
        'restart ${SLURM_RESTART_COUNT:-0}"',
        '# The job\'s nodes, in Slurm\'s order (node 0 first): the roles\' hosts.',
        'hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)',
        port_line,
        'echo "[slurm] nodes ${hosts}; replay shard 0 at ${hosts%%,*}:${port}"',
    ]
    lines += slurm_jobs.save_then_requeue(
        [slurm_jobs.quote(command) + ' --hosts="$hosts" --port="$port"'])
    return os.path.join(slurm_dir, SCRIPT_NAME), lines


def main(argv):
    """Writes the job's script; submits it unless --dry_run. Returns a summary dict."""
    args = _parser().parse_args(argv)
    _check_args(args, argv)
    args.resources = slurm_jobs.resources_from(
        argparse.Namespace(**{**vars(args), 'cpus_per_task': 1}))
    if args.resources.mem:
        _mem_mb(args.resources.mem)
    settings, _ = _load_config(args.gin_file, _bindings(args))
    shards = settings.replay_shards
    if args.nodes > shards:
        raise UserError(f'--nodes={args.nodes} with {shards} replay shard(s): give each node a '
                        'shard (--replay_shards) so its collectors write locally, or fewer '
                        'nodes.')
    path, lines = distributed_script(args, shards)
    slurm_jobs.write_script(path, lines)
    if args.dry_run:
        print('\n'.join(lines), flush=True)
        return {'script': path}
    job_name = args.job_name or os.path.basename(os.path.abspath(args.root_dir).rstrip('/'))
    slurm_jobs.refuse_if_queued(job_name)
    job = slurm_jobs.submit(path)
    log = os.path.join(os.path.abspath(args.root_dir), 'slurm', f'distributed-{job}.out')
    print(f'Submitted job {job}: {path}\nlog: {log}\nroles\' logs: '
          f'{os.path.join(os.path.abspath(args.root_dir), "logs")}/', flush=True)
    return {'job_id': job, 'script': path}


# ---- Inside the job: the supervisor ----------------------------------------------------------

def _roles_parser():
    from app import cli

    parser = argparse.ArgumentParser(prog='python -m app.slurm_distributed roles',
                                     description='Run every role as an srun step of this job '
                                                 '(inside the batch script only).')
    cli.add_gin_flags(parser)
    parser.add_argument('--root_dir', required=True)
    parser.add_argument('--collectors', type=int, required=True)
    parser.add_argument('--nodes', type=int, default=1)
    parser.add_argument('--hosts', required=True, help="the job's nodes, comma-separated")
    parser.add_argument('--port', type=int, required=True)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--force', action='store_true')
    parser.add_argument('--no_eval', action='store_true')
    parser.add_argument('--mem_per_node_mb', type=int, default=None)
    parser.add_argument('--learner_gpus', type=int, default=0)
    for role, cores in DEFAULT_CPUS.items():
        parser.add_argument(f'--{role}_cpus', type=int, default=cores)
    return parser


def roles_main(argv):
    """The supervisor inside the job: run_cluster with every role an srun step."""
    from experiment.distributed.cluster import Cluster, run_cluster

    args = _roles_parser().parse_args(argv)
    job_id = os.environ.get('SLURM_JOB_ID')
    if not job_id:
        raise UserError('`app.slurm_distributed roles` runs inside the job its script '
                        'submits (no SLURM_JOB_ID here): use python -m app.slurm distributed.')
    hosts = [host for host in args.hosts.split(',') if host]
    if len(hosts) < args.nodes:
        raise UserError(f'{args.nodes} nodes asked for, the job has {hosts}.')
    settings, params = _load_config(args.gin_file, args.gin_bindings)
    shards = settings.replay_shards
    roles = placement(nodes=args.nodes, shards=shards, collectors=args.collectors,
                      eval_role=not args.no_eval, cpus=_cpus(args))
    mem_per_cpu = None
    if args.mem_per_node_mb:
        mem_per_cpu = max(1, args.mem_per_node_mb // max(node_cores(roles, args.nodes)))
    addresses = [f'{hosts[node]}:{args.port + index}'
                 for _, role, index, node, _ in roles if role == 'replay']
    starter = SrunStarter(job_id, hosts, roles, mem_per_cpu_mb=mem_per_cpu,
                          learner_gpus=args.learner_gpus,
                          say=lambda text: print(text, flush=True))
    cluster = Cluster(gin_files=args.gin_file, gin_bindings=args.gin_bindings,
                      root_dir=os.path.abspath(args.root_dir), seed=args.seed,
                      force=args.force, bind_all_interfaces=True, shards=shards,
                      shard_addresses=addresses, starter=starter)
    print(f'[slurm] replay shard(s) at {cluster.address}', flush=True)
    return run_cluster(cluster, collectors=args.collectors, eval_role=not args.no_eval,
                       settings=settings, params=params)


def _stop_once(signum, frame):
    """SIGTERM (scancel reaches the supervisor twice: from Slurm and from the batch script's
    trap) starts one orderly stop; later ones are left to run_cluster's own handler."""
    del frame
    signal.signal(signum, signal.SIG_IGN)
    raise KeyboardInterrupt()


def _cli():
    from app import cli

    argv = sys.argv[1:]
    if argv[:1] != [ROLES_COMMAND]:
        return cli.run_cli(lambda: main(argv))
    signal.signal(signal.SIGTERM, _stop_once)
    signal.signal(signal.SIGINT, _stop_once)
    status = cli.run_cli(lambda: roles_main(argv[1:]), result_label='final metrics',
                         whole_errors=True)
    return status


if __name__ == '__main__':
    # Every role has exited by now: the supervisor's own teardown would only delay the end.
    from app.cli import exit_at_once

    exit_at_once(_cli())
