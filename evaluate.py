"""Evaluate exported policies on the same episodes, side by side.

  python evaluate.py --env_id=Pendulum-v1 --episodes=100 --seed=123 \\
      runs/cql_offline/seed_0/policy runs/cql_online/seed_0/policy

Every policy plays the same `--episodes` episodes (env copy i is seeded with
seed + i), so differences are the policies', not the start states'. A
training run's periodic evals each draw new start states, which on tasks like
Pendulum moves the average by hundreds; compare policies here.
"""

import argparse
import sys

from experiment.errors import UserError
from experiment.versions import check_versions


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('policy_dirs', nargs='+', help="SavedModel policies (a run's policy/).")
    parser.add_argument('--env_id', required=True, help='Gymnasium id, e.g. Pendulum-v1.')
    parser.add_argument('--episodes', type=int, default=100, help='Episodes per policy.')
    parser.add_argument('--seed', type=int, default=123, help='Seed of the first env copy.')
    return parser.parse_args(argv)


def main(argv=None):
    """Returns [(policy_dir, mean return, std of returns)], in the order given."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    check_versions()
    from experiment.quiet import quiet_startup

    quiet_startup()
    import numpy as np

    from datasets.behaviour import load_saved_policy
    from envs.suite import make_env

    results = []
    for policy_dir in args.policy_dirs:
        act = load_saved_policy(policy_dir)
        env = make_env(args.env_id, num_envs=args.episodes, seed=args.seed)
        time_step = env.reset()
        returns = np.zeros(args.episodes)
        done = np.zeros(args.episodes, bool)
        while not done.all():
            time_step = env.step(act(time_step))
            returns += np.where(done, 0.0, time_step.reward)
            done |= time_step.is_last()
        env.close()
        results.append((policy_dir, float(returns.mean()), float(returns.std())))
        print(f"{policy_dir}: average return {returns.mean():.1f} ± {returns.std():.1f} "
              f"over {args.episodes} episodes (seed {args.seed})", flush=True)
    return results


def cli():
    from train import one_line

    try:
        main()
    except UserError as error:
        print(f"error: {one_line(error)}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == '__main__':
    sys.exit(cli())
