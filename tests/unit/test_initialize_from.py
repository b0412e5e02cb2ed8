"""`run.initialize_from`: the source run's weights and optimizer moments, this run's settings."""

import os

import numpy as np
import pytest
import tensorflow as tf

from core.errors import UserError
from experiment import online


class _Agent:
    """What `_initialize_agent` reads of an agent: its checkpointed objects."""

    def __init__(self, learning_rate):
        self.module = tf.Module()
        self.module.weights = tf.Variable([1.0, -2.0])
        self.module.optimizer = tf.keras.optimizers.legacy.Adam(learning_rate)

    def checkpoint_items(self):
        return {'agent': self.module}

    def step(self):
        self.module.optimizer.apply_gradients([(tf.constant([0.5, 0.25]),
                                                self.module.weights)])


class _Session:
    def __init__(self):
        self.said = []

    def say(self, text):
        self.said.append(text)


def _source_run(tmp_path, learning_rate):
    source = _Agent(learning_rate)
    for _ in range(3):
        source.step()
    tf.train.Checkpoint(**source.checkpoint_items()).save(
        os.path.join(tmp_path, 'checkpoints', 'ckpt'))
    return source


def test_the_weights_and_moments_come_from_the_source_and_the_learning_rate_from_this_run(
        tmp_path):
    source = _source_run(tmp_path, learning_rate=1e-3)
    agent = _Agent(learning_rate=5e-2)
    online._initialize_agent(agent, str(tmp_path), _Session())
    np.testing.assert_array_equal(agent.module.weights.numpy(), source.module.weights.numpy())
    assert float(agent.module.optimizer.learning_rate.numpy()) == pytest.approx(5e-2)
    agent.step()  # creates the slots: the pending restore fills them with the source's moments
    source.step()
    assert float(agent.module.optimizer.learning_rate.numpy()) == pytest.approx(5e-2)
    assert int(agent.module.optimizer.iterations.numpy()) == 4
    for name in ('m', 'v'):
        np.testing.assert_allclose(
            agent.module.optimizer.get_slot(agent.module.weights, name).numpy(),
            source.module.optimizer.get_slot(source.module.weights, name).numpy(), rtol=1e-6)


def test_a_run_without_checkpoints_is_refused_in_one_line(tmp_path):
    with pytest.raises(UserError, match='holds no checkpoint'):
        online._initialize_agent(_Agent(1e-3), str(tmp_path), _Session())
