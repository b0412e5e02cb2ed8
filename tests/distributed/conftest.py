"""A tiny distributed run on localhost for the fault-injection tests, killed in teardown.

Every role is a real `train.py --role=...` process (what the launcher starts),
on SAC Pendulum shrunk to (8, 8) networks, batch 16 and 4 gradient steps per
call, with 2-second timeouts and checkpoints so that faults show quickly. The
step budget is far away: the run never ends by itself, the tests end it.

The test process must reach the server, so these clusters serve every
interface (`bind_all_interfaces=True`) for their few minutes; the launcher's
private-namespace mode is covered by tests/distributed/test_launch.py.
"""

import os
import time

import pytest
import reverb

from experiment.distributed import tables
from experiment.distributed.cluster import Cluster, free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GIN_FILES = ['configs/sac_pendulum_distributed.gin', 'configs/testing/tiny_sac.gin']
FAST = [
    # The fault and priority tests read the replay on the server (tests/distributed/
    # test_held_replay.py covers a learner holding it).
    'distributed.settings.learner_holds_replay = False',
    'distributed.settings.error_buffer = 128',  # 2 calls x 4 steps x batch 16
    'distributed.settings.timeout_s = 2',
    'distributed.settings.give_up_after_s = 150',
    'distributed.settings.summary_interval_s = 2',
    'distributed.settings.server_checkpoint_interval_s = 2',
    'distributed.settings.learner_checkpoint_interval = 20',
    'distributed.settings.weight_pull_interval = 16',
]
WAIT_S = 150  # the longest any test waits for one condition (a busy 2-core machine)


def tiny_dqn_cluster(tmp_path, *bindings, shards=1):
    """Real roles on DQN CartPole shrunk to (8, 8) networks, with `bindings` added (and
    `shards` replay shards: bind distributed.settings.replay_shards to the same)."""
    os.chdir(ROOT)
    return Cluster(
        gin_files=['configs/dqn_cartpole.gin', 'configs/testing/tiny.gin'],
        gin_bindings=FAST + [*bindings, 'run.num_env_steps = 1000000'],
        root_dir=str(tmp_path / 'run'), port=free_port(), bind_all_interfaces=True,
        shards=shards)


def wait_until(condition, what, cluster, timeout_s=WAIT_S):
    """Polls `condition()` until truthy; fails with every role's log tail if it never is."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    tails = '\n'.join(f'--- {name}\n{cluster.tail(name, 8)}' for name in cluster.procs)
    raise AssertionError(f'timed out after {timeout_s} s waiting for {what}\n{tails}')


def start_training(cluster, steps=40):
    """Starts the replay server, the learner and one collector; waits for `steps` gradient
    steps (the pushed weights' train step)."""
    cluster.start('replay')
    cluster.start('learn')
    cluster.start('collect', 0)
    wait_until(lambda: (pushed_step(cluster.address) or 0) >= steps,
               f'the learner to take {steps} gradient steps', cluster)


def counters_at(address):
    """The replay table's counters at one server, or None while it does not answer."""
    from experiment.distributed import common

    try:
        return common.replay_counters(reverb.Client(address).server_info(2))
    except (RuntimeError, reverb.errors.ReverbError):
        return None


def pushed_step(address):
    """The train step of the weights in the variables table (None: none, or server away)."""
    try:
        pulled = tables.WeightStore(address, timeout_s=2).pull()
    except (RuntimeError, reverb.errors.ReverbError):
        return None
    return None if pulled is None else pulled[1]


@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
    """Replay server, learner and two collectors (no evaluator), all killed afterwards."""
    os.chdir(ROOT)
    root = str(tmp_path_factory.mktemp('distributed') / 'run')
    made = Cluster(gin_files=GIN_FILES,
                   gin_bindings=FAST + ['run.num_env_steps = 1000000'],
                   root_dir=root, port=free_port(), bind_all_interfaces=True)
    try:
        made.start('replay')
        yield made
    finally:
        for name in list(made.procs):
            if made.alive(name):
                made.kill(name)
