"""Starts every role of a distributed run on this machine; stops them all on Ctrl-C.

    python -m app.launch --gin_file=configs/sac_pendulum_distributed.gin \\
        [--collectors=auto] [--root_dir=...] [--port=N] [--seed=0] [--bind_all_interfaces]

(`make train-distributed COLLECTORS=2`.) `--collectors=auto` (the default) fits the
machine (`experiment.distributed.config.auto_collectors`). Each role is `train.py --role=...` in
its own process and session, logging to `<root_dir>/logs/<role>.log`. The
launcher starts the replay server, waits until it answers, starts the
learner, the collectors and the evaluator, prints a progress line every
10 s, restarts a role that crashes (up to 3 times each), and ends when the
evaluator has made its final evaluation. Ctrl-C (or SIGTERM) stops the
roles in order: collectors, evaluator and learner together (the learner
checkpoints), then the replay server (it checkpoints last).

Security: the replay server has no authentication, and Reverb listens on
every interface. Unless `--bind_all_interfaces` is given, the launcher
re-executes itself in a new user + network namespace with only loopback
(`unshare --user --map-root-user --net`), so no other machine can reach any
role; it refuses to start if that is impossible here.
"""

import argparse
import os
import signal
import sys

from app import cli
from core.errors import UserError
from experiment.distributed import net
from experiment.distributed.cluster import Cluster, free_port, run_cluster


def _collectors(value):
    if value == 'auto':
        return value
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"give a whole number of at least 1, or 'auto' "
                                         f"(got {value!r})")
    return count


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_gin_flags(parser)
    parser.add_argument('--collectors', type=_collectors, default='auto',
                        help="Collector processes, or 'auto' (default): the CPUs this "
                             "process may use minus 2, at least 1 and at most 8.")
    parser.add_argument('--root_dir', default=None,
                        help='Run directory (default: runs/<first config name>/seed_<seed>).')
    parser.add_argument('--port', type=int, default=None, help='Replay port (default: free).')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--force', action='store_true',
                        help='Resume a run even though its config changed.')
    parser.add_argument('--no_eval', action='store_true',
                        help='Run no evaluator; the run ends when the learner does.')
    parser.add_argument('--bind_all_interfaces', action='store_true',
                        help='Do not isolate the roles in a private network namespace: the '
                             'replay server is then reachable from the network (no '
                             'authentication; trusted networks only).')
    parser.add_argument('--quiet', action='store_true', help='No progress lines.')
    return parser.parse_args(argv)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if not args.bind_all_interfaces and not net.in_private_namespace() and \
            net.exposed_interfaces():
        command = net.private_namespace_command([sys.executable, '-m',
                                                 'app.launch', *argv])
        if command is None:
            raise UserError(
                "Cannot create a private network namespace here (`unshare --user --net` "
                "failed or is missing), and Reverb would listen on every interface: pass "
                "--bind_all_interfaces on a trusted network (Reverb has no authentication).")
        os.execvpe(command[0], command, dict(os.environ, **{net.NETNS_ENV: '1'}))
    from experiment.distributed import config

    cli.start_up()
    cli.load_gin_config(args.gin_file, args.gin_bindings)
    params, settings = config.run_params(), config.settings()
    config.validate(settings, params)
    root_dir = args.root_dir or cli.default_root_dir(args.gin_file, args.seed)
    collectors = args.collectors
    if collectors == 'auto':
        cpus = len(os.sched_getaffinity(0))
        collectors = config.auto_collectors(cpus)
        if not args.quiet:
            print(f'collectors: {collectors} (--collectors=auto on {cpus} CPUs; '
                  '--collectors=N to choose)', flush=True)
    cluster = Cluster(gin_files=args.gin_file, gin_bindings=args.gin_bindings,
                      root_dir=root_dir, port=args.port or free_port(), seed=args.seed,
                      force=args.force, bind_all_interfaces=args.bind_all_interfaces,
                      shards=settings.replay_shards)
    return run_cluster(cluster, collectors=collectors, eval_role=not args.no_eval,
                       settings=settings, params=params, verbose=not args.quiet)


def _interrupt(signum, frame):
    del signum, frame
    raise KeyboardInterrupt()


def _run():
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops the run like Ctrl-C does
    return main()


if __name__ == '__main__':
    # Every role has exited by now: the launcher's own teardown would only delay the end.
    cli.exit_at_once(cli.run_cli(_run, result_label='final metrics', whole_errors=True))
