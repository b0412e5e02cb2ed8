"""The experiment's parameters as data: one Gin-bound, validated dataclass per kind of run.

`RunConfig` is what `run.*` bindings set (online training, and every role of a
distributed run reads the same object); `OfflineConfig` is what
`train_offline.*` bindings set. Both are checked when they are built, before
any environment, network or file exists: a wrong type or an out-of-range value
is one line naming the binding, the value and what is expected.
"""

import dataclasses
import math
import re
from typing import Any, Callable, Optional, Sequence

import gin

from buffers.uniform import UniformReplay
from core.checks import check
from core.errors import UserError


def _required(scope, name, value):
    if value is gin.REQUIRED:
        raise UserError(f"The config binds no {scope}.{name}: include an experiment config "
                        "such as configs/dqn_cartpole.gin.")


@dataclasses.dataclass(frozen=True)
class _TrainingConfig:
    """What every kind of training run has (not bound by itself; see the subclasses).

    Intervals count the run's step axis: env steps online, gradient steps offline.

    Attributes:
      make_agent: agent factory, e.g. `@dqn.make_agent`.
      train_steps_per_iteration: gradient steps per compiled train chunk.
      batch_size: windows per gradient step.
      replay_backend: the backend class, e.g. `@UniformReplay`.
      eval_interval: steps between greedy evaluations (0: only at the end).
      num_eval_episodes: episodes per evaluation, played side by side.
      checkpoint_interval: steps between checkpoints (0: only at the end).
      summary_interval: steps between training summaries (0: none).
      use_xla: jit-compile the train chunk when the backend supports it.
      tf_threads: TF intra/inter-op threads (1 is fastest for small networks).
      export_final_policy: write the greedy policy as a SavedModel at the end.
      verbose: print progress lines.
      on_nonfinite: what a non-finite loss, diagnostic or weight does: 'stop'
        (exit with one line; the last finite checkpoint stays the latest and
        nothing non-finite is saved or exported) or 'warn' (say so once, train on).
      best_policy_episodes: confirmation episodes (one fixed seed) a candidate for
        root_dir/policy_best plays before it may replace the kept one (see
        experiment/best_policy.py); 0 keeps no best policy.
      final_eval_episodes: seeded episodes of the end-of-run report
        (evaluation.json): the final and the best policy on the same episodes,
        mean ± std, 95% bootstrap interval and their paired difference; 0: none.
      video_interval: steps between videos of a greedy episode under
        root_dir/videos/ and in TensorBoard's Images tab; 0: none.
      final_video: record the best (else the final) policy's episode at the end.
      preprocessing: the preprocessing stage's transforms, in order, e.g.
        `[@preprocess.ObservationNormalization(), @preprocess.RewardScaling()]`
        (preprocessing/transforms.py); empty: the agent sees raw data.
      frame_stack: k > 1 makes the agent see the last k frames [H, W, k] of an
        environment of uint8 frames [H, W] (Atari): replay stores each frame once
        and stacks sampled windows (buffers/frames.py), acting keeps a ring per
        env copy (agents/frame_stack.py). 1: observations as the env yields them.
      eval_epsilon: evaluation (periodic, best-policy confirmation, the report,
        videos) takes a random action with this probability (discrete actions only);
        0 is greedy. Atari protocols use 0.001 so a greedy policy cannot stall a game.
      sample_ahead: sample the next batch while the current gradient step runs, so
        a second core (run.tf_threads=2) samples and decodes while the first trains
        (experiment/loop.py `Training`); with prioritized replay a batch is then drawn
        before the previous step's priorities are written back. The distributed learner
        reads batches from a prefetching dataset and does not need it.
    """

    make_agent: Callable = gin.REQUIRED
    train_steps_per_iteration: int = 32
    batch_size: int = 64
    replay_backend: Any = UniformReplay
    eval_interval: int = 5_000
    num_eval_episodes: int = 10
    checkpoint_interval: int = 10_000
    summary_interval: int = 1_000
    use_xla: bool = True
    tf_threads: int = 1
    export_final_policy: bool = True
    verbose: bool = True
    on_nonfinite: str = 'stop'
    best_policy_episodes: int = 20
    final_eval_episodes: int = 100
    video_interval: int = 0
    final_video: bool = True
    preprocessing: Sequence[Any] = ()
    frame_stack: int = 1
    sample_ahead: bool = False
    eval_epsilon: float = 0.0

    def _check_common(self, scope, **more):
        _required(scope, 'make_agent', self.make_agent)
        if self.on_nonfinite not in ('stop', 'warn'):
            raise UserError(f"{scope}.on_nonfinite must be 'stop' or 'warn', got "
                            f"{self.on_nonfinite!r}: fix the binding.")
        checks = {
            'positive': ('train_steps_per_iteration', 'batch_size', 'num_eval_episodes',
                         'tf_threads', 'frame_stack'),
            'non_negative': ('eval_interval', 'checkpoint_interval', 'summary_interval',
                             'best_policy_episodes', 'final_eval_episodes', 'video_interval'),
            'flags': ('use_xla', 'export_final_policy', 'verbose', 'final_video', 'sample_ahead'),
            'numbers': {'eval_epsilon': (0.0, 1.0, 'closed')},
            'callables': ('make_agent', 'replay_backend'),
        }
        for kind, rules in more.items():
            checks[kind] = ({**checks.get(kind, {}), **rules} if isinstance(rules, dict)
                            else checks.get(kind, ()) + tuple(rules))
        check(scope, vars(self), **checks)
        if not isinstance(self.preprocessing, (list, tuple)):
            raise UserError(f"{scope}.preprocessing must be a list of transforms such as "
                            "[@preprocess.ObservationNormalization()], got "
                            f"{self.preprocessing!r}: fix the binding.")


