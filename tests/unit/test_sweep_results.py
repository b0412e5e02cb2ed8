"""Sweep tables and curve aggregation, and the value-type check, on hand-made numbers."""

import csv
import io

import numpy as np
import pytest

from sweeps import curves, results, validate


def config(label, *metrics, num_seeds=2):
    result = results.ConfigResult(label, (('dqn.make_agent.learning_rate', 0.001),),
                                  num_seeds=num_seeds)
    result.runs = [results.SeedRun(seed, m, f'/nowhere/{seed}') for seed, m in enumerate(metrics)]
    return result


def metrics(final, best, steps, wall):
    return {'final_eval_return': final, 'best_eval_return': best, 'steps_to_target': steps,
            'wall_time_s': wall, 'env_steps': 400, 'interrupted': False}


def test_mean_and_std_over_seeds_with_blanks_for_unreached_targets():
    reached = config('lr=a', metrics(10.0, 20.0, 200, 3.0), metrics(30.0, 40.0, 400, 5.0))
    never = config('lr=b', metrics(1.0, 2.0, None, 1.0), num_seeds=2)
    names = {'dqn.make_agent.learning_rate': 'learning_rate'}
    rows = list(csv.DictReader(io.StringIO(results.csv_text([reached, never], names))))
    assert rows[0]['final_eval_return_mean'] == '20.0'
    assert rows[0]['final_eval_return_std'] == '10.0'
    assert rows[0]['steps_to_target_mean'] == '300.0'
    assert rows[0]['steps_to_target_reached'] == '2'
    assert rows[0]['learning_rate'] == '0.001'
    assert rows[1]['steps_to_target_mean'] == '' and rows[1]['steps_to_target_reached'] == '0'
    assert (rows[1]['seeds_done'], rows[1]['seeds_planned']) == ('1', '2')
    table = results.markdown_text([reached, never]).splitlines()
    assert table[2] == ('| lr=a | 2 | 20.00 ± 10.00 | 30.00 ± 10.00 | 300 ± 100 (2/2) '
                        '| 4.0 ± 1.0 |')
    assert table[3] == '| lr=b | 1/2 | 1.00 ± 0.00 | 2.00 ± 0.00 |  | 1.0 ± 0.0 |'


def test_curves_align_seeds_on_steps():
    steps, mean, std, count = curves.aggregate([[(100, 1.0), (200, 3.0)],
                                                [(100, 3.0), (200, 5.0), (300, 9.0)]])
    assert steps.tolist() == [100, 200, 300]
    np.testing.assert_allclose(mean, [2.0, 4.0, 9.0])
    np.testing.assert_allclose(std, [1.0, 1.0, 0.0])
    assert count.tolist() == [2, 2, 1]


@pytest.mark.parametrize('value, default, ok', [
    (0.001, 0.01, True), (1, 0.01, True), ('fast', 0.01, False), (True, 0.01, False),
    (100, 50_000, True), (1.5, 50_000, False), (False, True, True), (1, True, False),
    ([8, 8], (100,), True), (8, (100,), False), ('mse', 'huber', True),
    ('anything', None, True), ('@UniformReplay', 3, True),
])
def test_type_problem(value, default, ok):
    assert (validate.type_problem(value, default) is None) == ok
