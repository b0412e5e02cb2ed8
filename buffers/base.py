"""The one replay-buffer contract every backend implements.

The training loop, the checkpointing code and the summaries talk to replay
only through `ReplayBackend`, so a backend is switched by a single Gin binding
and nothing else changes. Capacity always counts transitions (env steps summed
over all batched env copies), whatever the backend stores underneath.
"""

import dataclasses
import math
from typing import Any, ClassVar, Mapping, NamedTuple, Protocol, runtime_checkable

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


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a backend supports, declared by its class; every default is "no".

    The experiment decides from these, never by probing a backend for methods or
    attributes. A backend class declares `capabilities = Capabilities(...)`; an
    instance may narrow it (`capabilities` is then an instance attribute, e.g.
    XLA only for small rows), and wrappers derive theirs from what they wrap.

    Attributes:
      xla: `add` and `sample` compile with XLA (the loop jit-compiles its chunks).
      concurrent_writes: `allow_concurrent_writes(steps)` readies it for a collector
        thread that writes while the learner samples (run.overlap_collection).
      episode_windows: sampled windows never cross an episode start.
      own_checkpoints: it writes its own checkpoint files, so it needs a
        `checkpoint_dir=` that outlives the process (Reverb's table checkpoints).
      bulk_steps: `add_steps([T, ...])` writes T steps of its one env copy at once
        (a dataset import in chunks rather than one `add` per step).
      priorities: `update_priorities` changes what is sampled (prioritized replay);
        the learner then feeds every agent's per-window priorities back.
      server: it keeps its data in a Reverb server, which other processes can reach
        (the only kind a distributed run can use).
      sequences: it samples stored sequences for recurrent agents: each env step stored
        once, sequences cut from the steps at sampling time, the policy state at each
        sequence's start kept with it (buffers/sequence.py); it needs the agent's
        `sequence_period`.
    """

    xla: bool = False
    concurrent_writes: bool = False
    episode_windows: bool = False
    own_checkpoints: bool = False
    bulk_steps: bool = False
    priorities: bool = False
    server: bool = False
    sequences: bool = False

    def narrowed(self, **conditions):
        """Keeps each named capability only where its condition holds (never turns one on):
        for an instance that cannot do all its class can."""
        declared = dataclasses.asdict(self)
        return dataclasses.replace(self, **{name: declared[name] and bool(condition)
                                            for name, condition in conditions.items()})


@runtime_checkable
class ReplayBackend(Protocol):
    """One replay buffer: a write side for actors and a read side for the learner."""

    capabilities: ClassVar[Capabilities]

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
    if not backend.capabilities.concurrent_writes:
        raise UserError(f"{type(backend).__name__} cannot be written while it samples "
                        "(run.overlap_collection): use UniformReplay, or turn "
                        "run.overlap_collection off.")
    backend.allow_concurrent_writes(steps)


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
