"""`--collectors=auto`: how many collectors the launcher starts on a machine of N CPUs."""

import subprocess
import sys

import pytest

from experiment.distributed import config


@pytest.mark.parametrize('cpus, expected',
                         [(1, 1), (2, 1), (3, 1), (4, 2), (6, 4), (10, 8), (64, 8)])
def test_auto_leaves_the_learner_and_server_a_core_each_within_1_to_8(cpus, expected):
    assert config.auto_collectors(cpus) == expected


def test_a_bad_collector_count_is_refused_in_one_line():
    done = subprocess.run([sys.executable, '-m', 'app.launch', '--collectors=0',
                           '--gin_file=configs/sac_pendulum_distributed.gin'],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith(
        "argument --collectors: give a whole number of at least 1, or 'auto' (got '0')")
