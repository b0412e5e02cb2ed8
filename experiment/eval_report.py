"""What an evaluation says, with its uncertainty: mean ± std and a 95% bootstrap interval.

A mean over 10 episodes can move by a third between two evaluations of the
same policy (CartPole: 340.9 / 500 / 127.1 over three seeds' final policies),
so every report carries the interval of its mean, and two policies played on
the same seeded episodes are compared by the interval of their paired
difference, which removes the start states' share of the spread.

The intervals are percentile bootstraps of the mean (10,000 resamples, a fixed
seed, so the same returns always give the same interval).
"""

import numpy as np

RESAMPLES = 10_000
CONFIDENCE = 0.95
_CHUNK = 1_000  # resamples drawn at once: bounded memory for long evaluations


def bootstrap_interval(values, *, confidence=CONFIDENCE, resamples=RESAMPLES, seed=0):
    """The percentile bootstrap interval of the mean of `values`: (low, high)."""
    values = np.asarray(values, np.float64)
    if values.size < 2 or np.all(values == values[0]):
        mean = float(values.mean()) if values.size else float('nan')
        return mean, mean
    rng = np.random.default_rng(seed)
    means = []
    for start in range(0, resamples, _CHUNK):
        count = min(_CHUNK, resamples - start)
        means.append(values[rng.integers(0, values.size, (count, values.size))].mean(axis=1))
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(np.concatenate(means), [tail, 1.0 - tail])
    return float(low), float(high)


def summarize(returns, lengths, *, seed):
    """The report of one policy's episodes (JSON-ready)."""
    returns = np.asarray(returns, np.float64)
    lengths = np.asarray(lengths, np.float64)
    return {
        'episodes': int(returns.size),
        'seed': seed,
        'mean': float(returns.mean()),
        'std': float(returns.std()),
        'ci95': list(bootstrap_interval(returns)),
        'median': float(np.median(returns)),
        'min': float(returns.min()),
        'max': float(returns.max()),
        'mean_length': float(lengths.mean()),
        'returns': [float(value) for value in returns],
        'lengths': [int(value) for value in lengths],
    }


def paired_difference(returns_a, returns_b):
    """A minus B on the same seeded episodes: mean, 95% interval, and who won how often."""
    a, b = np.asarray(returns_a, np.float64), np.asarray(returns_b, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired episodes differ in number: {a.size} and {b.size}")
    difference = a - b
    return {'mean': float(difference.mean()), 'ci95': list(bootstrap_interval(difference)),
            'a_better': int(np.sum(difference > 0)), 'b_better': int(np.sum(difference < 0))}


def summary_line(name, summary):
    """One human line: `name: 487.3 ± 20.1 (95% CI 483.0 to 491.1), 100 episodes, length 487`."""
    low, high = summary['ci95']
    return (f"{name}: {summary['mean']:.1f} ± {summary['std']:.1f} (95% CI {low:.1f} to "
            f"{high:.1f}), {summary['episodes']} episodes from seed {summary['seed']}, "
            f"mean length {summary['mean_length']:.0f}")


def difference_line(name_a, name_b, difference):
    low, high = difference['ci95']
    # An interval that holds 0, or that rounds to 0.0 as printed, is no difference to report.
    verdict = ('no clear difference' if low <= 0 <= high or max(abs(low), abs(high)) < 0.05
               else f"{name_a if low > 0 else name_b} is better")
    return (f"{name_a} - {name_b}: {difference['mean']:+.1f} (95% CI {low:+.1f} to "
            f"{high:+.1f}) on the same episodes: {verdict}")
