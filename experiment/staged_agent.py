"""An agent seen through the run's preprocessing stage (preprocessing/stage.py).

Every mode (online, offline, the distributed roles) builds its agent with
`build_agent`, and uses what it returns exactly as a TF-Agents agent: its
`policy` and `collect_policy` take raw observations, its `collect_data_spec`
is what replay stores (raw observations), and `train` transforms each sampled
batch (normalisation with the current statistics, reward scaling,
augmentation) before the agent's own `train`. Without `run.preprocessing`
the agent is returned as it is (nothing added to any graph).

What the agents' targets see: DQN's n-step target and SAC's one-step target
are computed by the agent from the transformed batch, so they use normalised
observations (also for the bootstrap state s_{t+n}) and scaled rewards; all
rewards of one batch share one scale, so an n-step sum of scaled rewards is
the scaled n-step sum.
"""

import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from agents.surface import AgentSurface
from core.errors import UserError
from preprocessing import stage
from preprocessing.transforms import FeatureFunction, RewardScaling


class StagedAgent(AgentSurface):
    """`agent` behind `preprocessor`; attributes it does not change are the agent's.

    The stage is an ordinary `AgentSurface`: it adds its statistics to the checkpoint,
    its observers to collection and its summaries, and forwards the rest to the agent.
    """

    def __init__(self, agent, preprocessor, raw_time_step_spec, *, learns_statistics):
        self.agent = agent
        self.preprocessor = preprocessor
        self._learns_statistics = learns_statistics
        self.policy = stage.PreprocessedPolicy(agent.policy, preprocessor, raw_time_step_spec)
        self.collect_policy = stage.PreprocessedPolicy(
            agent.collect_policy, preprocessor, raw_time_step_spec)
        self.collect_data_spec = preprocessor.replay_data_spec(agent.collect_data_spec)

    def train(self, experience, weights=None):
        if self._learns_statistics:
            valid = experience.step_type[:, 0] != ts.StepType.LAST
            self.preprocessor.observe_sampled(experience, valid)
        return self.agent.train(self.preprocessor.experience(experience), weights=weights)

    def batch_diagnostics(self, experience):
        return self.agent.batch_diagnostics(self.preprocessor.experience(experience))

    @property
    def gives_priorities(self):
        return self.agent.gives_priorities

    @property
    def sequence_period(self):
        return self.agent.sequence_period

    def summary_scalars(self):
        return self.agent.summary_scalars()

    def sample_priorities(self, loss_info):
        return self.agent.sample_priorities(loss_info)

    def checkpoint_items(self):
        return {'agent': self.agent, 'preprocess': self.preprocessor}

    def collection_observers(self):
        return [self.preprocessor.observe]

    def chunk_observers(self):
        return [self.preprocessor.end_chunk]

    def end_warmup(self):
        self.preprocessor.freeze()

    def stage_summaries(self, kind=None):
        return {tag: value for tag, value in self.preprocessor.summaries().items()
                if kind is None or value[0] == kind}

    def __getattr__(self, name):
        # Delegation of the TF-Agents attributes the stage leaves alone (specs, variables,
        # train_sequence_length), not a capability probe.
        return getattr(self.agent, name)


def build_agent(make_agent, transforms, time_step_spec, action_spec, train_step, *, num_envs,
                collects, frame_stack=1):
    """The agent for `make_agent`, behind the stage `transforms` describe (if any).

    Args:
      make_agent: the configured agent factory.
      transforms: `run.preprocessing` (or `train_offline.preprocessing`).
      time_step_spec, action_spec: the environment's (raw) specs.
      train_step: the gradient-step counter.
      num_envs: env copies per batched step (per-copy statistics, e.g. returns).
      collects: True where this process's collection updates the statistics
        (single-process online); False for learners that do not collect (offline,
        distributed), which update observation statistics from sampled batches.
      frame_stack: k > 1 builds the agent for stacks [H, W, k] of the env's frames
        (run.frame_stack); acting and replay stack them (agents/frame_stack.py,
        buffers/frames.py).
    """
    time_step_spec = stacked_time_step_spec(time_step_spec, frame_stack)
    if frame_stack > 1:
        _check_stage_takes_stacks(transforms)
    preprocessor = stage.build(transforms, time_step_spec, num_envs)
    if preprocessor is None:
        return _checked(make_agent(time_step_spec, action_spec, train_step), make_agent)
    if not collects and any(isinstance(t, RewardScaling) for t in preprocessor.transforms):
        raise UserError("preprocess.RewardScaling tracks returns while collecting, which this "
                        "process does not do (offline or distributed learning): remove it and "
                        "scale rewards with the agent's reward_scale_factor instead.")
    if not collects and any(getattr(t, 'freeze_after_warmup', False)
                            for t in preprocessor.transforms):
        raise UserError("preprocess.ObservationNormalization.freeze_after_warmup freezes the "
                        "statistics of an initial random collection, which this process does "
                        "not do (offline or distributed learning): remove it.")
    agent = _checked(make_agent(preprocessor.agent_time_step_spec(time_step_spec), action_spec,
                                train_step), make_agent)
    return StagedAgent(agent, preprocessor, time_step_spec, learns_statistics=not collects)


def _checked(agent, make_agent):
    """The agent, or one line if it lacks the surface every mode trains it through."""
    if not isinstance(agent, AgentSurface):
        name = getattr(make_agent, '__name__', repr(make_agent))
        raise UserError(f"run.make_agent={name} returned a {type(agent).__name__}, which does not "
                        "implement agents.surface.AgentSurface (summary scalars, diagnostics, "
                        "priorities, checkpoint items): bind @dqn.make_agent, @sac.make_agent or "
                        "@cql_sac.make_agent, or subclass AgentSurface in your agent.")
    return agent


def _check_stage_takes_stacks(transforms):
    """Refuses transforms that learn from collected observations: with frame stacks the
    collect loop sees single frames, not the stacks those statistics would describe."""
    for transform in transforms:
        if isinstance(transform, FeatureFunction) or getattr(transform, 'include_pixels', False):
            raise UserError(f"{type(transform).__name__} learns from observations as collected, "
                            "which are single frames with run.frame_stack > 1, not the stacks the "
                            "agent sees: remove it (frames are scaled to [0, 1] by the network).")


def stacked_time_step_spec(time_step_spec, frame_stack):
    """The time step spec of an agent that sees stacks of `frame_stack` env frames."""
    if frame_stack == 1:
        return time_step_spec
    frame = time_step_spec.observation
    if tf.nest.is_nested(frame) or frame.dtype != tf.uint8 or frame.shape.rank != 2:
        what = ('nested' if tf.nest.is_nested(frame)
                else f'{tf.as_dtype(frame.dtype).name} {list(frame.shape)}')
        raise UserError(f"run.frame_stack={frame_stack} stacks uint8 frames [H, W], but this "
                        f"environment's observations are {what}: use an image environment "
                        "(e.g. ALE/Pong-v5) or run.frame_stack=1.")
    stack = tensor_spec.BoundedTensorSpec([*frame.shape, frame_stack], tf.uint8, 0, 255,
                                          name=frame.name)
    return time_step_spec._replace(observation=stack)
