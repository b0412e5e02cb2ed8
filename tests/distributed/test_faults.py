"""Fault injection on a live localhost cluster: SIGKILL a role, restart it, training goes on.

The tests share one cluster (starting TF in four processes is the slow part)
and run in file order: the collector fault, the learner fault, then the
replay-server fault. Every wait is bounded (`wait_until`), and the fixture
kills every process it started.
"""

import glob
import os
import re
import signal
import time

import pytest

from tests.distributed.conftest import counters_at, pushed_step, wait_until

pytestmark = [pytest.mark.reverb, pytest.mark.timeout(600)]


def _latest_learner_checkpoint(cluster):
    steps = [int(m.group(1)) for path in glob.glob(
        os.path.join(cluster.root_dir, 'learner', 'checkpoints', 'ckpt-*.index'))
        if (m := re.search(r'ckpt-(\d+)\.index$', path))]
    return max(steps, default=None)


def _log(cluster, name):
    with open(cluster.log_path(name)) as log:
        return log.read()


@pytest.fixture(scope='module')
def training(cluster):
    """The cluster with a learner and two collectors, once the learner is training."""
    cluster.start('learn')
    cluster.start('collect', 0)
    cluster.start('collect', 1)
    wait_until(lambda: (pushed_step(cluster.address) or 0) >= 8, 'the learner to train',
               cluster)
    return cluster


def test_killed_collector_the_learner_keeps_training_and_the_restart_writes_again(training):
    cluster = training
    cluster.kill('collector_0')
    before = pushed_step(cluster.address)
    # The other collector alone feeds the learner.
    wait_until(lambda: (pushed_step(cluster.address) or 0) >= before + 16,
               'the learner to train on with one collector', cluster)
    assert cluster.alive('learner') and cluster.alive('collector_1')
    inserted = counters_at(cluster.address)['inserted']
    cluster.restart('collector_0')
    wait_until(lambda: 'writing to the replay server' in
               _log(cluster, 'collector_0').split('starting collector_0')[-1]
               and (counters_at(cluster.address) or {}).get('inserted', 0) > inserted + 32,
               'the restarted collector to write', cluster)
    assert cluster.alive('collector_0') and cluster.alive('learner')


def test_killed_learner_resumes_from_its_checkpoint_and_pushes_again(training):
    cluster = training
    checkpointed = wait_until(lambda: _latest_learner_checkpoint(cluster),
                              'a learner checkpoint', cluster)
    pushed = pushed_step(cluster.address)
    cluster.kill('learner')
    assert cluster.alive('collector_0') and cluster.alive('collector_1')
    cluster.restart('learner')
    log = wait_until(lambda: re.search(r'resumed from .*ckpt-(\d+) at train step ([\d,]+)',
                                       _log(cluster, 'learner')),
                     'the learner to resume', cluster)
    resumed_at = int(log.group(2).replace(',', ''))
    assert resumed_at >= checkpointed
    # It trains on from there and pushes again: the table's weights pass the old ones.
    wait_until(lambda: (pushed_step(cluster.address) or 0) > max(pushed, resumed_at) + 8,
               'the resumed learner to push newer weights', cluster)
    # ...and checkpoints past where it resumed (every 20 train steps here).
    wait_until(lambda: (_latest_learner_checkpoint(cluster) or 0) > resumed_at,
               'the resumed learner to write a newer checkpoint', cluster)
    assert all(cluster.alive(name) for name in ('collector_0', 'collector_1', 'learner'))


def test_killed_replay_server_restores_its_checkpoint_and_everyone_reconnects(training):
    cluster = training
    before = counters_at(cluster.address)
    step_before = pushed_step(cluster.address)
    checkpoints = os.path.join(cluster.root_dir, 'replay', 'reverb')
    old = set(glob.glob(os.path.join(checkpoints, '*', 'DONE')))
    # A checkpoint finished after `before` was read holds at least what `before` counted.
    wait_until(lambda: set(glob.glob(os.path.join(checkpoints, '*', 'DONE'))) - old,
               'a replay checkpoint newer than the counts', cluster)
    peers = ('collector_0', 'collector_1', 'learner')
    log_sizes = {name: len(_log(cluster, name)) for name in peers}
    cluster.kill('replay', signal.SIGKILL)
    time.sleep(5)  # peers must ride out the outage, not crash
    assert all(cluster.alive(name) for name in peers)
    cluster.restart('replay')
    restored = wait_until(lambda: counters_at(cluster.address), 'the server to come back',
                          cluster)
    assert restored['inserted'] >= before['inserted']
    assert restored['size'] >= before['size']
    assert 'restored' in _log(cluster, 'replay').split('starting replay')[-1]
    wait_until(lambda: (counters_at(cluster.address) or {}).get('inserted', 0)
               > restored['inserted'] + 32, 'collectors to write to the restarted server',
               cluster)
    wait_until(lambda: (pushed_step(cluster.address) or 0) > step_before + 8,
               'the learner to train and push to the restarted server', cluster)
    assert all(cluster.alive(name) for name in peers)
    # Whoever waited said on whom (the watchdog or a retry names the replay server).
    said = [name for name in peers if 'the replay server at' in
            _log(cluster, name)[log_sizes[name]:]]
    assert said, 'no peer logged whom it waited on during the outage'
