"""Evaluate exported policies on the same episodes, side by side.

  python evaluate.py --env_id=Pendulum-v1 --episodes=100 --seed=123 \\
      runs/cql_offline/seed_0/policy runs/cql_online/seed_0/policy

Every policy plays the same `--episodes` episodes (env copy i is seeded with
seed + i), so differences are the policies', not the start states'. A
training run's periodic evals each draw new start states, which on tasks like
Pendulum moves the average by hundreds; compare policies here.
The work is done by `app.cli.evaluate_main`; nothing imports this file.
"""

import sys

from app.cli import evaluate_main, run_cli

if __name__ == '__main__':
    sys.exit(run_cli(evaluate_main))
