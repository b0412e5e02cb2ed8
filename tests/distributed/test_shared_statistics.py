"""Distributed preprocessing: the learner owns the normalisation statistics and publishes them
with the weights; collectors act with the published ones (real roles, tiny DQN CartPole)."""

import os

import numpy as np
import pytest
import tensorflow as tf

from experiment.distributed import common, tables
from preprocessing.stage import Preprocessor
from preprocessing.transforms import ObservationNormalization
from tests.distributed.conftest import pushed_step, tiny_dqn_cluster, wait_until

pytestmark = [pytest.mark.reverb, pytest.mark.timeout(600)]


def test_the_learner_publishes_statistics_that_collectors_use(tmp_path):
    cluster = tiny_dqn_cluster(tmp_path, 'run.preprocessing = '
                                         '[@preprocess.ObservationNormalization()]')
    try:
        cluster.start('replay')
        learner = cluster.start('learn')
        collector = cluster.start('collect', 0)
        wait_until(lambda: (pushed_step(cluster.address) or 0) >= 80,
                   'the learner to push weights after 80 gradient steps', cluster)
        values, _ = tables.WeightStore(cluster.address, timeout_s=5).pull()
        # The policy's weights, then the stage's variables (in the order of a stage built
        # the same way here).
        stage = Preprocessor([ObservationNormalization()], tf.TensorSpec([4], tf.float32), 1)
        names = [v.name.split(':')[0] for v in stage.variables]
        published = dict(zip(names, values[-len(names):]))
        frozen, count, mean, var = (published[name] for name in ('frozen', 'count', 'mean', 'var'))
        # Every sampled window's first state counts, except boundary windows (a LAST step
        # first), which are masked: at most 1 in 8 here, as a CartPole episode lasts >= 8 steps.
        assert not frozen and count >= 80 * 16 * 7 / 8
        assert mean.shape == var.shape == (4,)
        assert np.all(var > 0) and np.any(np.abs(var - 1.0) > 1e-3)  # CartPole's, not (0, 1)
        np.testing.assert_allclose(published['scale'], 1 / np.sqrt(var + 1e-8), rtol=1e-5)
        # A collector that pulled them (all variables, statistics included) keeps inserting.
        inserted = common.replay_counters(tables.WeightStore(
            cluster.address, timeout_s=5).server_info())['inserted']
        wait_until(lambda: common.replay_counters(tables.WeightStore(
            cluster.address, timeout_s=5).server_info())['inserted'] > inserted + 64,
                   'the collector to insert with the published statistics', cluster)
        assert cluster.alive(collector) and cluster.alive(learner)
        assert 'Traceback' not in open(cluster.log_path(collector)).read()
        # The learner's checkpoint holds them too (a restarted learner continues them). The
        # directory's `checkpoint` file names a checkpoint only once its files are complete (a
        # glob for ckpt-*.index can see an index still being written).
        checkpoints = os.path.join(cluster.root_dir, 'learner', 'checkpoints')
        wait_until(lambda: tf.train.latest_checkpoint(checkpoints), 'a learner checkpoint',
                   cluster)
        path = tf.train.latest_checkpoint(checkpoints)
        names = [name for name, _ in tf.train.list_variables(path)]
        assert any(name.startswith('preprocess/') and 'mean' in name for name in names)
    finally:
        for name in list(cluster.procs):
            if cluster.alive(name):
                cluster.kill(name)
