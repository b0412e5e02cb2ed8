"""Train one experiment from Gin configs (see `python train.py --help`).

  python train.py --gin_file=configs/dqn_cartpole.gin \
      [--gin_bindings='run.num_env_steps=20000'] [--root_dir=runs/my_run] [--seed=1] [--force]

Rerunning the same command on the same --root_dir resumes from the last
checkpoint. Errors the user can fix are printed as one line (exit status 2).
The work is done by `app.cli.train_main`; nothing imports this file.
"""

import sys

from app.cli import exit_at_once, is_role_run, run_cli, train_main

if __name__ == '__main__':
    status = run_cli(train_main)
    if is_role_run(sys.argv[1:]):
        exit_at_once(status)  # a role has saved all it owns: no seconds of teardown
    sys.exit(status)
