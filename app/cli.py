"""What every entry point shares: Gin loading, train.py's flags and main, one-line errors.

Entry points (train.py, sweep.py, evaluate.py, make_dataset.py, the
distributed launcher) stay thin: they call into this module and print. It
imports no TensorFlow at import time, so a bad flag or config fails before
the ~3 s TF start-up.
"""

import argparse
import json
import os
import re
import sys

from core.errors import UserError
from core.versions import check_versions

TRAIN_USAGE = """Train one experiment from Gin configs.

  python train.py --gin_file=configs/dqn_cartpole.gin \\
      [--gin_file=configs/testing/tiny.gin] [--gin_bindings='run.num_env_steps=20000'] \\
      [--root_dir=runs/my_run] [--seed=1] [--force]

Rerunning the same command on the same --root_dir resumes from the last
checkpoint. Errors the user can fix are printed as one line (exit status 2).

Distributed (one process per role, all from the same configs; see docs/distributed.md):

  python train.py --gin_file=configs/sac_pendulum_distributed.gin \\
      --role=replay|collect|learn|eval --replay_address=HOST:PORT[,HOST:PORT...] \\
      [--collector_id=N] [--shard=N] [--bind_all_interfaces] [--root_dir=...]
"""


def add_gin_flags(parser, example="run.num_env_steps=20000"):
    """--gin_file and --gin_bindings, both repeatable, as every entry point takes them."""
    parser.add_argument('--gin_file', action='append', default=[],
                        help='Gin config file; repeatable, later files override earlier ones.')
    parser.add_argument('--gin_bindings', action='append', default=[],
                        help=f"A Gin binding such as '{example}'; repeatable.")


def parse_train_args(argv):
    parser = argparse.ArgumentParser(description=TRAIN_USAGE.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=TRAIN_USAGE)
    add_gin_flags(parser)
    add_verbose_flag(parser)
    parser.add_argument('--print_metrics', action='store_true',
                        help="End with a 'final metrics: <json>' line (for scripts; the same "
                             "is in <root_dir>/metrics.json).")
    parser.add_argument('--root_dir', default=None,
                        help='Run directory (default: runs/<first config name>/seed_<seed>).')
    parser.add_argument('--seed', type=int, default=0, help='Seed for everything the run draws.')
    parser.add_argument('--force', action='store_true',
                        help='Resume a run even though its config changed.')
    parser.add_argument('--role', default=None,
                        choices=('replay', 'collect', 'learn', 'eval'),
                        help='Run one role of a distributed run instead of a whole run.')
    parser.add_argument('--replay_address', default=None,
                        help='HOST:PORT of the replay server, or of every replay shard in '
                             'order, comma-separated (distributed.settings.replay_shards); '
                             'for --role=replay, where to serve (loopback unless '
                             '--bind_all_interfaces).')
    parser.add_argument('--shard', type=int, default=0,
                        help='Which replay shard this process serves (--role=replay).')
    parser.add_argument('--collector_id', type=int, default=0,
                        help='Index of this collector (--role=collect): seeds and log dir.')
    parser.add_argument('--bind_all_interfaces', action='store_true',
                        help='Let the replay server be reachable from the network. Reverb has '
                             'no authentication: trusted networks only.')
    return parser.parse_args(argv)


def default_root_dir(gin_files, seed):
    name = os.path.splitext(os.path.basename(gin_files[0]))[0] if gin_files else 'default'
    return os.path.join('runs', name, f'seed_{seed}')


def add_verbose_flag(parser):
    parser.add_argument('--verbose', action='store_true',
                        help="Show TensorFlow's, absl's and XLA's own log lines (hidden by "
                             "default: none of them is actionable in a normal run).")


def start_up(verbose=False):
    """Checks the pinned stack, then silences TF's start-up noise (call before parsing Gin)."""
    check_versions()
    from core.quiet import quiet_startup

    quiet_startup(library_logs=verbose)


