"""The one replay assembly: every mode gets its backend (and wrappers) from here.

A single-process run, offline training, a distributed collector, learner and
replay server all call `build_replay` with the run's config, the agent and
their `Mode`; nothing else constructs a backend or maps one backend class to
another. What differs between modes is only where the data lives:

- SINGLE: run.replay_backend in this process, frame-stacked for pixels, mixed with
  a logged dataset for offline-to-online;
- OFFLINE: run.replay_backend holding the dataset, frame-stacked for pixels;
- COLLECTOR and LEARNER (read only): the backend's Reverb counterpart at the server,
  frame-stacked for pixels (the collector encodes frames, the learner stacks them);
- SERVER: the same Reverb backend hosting the server; `Replay.hosted` is the table
  (single frames for pixels, as collectors write them).

When the learner holds the replay (`distributed.settings.learner_holds_replay`), the
server, collectors and learner share a `ReverbWindowQueue` instead, and the learner keeps
what it takes from it in a `WindowStore` (`held_store`) that it samples as one process
samples its backend.

Decisions are taken from the backend class's declared `capabilities`
(buffers/base.py) and the agent's `AgentSurface`, never by probing.
"""

import dataclasses
import enum
import os
from typing import Any, Optional

from buffers.base import Capabilities
from buffers.frames import FrameStackedReplay
from buffers.mixing import MixedReplay
from buffers.prioritized import PrioritizedReplay
from buffers.reverb_replay import (
    ReverbPrioritizedReplay,
    ReverbPrioritizedSequenceReplay,
    ReverbSequenceReplay,
    ReverbUniformReplay,
    ReverbWindowQueue,
)
from buffers.uniform import UniformReplay
from buffers.windows import WindowStore
from core.errors import UserError
from rlds_io.files import Dataset
from rlds_io.importing import load_dataset_into_backend

# The replay table's name in a distributed run's Reverb server.
REPLAY_TABLE = 'distributed_replay'


class Mode(enum.Enum):
    """Where a process stands towards replay."""

    SINGLE = 'single process'
    OFFLINE = 'offline'
    COLLECTOR = 'collector'
    LEARNER = 'learner'
    SERVER = 'replay server'

    @property
    def distributed(self):
        return self in (Mode.COLLECTOR, Mode.LEARNER, Mode.SERVER)


@dataclasses.dataclass(frozen=True)
class ServerLink:
    """How a distributed role reaches or hosts the Reverb server.

    Attributes:
      timeout_s: bound on every wait for the server (distributed.settings.timeout_s).
      address: 'host:port' of the server (collector, learner).
      flush_every: items a collector's writer buffers before it sends them.
      server: the `buffers.reverb.server.ReplayServer` the replay role owns (its port,
        rate limiter, weights table, checkpoints), started here with the replay table.
      samples_in_flight: windows the learner keeps requested ahead per sampling stream
        (None: Reverb's backend default, twice the batch). A whole learner call's worth
        keeps the pipeline full across a round trip of several ms to another machine.
      flush_timeout_s: how long a collector's write may wait for the server (None: the
        writer's default, 60 s); a sharded run's collectors wait less, so that they move
        to another shard soon when theirs dies.
      queue_length: the learner holds the replay: the server's table is a window queue
        this long, which the learner drains (None: the server holds the replay).
    """

    timeout_s: float
    address: Optional[str] = None
    flush_every: int = 256
    server: Any = None
    samples_in_flight: Optional[int] = None
    flush_timeout_s: Optional[float] = None
    queue_length: Optional[int] = None


@dataclasses.dataclass
class Replay:
    """What `build_replay` returns.

    Attributes:
      backend: the `ReplayBackend` the mode writes to and samples from.
      num_steps: the window length the agent trains on.
      hosted: for `Mode.SERVER`, the Reverb backend whose server this process hosts
        (frames stored single, as collectors write them); None otherwise.
    """

    backend: Any
    num_steps: int
    hosted: Any = None


def num_steps_of(agent):
    """The window length an agent trains on: its sequence length, or one transition."""
    return agent.train_sequence_length or 2


def capabilities_of(backend_class):
    """The declared capabilities of `run.replay_backend`, or one line if it declares none."""
    try:
        declared = backend_class.capabilities  # every backend class declares them
    except AttributeError:
        declared = None
    if not isinstance(declared, Capabilities):
        raise UserError(f"run.replay_backend={backend_class!r} is not a replay backend (it "
                        "declares no buffers.base.Capabilities): bind one of @UniformReplay, "
                        "@PrioritizedReplay, @EpisodicReplay, @ReverbUniformReplay, "
                        "@ReverbPrioritizedReplay, @SequenceReplay, "
                        "@PrioritizedSequenceReplay.")
    return declared


