"""Make an RLDS dataset (TFDS format) by playing a behaviour policy.

  python make_dataset.py --gin_file=configs/datasets/pendulum_medium.gin \\
      [--gin_bindings='make_dataset.num_steps=50000'] [--output_dir=data/my_dataset] [--seed=0]

Kinds: random, expert (a run's exported policy), medium (a training snapshot
at a chosen eval return). 'replay' datasets are recorded by train.py itself
(run.record_dataset=True). The result loads with plain TFDS:
tfds.builder_from_directory(output_dir).as_dataset(split='train').

Minari datasets, both ways (no Gin config; see docs/offline_rl.md "Minari datasets"):

  python make_dataset.py --from_minari=<local id or dataset dir> [--output_dir=data/my_dataset]
  python make_dataset.py --to_minari=<new id, e.g. rlds/pendulum-random-v0> \\
      --dataset_dir=data/pendulum_random [--env_id=Pendulum-v1]

Minari is a separate format, so converting is a mode of this script rather than a kind:
it plays no policy. The work is done by `app.cli.make_dataset_main`; nothing imports this file.
"""

import sys

from app.cli import make_dataset_main, run_cli

if __name__ == '__main__':
    sys.exit(run_cli(make_dataset_main, result_label='dataset'))
