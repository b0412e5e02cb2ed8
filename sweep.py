"""Sweep train.py over configurations and seeds: a grid, or an Optuna search.

  python sweep.py --gin_file=configs/dqn_cartpole.gin --sweep=configs/sweeps/dqn_lr.yaml

See `python sweep.py --help` and docs/sweeps.md. The work is done by
`sweeps.cli`; nothing imports this file.
"""

import sys

from sweeps.cli import cli

if __name__ == '__main__':
    sys.exit(cli())
