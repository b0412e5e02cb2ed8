"""`python -m app.slurm sweep`: a sweep (grid or Optuna search) as a Slurm job array.

    python -m app.slurm sweep --sweep=configs/sweeps/dqn_search.yaml \\
        --gin_file=configs/dqn_cartpole.gin --root_dir=runs/sweeps \\
        --storage=postgresql://user@dbhost/sweeps --array=4 [--time=4:00:00 ...] [--dry_run]

An entry point, like `app.slurm` that dispatches to it: the work is in sweeps/slurm_array.py
(sweep planning lives in sweeps/, above app/), which also describes how the array's tasks share
the sweep and how a requeued task resumes. `python -m app.slurm_sweep grid_task ...` is what
each task of a grid sweep runs (the generated script says so); nothing else calls it directly.
"""

import sys

from sweeps import slurm_array


def main(argv):
    """Writes the array's batch script and submits it (prints it with --dry_run)."""
    return slurm_array.main(argv)


if __name__ == '__main__':
    sys.exit(slurm_array.cli())