@gin.configurable('run')
@dataclasses.dataclass(frozen=True)
class RunConfig(_TrainingConfig):
    """An online (or distributed) training run; Gin binds each field as `run.<field>`.

    Attributes (besides `_TrainingConfig`'s):
      num_env_steps: total env steps, summed over env copies, initial collection included.
      initial_collect_steps: env steps of uniform-random actions before training.
      collect_steps_per_iteration: env steps (over all copies) per collect chunk; with
        `train_steps_per_iteration` it sets the replay ratio (1:1 is one gradient
        step per env step).
      replay_capacity: transitions kept (over all env copies).
      importance_beta_start: prioritized replay's importance-sampling exponent
        at the start; it rises linearly to 1 (full correction).
      importance_beta_anneal_steps: env steps over which beta reaches 1
        (None: the whole run). Uniform backends get weights of exactly 1.
      target_return: eval return that counts as solved (reported as steps_to_target).
      stop_at_target_return: stop training once target_return is reached.
      policy_snapshot_interval: env steps between snapshots of the greedy policy
        (with their eval return) under root_dir/policies/; 0 = none. They are
        the behaviour policies of 'medium' datasets (make_dataset.py).
      snapshot_collect_policy: snapshots also export the collect (exploring)
        policy, under policies/step_<N>/collect/: the stochastic SAC policy that
        D4RL's 'medium' datasets are played by (make_dataset.behaviour_policy).
      record_dataset: record every collected episode and write them at the end
        as an RLDS dataset in root_dir/dataset (the 'replay' dataset kind).
      logged_dataset: an RLDS dataset directory mixed into every batch
        (offline-to-online); None trains on online experience only.
      logged_fraction: the share of each batch drawn from `logged_dataset`.
      initialize_from: a run directory (e.g. an offline CQL-SAC run) whose
        latest checkpoint's agent weights this run starts from; its initial
        collection then uses that agent's collect policy, not random actions.
      overlap_collection: collect the next chunk on a second thread while the
        current chunk trains (experiment/loop.py `FusedLoop`), so a second core
        (run.tf_threads=2) collects while the first trains. The replay ratio and
        the chunk sizes stay; what changes: a chunk is collected with weights
        that move while it runs (as in distributed collection), and the run is
        no longer reproducible bit for bit (thread timing decides which weights
        act and which steps a batch can draw). Needs UniformReplay (frame
        stacks included); no gain on one core.
    """

    num_env_steps: int = 50_000
    initial_collect_steps: int = 1_000
    collect_steps_per_iteration: int = 32
    replay_capacity: int = 100_000
    importance_beta_start: float = 0.4
    importance_beta_anneal_steps: Optional[int] = None
    target_return: Optional[float] = None
    stop_at_target_return: bool = False
    policy_snapshot_interval: int = 0
    snapshot_collect_policy: bool = False
    record_dataset: bool = False
    logged_dataset: Optional[str] = None
    logged_fraction: float = 0.25
    initialize_from: Optional[str] = None
    overlap_collection: bool = False

    def __post_init__(self):
        self._check_common(
            'run', positive=('num_env_steps', 'collect_steps_per_iteration', 'replay_capacity'),
            non_negative=('initial_collect_steps', 'policy_snapshot_interval'),
            optional_positive=('importance_beta_anneal_steps',),
            numbers={'importance_beta_start': (0.0, 1.0, 'closed'),
                     'logged_fraction': (0.0, 1.0, 'closed')},
            optional_numbers={'target_return': (-math.inf, math.inf, 'closed')},
            flags=('stop_at_target_return', 'record_dataset', 'overlap_collection',
                   'snapshot_collect_policy'))
        if self.snapshot_collect_policy and not self.policy_snapshot_interval:
            raise UserError("run.snapshot_collect_policy=True exports the collect policy with "
                            "each policy snapshot: set run.policy_snapshot_interval too.")
        if self.stop_at_target_return and self.target_return is None:
            raise UserError("run.stop_at_target_return=True needs run.target_return: set the "
                            "return that counts as solved.")
        if self.initial_collect_steps < self.batch_size:
            raise UserError(
                f"run.initial_collect_steps={self.initial_collect_steps} is below "
                f"run.batch_size={self.batch_size}: the first gradient step would sample from "
                "a nearly empty buffer; raise it.")

    @property
    def replay_ratio(self):
        """Gradient steps per env step."""
        return self.train_steps_per_iteration / self.collect_steps_per_iteration

    def check_num_envs(self, num_envs):
        """The checks that need the env: every env copy steps equally."""
        if self.collect_steps_per_iteration % num_envs:
            raise UserError(
                f"run.collect_steps_per_iteration={self.collect_steps_per_iteration} is not a "
                f"multiple of make_env.num_envs={num_envs}: every env copy steps equally, so "
                "pick a multiple.")


