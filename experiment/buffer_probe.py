"""Replay health metrics that the compiled hot loop cannot report itself.

Inside the fused, XLA-compiled train chunk there is no per-sample clock and
no Python, so once per summary interval a probe draws a few batches through
the backend's own `sample` (the learner's path, outside XLA) and measures
sampling latency, the age of what is sampled, how diverse recent samples
are, and the importance weights the learner would apply. Probe draws use the
backend's RNG and count as samples, like any other.
"""

import time

import numpy as np
import tensorflow as tf

from buffers.base import importance_weights


class BufferProbe:
    """Samples `num_batches` batches and summarises them."""

    def __init__(self, backend, *, batch_size, num_steps, importance_beta, num_batches=8):
        self._backend = backend
        self._num_batches = num_batches
        self._importance_beta = importance_beta
        self._sample = tf.function(lambda: backend.sample(batch_size, num_steps)[1])

    def __call__(self):
        """Returns {metric name: float} for the `buffer/` summaries."""
        latencies, keys, probabilities = [], [], []
        for _ in range(self._num_batches):
            start = time.perf_counter()
            info = self._sample()
            keys.append(info.keys.numpy())
            latencies.append(time.perf_counter() - start)
            probabilities.append(info.probabilities)
        keys = np.concatenate(keys)
        weights = [importance_weights(p, self._importance_beta()).numpy() for p in probabilities]
        return {
            'sample_latency_p50_ms': 1e3 * float(np.percentile(latencies, 50)),
            'sample_latency_p99_ms': 1e3 * float(np.percentile(latencies, 99)),
            'sampled_age_mean': float(np.mean(self._backend.ages(keys))),
            'sample_diversity': len(np.unique(keys)) / len(keys),
            'importance_weight_mean': float(np.mean(np.concatenate(weights))),
        }


class RateTracker:
    """Turns cumulative counters into per-second rates between summaries."""

    def __init__(self):
        self._last = None

    def __call__(self, counters):
        now = time.perf_counter()
        rates = {}
        if self._last is not None:
            then, previous = self._last
            elapsed = max(now - then, 1e-9)
            rates = {f'{name}_per_sec': (value - previous.get(name, 0.0)) / elapsed
                     for name, value in counters.items()}
        self._last = (now, dict(counters))
        return rates
