"""What the experiment layer reads from an agent beyond TF-Agents' `TFAgent`.

Every mode (single process, offline, the distributed learner, collectors and
evaluator) trains and observes an agent through this one surface, so nothing
attaches attributes to agents after construction or asks whether an agent
has one. DQN, SAC and CQL-SAC implement it (agents/dqn.py, sac.py, cql_sac.py);
so does the preprocessing stage (`experiment.staged_agent.StagedAgent`), which
wraps any of them.

Why priorities are the agent's job: only the agent knows which of its losses
measures how surprising a sample was (DQN's TD error; SAC's two critics'),
and a prioritized backend must be fed by every agent, not only by those whose
loss info happens to carry a `td_error` field.
"""

from typing import Any, Callable, List, Mapping


class AgentSurface:
    """The agent's side of the training contract; defaults are those of a bare agent.

    Mixed in before the TF-Agents agent class, so `checkpoint_items` and the
    observers below describe the agent alone; the preprocessing stage overrides
    them to add its statistics.
    """

    # Whether `sample_priorities` gives per-sample priorities (a prioritized backend
    # is refused for an agent that does not).
    gives_priorities = False
    # Recurrent agents: steps between stored sequence starts (buffers/sequence.py), which
    # the replay assembly passes to a sequence backend; None for feed-forward agents.
    sequence_period = None

    def summary_scalars(self) -> Mapping[str, Any]:
        """{TensorBoard tag: current value} of the agent's own knobs (epsilon, alpha)."""
        return {}

    def batch_diagnostics(self, experience) -> Mapping[str, Any]:
        """{name: scalar tensor} measured on a sampled batch (graph code)."""
        raise NotImplementedError(f"{type(self).__name__} defines no batch diagnostics")

    def sample_priorities(self, loss_info):
        """Float [B] priorities, one per sampled window, from one `train` call's loss info.

        What a prioritized backend stores for the windows just trained on (it
        applies its own `alpha` and epsilon). Graph code.
        """
        raise NotImplementedError(f"{type(self).__name__} gives no per-sample priorities")

    def checkpoint_items(self) -> Mapping[str, Any]:
        """What a training checkpoint saves of the agent."""
        return {'agent': self}

    def collection_observers(self) -> List[Callable]:
        """Extra observers a collecting process feeds every step (none for a bare agent)."""
        return []

    def chunk_observers(self) -> List[Callable]:
        """Callables run once after each collect chunk (none for a bare agent)."""
        return []

    def end_warmup(self) -> None:
        """Called once the initial random collection is over."""

    def stage_summaries(self, kind=None) -> Mapping[str, Any]:
        """{tag: (kind, tensor)} of preprocessing statistics ({} without a stage)."""
        del kind
        return {}