@gin.configurable('train_offline')
@dataclasses.dataclass(frozen=True)
class OfflineConfig(_TrainingConfig):
    """Offline training from a dataset; Gin binds each field as `train_offline.<field>`.

    Attributes (besides `_TrainingConfig`'s, whose intervals count gradient steps here):
      dataset_dir: an RLDS dataset directory (make_dataset.py or run.record_dataset).
      num_train_steps: gradient steps in total.
    """

    dataset_dir: str = gin.REQUIRED
    num_train_steps: int = 50_000
    train_steps_per_iteration: int = 500
    batch_size: int = 256
    use_xla: bool = False

    def __post_init__(self):
        _required('train_offline', 'dataset_dir', self.dataset_dir)
        self._check_common('train_offline', positive=('num_train_steps',))


def load(config_class):
    """Builds `config_class` from the parsed Gin config, with Gin's errors as one line."""
    try:
        return config_class()
    except UserError:
        raise
    except (TypeError, ValueError, RuntimeError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        missing = re.match(r"Required bindings for `(\w+)` not provided in config: \[(.*)\]",
                           first)
        if missing:
            names = ', '.join(f"{missing.group(1)}.{name.strip(chr(39))}"
                              for name in missing.group(2).split(', '))
            raise UserError(f"The config binds no {names}: include an experiment config such "
                            "as configs/dqn_cartpole.gin, or bind it.") from None
        raise UserError(f"Invalid {config_class.__name__}: {first}") from None
