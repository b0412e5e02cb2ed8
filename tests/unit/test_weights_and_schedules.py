"""Importance-sampling weights and the linear schedule, against values worked out by hand."""

import numpy as np
import pytest
import tensorflow as tf

from buffers.base import importance_weights
from core.schedules import linear_schedule


def test_importance_weights_follow_the_per_formula_normalised_to_max_one():
    probabilities = tf.constant([0.1, 0.2, 0.4, 0.3])
    # w_i = (N P(i)) ** -beta / max_j w_j: the rarest draw gets weight 1, N cancels.
    np.testing.assert_allclose(importance_weights(probabilities, 1.0).numpy(),
                               [1.0, 0.5, 0.25, 1 / 3], rtol=1e-6)
    np.testing.assert_allclose(importance_weights(probabilities, 0.5).numpy(),
                               [1.0, 0.5 ** 0.5, 0.25 ** 0.5, (1 / 3) ** 0.5], rtol=1e-6)
    # beta = 0 (no correction) and uniform draws both give weights of exactly 1.
    np.testing.assert_array_equal(importance_weights(probabilities, 0.0).numpy(), np.ones(4))
    np.testing.assert_array_equal(importance_weights(tf.fill([5], 0.01), 1.0).numpy(),
                                  np.ones(5))


@pytest.mark.parametrize('count, expected', [(0, 1.0), (25, 0.75), (50, 0.5), (100, 0.0),
                                             (400, 0.0)])
def test_linear_schedule_moves_from_start_to_end_then_stays(count, expected):
    counter = tf.Variable(0, dtype=tf.int64)
    value = linear_schedule(counter, 1.0, 0.0, 100)
    counter.assign(count)
    assert float(value()) == pytest.approx(expected)


def test_linear_schedule_reads_its_counter_inside_a_compiled_function():
    counter = tf.Variable(0, dtype=tf.int64)
    value = tf.function(linear_schedule(counter, 0.4, 1.0, 10))
    assert float(value()) == pytest.approx(0.4)
    counter.assign(5)
    assert float(value()) == pytest.approx(0.7)  # the same trace sees the new count
