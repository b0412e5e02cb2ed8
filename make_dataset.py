"""Make an RLDS dataset (TFDS format) by playing a behaviour policy.

  python make_dataset.py --gin_file=configs/datasets/pendulum_medium.gin \\
      [--gin_bindings='make_dataset.num_steps=50000'] [--output_dir=data/my_dataset] [--seed=0]

Kinds: random, expert (a run's exported policy), medium (a training snapshot
at a chosen eval return). 'replay' datasets are recorded by train.py itself
(run.record_dataset=True). The result loads with plain TFDS:
tfds.builder_from_directory(output_dir).as_dataset(split='train').
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
                        help="A Gin binding such as 'make_dataset.num_steps=50000'; repeatable.")
    parser.add_argument('--output_dir', default=None,
                        help='Dataset directory to create (default: data/<first config name>).')
    parser.add_argument('--seed', type=int, default=0, help='Seeds the envs and the noise.')
    return parser.parse_args(argv)


def main(argv=None):
    """Makes the dataset; returns its metadata (raises UserError on bad input)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    check_versions()
    from experiment.quiet import quiet_startup

    quiet_startup()
    from train import load_gin_config

    load_gin_config(args.gin_file, args.gin_bindings)
    from datasets.collect import make_dataset

    name = os.path.splitext(os.path.basename(args.gin_file[0]))[0]
    return make_dataset(args.output_dir or os.path.join('data', name), seed=args.seed)


def cli():
    from train import one_line

    try:
        metadata = main()
    except UserError as error:
        print(f"error: {one_line(error)}", file=sys.stderr, flush=True)
        return 2
    print('dataset: ' + json.dumps(metadata, sort_keys=True), flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(cli())
