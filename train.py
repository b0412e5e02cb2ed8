"""Train one experiment from Gin configs.

  python train.py --gin_file=configs/dqn_cartpole.gin \
      [--gin_file=configs/testing/tiny.gin] [--gin_bindings='run.num_env_steps=20000'] \
      [--root_dir=runs/my_run] [--seed=1] [--force]

Rerunning the same command on the same --root_dir resumes from the last
checkpoint. Errors the user can fix are printed as one line (exit status 2).

Distributed (one process per role, all from the same configs; see the README):

  python train.py --gin_file=configs/sac_pendulum_distributed.gin \
      --role=replay|collect|learn|eval --replay_address=HOST:PORT \
      [--collector_id=N] [--bind_all_interfaces] [--root_dir=...]
"""

import argparse
import json
import os
import sys

from experiment.errors import UserError
from experiment.versions import check_versions


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--gin_file', action='append', default=[],
                        help='Gin config file; repeatable, later files override earlier ones.')
    parser.add_argument('--gin_bindings', action='append', default=[],
                        help="A Gin binding such as 'run.num_env_steps=20000'; repeatable.")
    parser.add_argument('--root_dir', default=None,
                        help='Run directory (default: runs/<first config name>/seed_<seed>).')
    parser.add_argument('--seed', type=int, default=0, help='Seed for everything the run draws.')
    parser.add_argument('--force', action='store_true',
                        help='Resume a run even though its config changed.')
    parser.add_argument('--role', default=None,
                        choices=('replay', 'collect', 'learn', 'eval'),
                        help='Run one role of a distributed run instead of a whole run.')
    parser.add_argument('--replay_address', default=None,
                        help='HOST:PORT of the replay server (for --role=replay: where to '
                             'serve; loopback unless --bind_all_interfaces).')
    parser.add_argument('--collector_id', type=int, default=0,
                        help='Index of this collector (--role=collect): seeds and log dir.')
    parser.add_argument('--bind_all_interfaces', action='store_true',
                        help='Let the replay server be reachable from the network. Reverb has '
                             'no authentication: trusted networks only.')
    return parser.parse_args(argv)


def default_root_dir(gin_files, seed):
    name = os.path.splitext(os.path.basename(gin_files[0]))[0] if gin_files else 'default'
    return os.path.join('runs', name, f'seed_{seed}')


def load_gin_config(gin_files, gin_bindings):
    """Parses configs strictly and turns Gin's errors into one-line UserErrors."""
    import gin

    import experiment.registry  # noqa: F401  (registers every configurable)

    if not gin_files:
        raise UserError("No --gin_file given: pass e.g. --gin_file=configs/dqn_cartpole.gin.")
    for path in gin_files:
        if not os.path.isfile(path):
            raise UserError(
                f"Gin file not found: {path}. Check the path (configs are in configs/).")
    gin.clear_config()
    try:
        gin.parse_config_files_and_bindings(gin_files, gin_bindings, skip_unknown=False)
    except (ValueError, SyntaxError, TypeError, KeyError, IOError) as error:
        raise UserError(_one_line_gin_error(error)) from None


def _one_line_gin_error(error):
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    where = next((line for line in lines if line.startswith('In ')), '')
    what = lines[0] if lines else type(error).__name__
    hint = ('check the spelling against configs/base/*.gin and the README'
            if 'No configurable matching' in what or 'Unknown' in what else
            'fix the binding or config file')
    return f"Invalid Gin config: {what} {where}".strip() + f" -- {hint}."


def main(argv=None):
    """Runs train.py; returns the final metrics dict (raises UserError on bad input)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    check_versions()
    from experiment.quiet import quiet_startup

    quiet_startup()
    load_gin_config(args.gin_file, args.gin_bindings)
    root_dir = args.root_dir or default_root_dir(args.gin_file, args.seed)
    if args.role is not None:
        from experiment.distributed.roles import run_role

        return run_role(args.role, root_dir, address=args.replay_address,
                        collector_id=args.collector_id, seed=args.seed, force=args.force,
                        bind_all_interfaces=args.bind_all_interfaces)
    from experiment.entry import experiment_function

    return experiment_function()(root_dir, seed=args.seed, force=args.force)


def one_line(error):
    """The first line of an error: Gin appends 'In call to configurable ...' lines."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def cli():
    try:
        metrics = main()
    except UserError as error:
        print(f"error: {one_line(error)}", file=sys.stderr, flush=True)
        return 2
    print('final metrics: ' + json.dumps(metrics, sort_keys=True), flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(cli())