def load_gin_config(gin_files, gin_bindings):
    """Parses configs strictly and turns Gin's errors into one-line UserErrors."""
    import gin

    import app.registry  # noqa: F401  (registers every configurable)

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
    hint = ('check the spelling against configs/base/*.gin and docs/training.md'
            if 'No configurable matching' in what or 'Unknown' in what else
            'fix the binding or config file')
    return f"Invalid Gin config: {what} {where}".strip() + f" -- {hint}."


def train_main(argv=None):
    """train.py: returns the final metrics dict (raises UserError on bad input)."""
    args = parse_train_args(sys.argv[1:] if argv is None else argv)
    start_up(args.verbose)
    load_gin_config(args.gin_file, args.gin_bindings)
    root_dir = args.root_dir or default_root_dir(args.gin_file, args.seed)
    if args.role is not None:
        from experiment.distributed.roles import run_role

        return run_role(args.role, root_dir, address=args.replay_address,
                        collector_id=args.collector_id, shard=args.shard, seed=args.seed,
                        force=args.force,
                        bind_all_interfaces=args.bind_all_interfaces)
    from app.entry import experiment_function

    metrics = experiment_function()(root_dir, seed=args.seed, force=args.force)
    if args.print_metrics:
        print('final metrics: ' + json.dumps(metrics, sort_keys=True), flush=True)
    return metrics


