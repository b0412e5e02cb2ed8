"""The one replay-buffer contract every backend implements.

The training loop, the checkpointing code and the summaries talk to replay
only through `ReplayBackend`, so a backend is switched by a single Gin binding
and nothing else changes. Capacity always counts transitions (env steps summed
over all batched env copies), whatever the backend stores underneath.
"""

import math
from typing import Any, Mapping, NamedTuple, Protocol, runtime_checkable

import tensorflow as tf

from core.checks import check
from core.errors import UserError


class SampleInfo(NamedTuple):
    """What a backend says about a sampled batch.

    One shape for TF-Agents' `BufferInfo` and Reverb's `SampleInfo`, so that a
    prioritized learner can feed priorities back through `update_priorities`
    whatever the backend.

    Attributes:
      keys: int64 [B], the key of each sampled window's first item.
      probabilities: float32 [B], the probability with which each window was
        drawn (what importance-sampling weights are computed from).
    """

    keys: tf.Tensor
    probabilities: tf.Tensor


@runtime_checkable
class ReplayBackend(Protocol):
    """One replay buffer: a write side for actors and a read side for the learner."""

    supports_xla: bool

    def add(self, trajectory) -> None:
        """Adds one batched step `[N, ...]` (N = env copies); an observer."""

    def sample(self, batch_size: int, num_steps: int):
        """Returns `(Trajectory [B, T, ...], SampleInfo)`; callable in tf.function."""

    def as_dataset(self, batch_size: int, num_steps: int) -> tf.data.Dataset:
        """An endless dataset of `(Trajectory, SampleInfo)` batches."""

    def update_priorities(self, keys, priorities) -> None:
        """Sets priorities of sampled items; a no-op on uniform backends."""

    def metrics(self) -> Mapping[str, float]:
        """Current size, capacity, fill ratio and counters, as Python floats."""

    def histograms(self) -> Mapping[str, Any]:
        """Distributions for TensorBoard histograms, e.g. priorities, episode lengths."""

    def ages(self, keys):
        """Env steps (over all copies) since each sampled key was inserted."""

    def checkpoint_items(self) -> Mapping[str, Any]:
        """The trackables a training checkpoint saves and restores."""

    def close(self) -> None:
        """Releases resources; calling it twice is harmless."""


def allow_concurrent_writes(backend, steps):
    """Readies `backend` for a collector thread that writes while the learner samples
    (run.overlap_collection), or refuses it in one line if it cannot be."""
    allow = getattr(backend, 'allow_concurrent_writes', None)
    if allow is None:
        raise concurrent_writes_refused(backend)
    allow(steps)


def concurrent_writes_refused(backend):
    """The one-line error for a backend that cannot be written while it samples."""
    return UserError(f"{type(backend).__name__} cannot be written while it samples "
                     "(run.overlap_collection): use UniformReplay, or turn "
                     "run.overlap_collection off.")


def check_priority_settings(scope, alpha, priority_epsilon):
    """Refuses prioritization settings that are not finite numbers >= 0 (one line)."""
    check(scope, {'alpha': alpha, 'priority_epsilon': priority_epsilon},
          numbers={'alpha': (0.0, math.inf, 'closed'),
                   'priority_epsilon': (0.0, math.inf, 'closed')})


def validate_capacity(capacity: int, *, batch_size: int, num_envs: int, num_steps: int) -> int:
    """Checks a replay capacity before any memory is allocated.

    Args:
      capacity: transitions to keep, summed over env copies.
      batch_size: windows per sampled batch.
      num_envs: batched env copies writing to the buffer.
      num_steps: window length sampled by the learner.

    Returns:
      The number of rows kept per env copy.

    Raises:
      UserError: when the capacity cannot hold what the learner samples.
    """
    if not isinstance(capacity, int) or capacity <= 0:
        raise UserError(
            f"capacity must be a positive integer number of transitions, got {capacity!r}.")
    if capacity < batch_size:
        raise UserError(
            f"capacity={capacity} is smaller than batch_size={batch_size}: "
            "raise the capacity or lower the batch size.")
    rows_per_env = capacity // num_envs
    if rows_per_env < num_steps:
        raise UserError(
            f"capacity={capacity} split over {num_envs} env copies keeps "
            f"{rows_per_env} steps per copy, fewer than the {num_steps}-step windows "
            f"the agent samples: raise the capacity to at least {num_steps * num_envs}.")
    return rows_per_env


def importance_weights(probabilities, beta):
    """Importance-sampling weights for a sampled batch, normalised to max 1.

    `w_i = (N * P(i)) ** -beta / max_j w_j`; the buffer size N cancels in the
    normalisation, so only the sampling probabilities are needed. Uniform
    backends return equal probabilities, hence weights of exactly 1: the loop
    applies weights unconditionally and stays backend-agnostic.
    """
    smallest = tf.reduce_min(probabilities)
    return tf.pow(probabilities / smallest, -tf.cast(beta, probabilities.dtype))