def backend_class_for(backend_class, mode):
    """The class a mode builds: `run.replay_backend`, or in a distributed run the Reverb
    backend with the same sampling (a distributed run replays through a Reverb server)."""
    capabilities = capabilities_of(backend_class)
    if not mode.distributed or capabilities.server:
        return backend_class
    if capabilities.episode_windows:
        raise UserError(f"{backend_class.__name__} has no Reverb counterpart (its windows stay "
                        "inside episodes), so a distributed run cannot use it: bind "
                        "run.replay_backend to @UniformReplay or @PrioritizedReplay.")
    if capabilities.sequences:
        return (ReverbPrioritizedSequenceReplay if capabilities.priorities
                else ReverbSequenceReplay)
    return ReverbPrioritizedReplay if capabilities.priorities else ReverbUniformReplay


def check_pairing(agent, backend_class):
    """Refuses, in one line, an agent that cannot feed a prioritized backend."""
    capabilities = capabilities_of(backend_class)
    if capabilities.priorities and not agent.gives_priorities:
        raise UserError(f"{backend_class.__name__} samples by priority, but "
                        f"{type(agent).__name__} gives no per-sample priorities: use a uniform "
                        "backend (e.g. @UniformReplay) with this agent.")
    if agent.sequence_period and not capabilities.sequences:
        raise UserError(f"{type(agent).__name__} is recurrent and trains on stored sequences "
                        f"with their start states, which {backend_class.__name__} does not "
                        "keep: bind run.replay_backend to @SequenceReplay or "
                        "@PrioritizedSequenceReplay.")
    if capabilities.sequences and not agent.sequence_period:
        raise UserError(f"{backend_class.__name__} stores sequences for recurrent agents, but "
                        f"{type(agent).__name__} is not one: bind run.replay_backend to "
                        "@UniformReplay or @PrioritizedReplay.")


def build_replay(mode, params, agent, *, num_envs, seed, root_dir=None, dataset=None,
                 env_specs=None, link=None):
    """The backend (with its wrappers) for `mode`.

    Args:
      mode: a `Mode`.
      params: the run's `RunConfig` (`OfflineConfig` offline): replay_backend, batch_size,
        frame_stack, and (online) replay_capacity, logged_dataset, logged_fraction.
      agent: the agent (its `collect_data_spec`, window length and priorities).
      num_envs: env copies per `add` (1 offline).
      seed: seeds the backend's sampling.
      root_dir: the run directory (single process, offline): where a backend that writes
        its own checkpoints, and memory-mapped frames, go.
      dataset: the `rlds_io.files.Dataset` offline training loads (OFFLINE only).
      env_specs: (time_step_spec, action_spec) of the raw environment, which a logged
        dataset mixed into a single-process run must match.
      link: a `ServerLink` (distributed modes only).

    Returns:
      A `Replay`.

    Raises:
      UserError: for a backend, agent and mode that cannot work together.
    """
    if mode.distributed != (link is not None):
        raise ValueError(f"{mode.value}: a ServerLink is "
                         f"{'needed' if mode.distributed else 'not used'}")
    backend_class = backend_class_for(params.replay_backend, mode)
    check_pairing(agent, backend_class)
    num_steps = num_steps_of(agent)
    if link is not None and link.queue_length:
        return _window_queue(mode, params, agent, num_envs=num_envs, link=link)
    options = dict(frame_stack=params.frame_stack, batch_size=params.batch_size,
                   num_steps=num_steps, seed=seed)
    if agent.sequence_period:
        _check_sequence_mode(mode, params)
        options['period'] = agent.sequence_period
    if params.frame_stack > 1 and root_dir is not None:
        # Only FrameStackedReplay.storage='memmap' writes there (frames larger than RAM).
        options['directory'] = os.path.join(root_dir, 'replay_frames')
    if mode is Mode.OFFLINE:
        backend = load_dataset_into_backend(
            dataset, lambda spec, **sizes: _build(backend_class, spec, **{**options, **sizes}),
            spec=agent.collect_data_spec, batch_size=params.batch_size, num_steps=num_steps,
            seed=seed, verbose=params.verbose)
        return Replay(backend, num_steps)
    options.update(capacity=params.replay_capacity, num_envs=num_envs)
    if mode.distributed:
        options.update(_server_options(mode, link))
    elif capabilities_of(backend_class).own_checkpoints:
        # Reverb writes its table checkpoints itself; they must outlive the process to resume.
        options['checkpoint_dir'] = os.path.join(root_dir, 'checkpoints', 'replay')
    backend = _build(backend_class, agent.collect_data_spec, **options)
    if mode is Mode.SERVER:
        # The server holds what collectors write: single frames when frames are stacked.
        hosted = backend.inner if isinstance(backend, FrameStackedReplay) else backend
        return Replay(backend, num_steps, hosted=hosted)
    if mode is Mode.SINGLE and params.logged_dataset:
        backend = _mixed_with_logged(backend, params, agent, env_specs, num_steps=num_steps,
                                     seed=seed)
    return Replay(backend, num_steps)