def make_dataset_main(argv=None):
    """make_dataset.py: makes the dataset; returns its metadata (raises UserError on bad input)."""
    parser = argparse.ArgumentParser(
        description='Make an RLDS dataset (TFDS format) by playing a behaviour policy, or '
                    'convert one from or to a Minari dataset.')
    add_gin_flags(parser, example='make_dataset.num_steps=50000')
    parser.add_argument('--output_dir', default=None,
                        help='Dataset directory to create (default: data/<first config name>, '
                             'or data/<Minari id> with --from_minari).')
    parser.add_argument('--seed', type=int, default=0, help='Seeds the envs and the noise.')
    parser.add_argument('--from_minari', default=None, metavar='ID_OR_DIR',
                        help='Convert this local Minari dataset (id or directory) to RLDS at '
                             '--output_dir instead of playing a policy.')
    parser.add_argument('--to_minari', default=None, metavar='NEW_ID',
                        help='Convert the RLDS dataset at --dataset_dir to a new Minari '
                             'dataset with this id (under MINARI_DATASETS_PATH).')
    parser.add_argument('--dataset_dir', default=None,
                        help='The RLDS dataset that --to_minari converts.')
    parser.add_argument('--env_id', default=None,
                        help="With --to_minari: the env whose spaces the dataset has, when "
                             "its collection.json names none.")
    add_verbose_flag(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    start_up(args.verbose)
    if args.from_minari or args.to_minari:
        return _convert_minari(args)
    load_gin_config(args.gin_file, args.gin_bindings)
    from experiment.dataset_collection import make_dataset

    name = os.path.splitext(os.path.basename(args.gin_file[0]))[0]
    return make_dataset(args.output_dir or os.path.join('data', name), seed=args.seed)


def _convert_minari(args):
    """make_dataset.py --from_minari / --to_minari: one conversion, no Gin config."""
    if args.gin_file or args.gin_bindings:
        raise UserError("--from_minari and --to_minari convert a dataset and take no "
                        "--gin_file or --gin_bindings.")
    if args.from_minari and args.to_minari:
        raise UserError("Pass one of --from_minari and --to_minari, not both.")
    if args.to_minari and not args.dataset_dir:
        raise UserError("--to_minari needs --dataset_dir (the RLDS dataset to convert).")
    from rlds_io import minari_io

    if args.from_minari:
        source = args.from_minari
        name = (os.path.basename(os.path.normpath(source)) if os.path.isdir(source)
                else source.strip('/').replace('/', '_'))
        return minari_io.minari_to_rlds(source, args.output_dir or os.path.join('data', name))
    return minari_io.rlds_to_minari(args.dataset_dir, args.to_minari, env_id=args.env_id)


def evaluate_main(argv=None):
    """evaluate.py: plays policies on the same seeded episodes; returns the report dict."""
    parser = argparse.ArgumentParser(
        description='Evaluate exported policies on the same episodes, side by side.')
    parser.add_argument('policy_dirs', nargs='+',
                        help="SavedModel policies: a run's policy/ (final), policy_best/, or a "
                             "snapshot under policies/.")
    parser.add_argument('--env_id', default=None,
                        help="Gymnasium id, e.g. Pendulum-v1 (default: the run's, read from "
                             "the config.gin next to the first policy).")
    parser.add_argument('--episodes', type=int, default=100, help='Episodes per policy.')
    parser.add_argument('--seed', type=int, default=123, help='Seed of the first env copy.')
    parser.add_argument('--report', default=None,
                        help='Also write the report (every return, intervals) as JSON here.')
    parser.add_argument('--video', default=None, metavar='DIR',
                        help="Record each policy's episode from --seed as a GIF in DIR.")
    parser.add_argument('--epsilon', type=float, default=0.0,
                        help='Random actions with this probability (discrete actions; Atari '
                             'protocols use 0.001, as run.eval_epsilon does in training).')
    add_verbose_flag(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.episodes < 1:
        raise UserError(f"--episodes must be at least 1, got {args.episodes}.")
    if not 0.0 <= args.epsilon <= 1.0:
        raise UserError(f"--epsilon must lie in [0, 1], got {args.epsilon}.")
    start_up(args.verbose)
    from experiment.evaluation import compare_policies

    env_id = args.env_id or _run_env_id(args.policy_dirs[0])
    return compare_policies(args.policy_dirs, env_id=env_id, episodes=args.episodes,
                            seed=args.seed, report_path=args.report, video_dir=args.video,
                            epsilon=args.epsilon)


def _run_env_id(policy_dir):
    """make_env.env_id from the config.gin of the run a policy was exported from."""
    for run_dir in (os.path.dirname(os.path.normpath(policy_dir)),
                    os.path.dirname(os.path.dirname(os.path.normpath(policy_dir)))):
        try:
            with open(os.path.join(run_dir, 'config.gin')) as f:
                text = f.read()
        except OSError:
            continue
        found = re.search(r"^make_env\.env_id\s*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
        if found:
            return found.group(1)
        return 'CartPole-v1'  # make_env's default, which the run's config left unbound
    raise UserError(f"No run config.gin next to {policy_dir}: pass --env_id (e.g. "
                    "--env_id=CartPole-v1).")


def one_line(error):
    """The first line of an error: Gin appends 'In call to configurable ...' lines."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def is_role_run(argv):
    """Whether train.py's arguments run one role of a distributed run (`--role=...`)."""
    return any(arg == '--role' or arg.startswith('--role=') for arg in argv)


def exit_at_once(status):
    """Ends the process now with `status`, skipping the interpreter's teardown.

    Only for processes that have saved what they own and closed their files: a
    distributed role after it returned, the launcher after every role exited. An
    ordinary exit then spends seconds in TensorFlow's and Reverb's destructors and
    joining gRPC threads, and a run that reached its budget would sit idle that long.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def run_cli(main, *, result_label=None, user_error_status=2, whole_errors=False):
    """Runs `main()`; a UserError becomes one line on stderr and exit status 2.

    Args:
      main: the entry point's main function (no arguments: it reads sys.argv).
      result_label: if given, the returned value is printed as
        '<label>: <json>' (what tests and scripts read back).
      user_error_status: the exit status for a UserError.
      whole_errors: print every line of a UserError (the launcher's carry a
        failed role's log tail), not only the first.

    Returns:
      The process exit status.
    """
    try:
        result = main()
    except UserError as error:
        text = str(error).strip() if whole_errors else one_line(error)
        print(f"error: {text}", file=sys.stderr, flush=True)
        return user_error_status
    if result_label is not None:
        print(f'{result_label}: ' + json.dumps(result, sort_keys=True), flush=True)
    return 0
