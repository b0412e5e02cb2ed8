"""The evaluation report's intervals against distributions whose answer is known."""

import numpy as np
import pytest

from experiment import eval_report


def test_the_bootstrap_interval_covers_the_true_mean_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    mean, std, n, trials = 10.0, 2.0, 50, 300
    covered, widths = 0, []
    for trial in range(trials):
        low, high = eval_report.bootstrap_interval(rng.normal(mean, std, n), resamples=2_000,
                                                   seed=trial)
        covered += low <= mean <= high
        widths.append(high - low)
    # Coverage of a 95% interval over 300 trials: 0.95 ± 3 standard errors (0.0126).
    assert 0.91 <= covered / trials <= 0.99, covered / trials
    # The normal-theory width 2 * 1.96 * sigma / sqrt(n) = 1.109; the percentile bootstrap
    # is a little narrower at n = 50 (it uses the plug-in std, divisor n).
    assert np.median(widths) == pytest.approx(2 * 1.96 * std / np.sqrt(n), rel=0.08)


def test_a_constant_sample_has_a_point_interval_and_the_same_data_the_same_interval():
    assert eval_report.bootstrap_interval([500.0] * 100) == (500.0, 500.0)
    values = np.random.default_rng(1).exponential(3.0, 40)
    assert eval_report.bootstrap_interval(values) == eval_report.bootstrap_interval(values)


def test_pairing_removes_the_start_states_share_of_the_spread():
    rng = np.random.default_rng(2)
    start_state = rng.normal(0.0, 50.0, 100)  # what both policies face on the same episodes
    a = start_state + 5.0 + rng.normal(0.0, 1.0, 100)
    b = start_state + rng.normal(0.0, 1.0, 100)
    paired = eval_report.paired_difference(a, b)
    low, high = paired['ci95']
    assert 4.0 < low < 5.0 < high < 6.0 and paired['a_better'] > 90
    unpaired_low, unpaired_high = eval_report.bootstrap_interval(a)
    assert unpaired_high - unpaired_low > 10 * (high - low)
    assert 'a is better' in eval_report.difference_line('a', 'b', paired)
    tiny = eval_report.paired_difference([1e-5] * 10, [0.0] * 10)  # prints as +0.0
    assert 'no clear difference' in eval_report.difference_line('a', 'b', tiny)


def test_summary_fields_and_line():
    summary = eval_report.summarize([1.0, 2.0, 3.0, 4.0], [10, 20, 30, 40], seed=7)
    assert summary['mean'] == 2.5 and summary['episodes'] == 4 and summary['seed'] == 7
    assert summary['min'] == 1.0 and summary['max'] == 4.0 and summary['mean_length'] == 25
    assert summary['ci95'][0] < 2.5 < summary['ci95'][1]
    assert eval_report.summary_line('final', summary).startswith('final: 2.5 ± 1.1 (95% CI ')