def _check_held(params, agent):
    """Refuses, in one line, what a learner-held replay does not keep."""
    why = None
    if params.frame_stack > 1:
        why = ("it keeps whole windows, which for stacked frames would store every frame "
               "eight times")
    elif agent.sequence_period:
        why = "recurrent agents train on sequences with their start states"
    elif capabilities_of(params.replay_backend).episode_windows:
        why = f"{params.replay_backend.__name__}'s windows stay inside episodes"
    if why:
        raise UserError(f"distributed.settings.learner_holds_replay cannot be used here: {why}. "
                        "Set it to False (the replay server then holds the replay).")


def _window_queue(mode, params, agent, *, num_envs, link):
    """The window queue between collectors and a learner that holds the replay."""
    _check_held(params, agent)
    queue = _build(ReverbWindowQueue, agent.collect_data_spec, capacity=link.queue_length,
                   num_envs=num_envs, batch_size=1, num_steps=num_steps_of(agent),
                   **_server_options(mode, link))
    return Replay(queue, num_steps_of(agent), hosted=queue if mode is Mode.SERVER else None)


def held_store(params, agent, *, windows_per_add, seed):
    """The learner's own replay when it holds it: `run.replay_backend`'s sampling (uniform,
    or prioritized where it samples by priority) over whole windows (buffers/windows.py)."""
    _check_held(params, agent)
    capabilities = capabilities_of(params.replay_backend)
    check_pairing(agent, params.replay_backend)
    inner = PrioritizedReplay if capabilities.priorities else UniformReplay
    try:
        return WindowStore(inner, agent.collect_data_spec, capacity=params.replay_capacity,
                           windows_per_add=windows_per_add, batch_size=params.batch_size,
                           num_steps=num_steps_of(agent), seed=seed)
    except UserError as error:
        raise UserError(f"{error} (the learner's replay: capacity = run.replay_capacity, "
                        f"{windows_per_add} windows taken in at a time)") from None


def _check_sequence_mode(mode, params):
    """Refuses, in one line, what sequence replay does not do."""
    if mode is Mode.OFFLINE:
        raise UserError("Recurrent agents do not train offline here: datasets hold no policy "
                        "states. Use a feed-forward agent for offline training.")
    if params.frame_stack > 1:
        raise UserError("A recurrent agent keeps its memory in its state: set run.frame_stack=1 "
                        "(sequence replay does not stack frames).")
    if params.logged_dataset:
        raise UserError("run.logged_dataset cannot feed a recurrent agent: logged datasets hold "
                        "no policy states. Remove the binding.")


def _server_options(mode, link):
    """The Reverb backend's options for a distributed role."""
    if mode is Mode.SERVER:
        return dict(table_name=REPLAY_TABLE, server=link.server)
    options = dict(server_address=link.address, table_name=REPLAY_TABLE,
                   flush_every=link.flush_every,
                   rate_limiter_timeout_ms=int(link.timeout_s * 1000))
    if link.flush_timeout_s is not None:
        options['flush_timeout_ms'] = int(link.flush_timeout_s * 1000)
    if mode is Mode.LEARNER:
        # No writer stream to break when the server goes away; Reverb's own worker count
        # for the learner's stream: with a fixed 2 workers a killed server crashed the
        # learner natively (malloc) in about half the outages.
        options.update(read_only=True, num_workers_per_iterator=-1,
                       max_in_flight_samples_per_worker=link.samples_in_flight)
    return options


def _build(backend_class, data_spec, frame_stack=1, **options):
    """One backend; its errors say which bindings set the values they name.

    With `frame_stack` > 1 the backend stores single frames and samples stacks
    (`FrameStackedReplay`, buffers/frames.py).
    """
    try:
        if frame_stack > 1:
            return FrameStackedReplay(backend_class, data_spec, num_frames=frame_stack,
                                      **options)
        return backend_class(data_spec, **options)
    except UserError as error:
        raise UserError(f"{error} (replay: run.replay_backend={backend_class.__name__}, "
                        "capacity = run.replay_capacity, batch_size = run.batch_size)") from None


def _mixed_with_logged(backend, params, agent, env_specs, *, num_steps, seed):
    """Offline-to-online: every batch mixes `logged_fraction` of the logged dataset in."""
    if params.frame_stack > 1:
        raise UserError("run.logged_dataset with run.frame_stack > 1 is not supported: datasets "
                        "hold observations as the agent sees them, not single frames.")
    dataset = Dataset(params.logged_dataset)
    dataset.check_specs(*env_specs)
    logged = load_dataset_into_backend(
        dataset, UniformReplay, spec=agent.collect_data_spec, batch_size=params.batch_size,
        num_steps=num_steps, seed=seed, verbose=params.verbose)
    return MixedReplay(backend, logged, logged_fraction=params.logged_fraction,
                       batch_size=params.batch_size)
