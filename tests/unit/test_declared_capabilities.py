"""Capabilities are declared, not probed: a lint over the replay, agent and experiment code.

Backends declare `capabilities = Capabilities(...)` (buffers/base.py) and agents
implement `AgentSurface` (agents/surface.py); the experiment decides from those.
A `getattr`/`hasattr` with a default, or a method-identity check such as
`type(self).add is UniformReplay.add`, is how the SAC priority bug hid (the loop
fed priorities only if the loss info happened to have a `td_error`), so none may
come back. The few `getattr`s that remain read something else, each named here
with its reason.
"""

import os
import re

import pytest

from buffers.base import Capabilities
from buffers.episodic import EpisodicReplay
from buffers.frames import FrameStackedReplay
from buffers.prioritized import PrioritizedReplay
from buffers.reverb_replay import ReverbPrioritizedReplay, ReverbUniformReplay
from buffers.uniform import UniformReplay

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKED = ('agents', 'buffers', 'experiment', 'rlds_io')
PROBE = re.compile(r'\b(getattr|hasattr)\(|type\([^)]*\)\.\w+ is (not )?\w+\.\w+')

# (file, the probing expression): why it is no capability probe on a backend or agent.
ALLOWED = {
    ('buffers/episodic.py', 'getattr(nest, name, None)'): 'a field of a data nest',
    ('experiment/evaluation.py', "hasattr(env, 'step_copies')"): 'an eval env, not replay',
    ('experiment/evaluation.py', "getattr(act, 'takes_rows', False)"): 'an eval actor',
    ('experiment/run_session.py', "getattr(error, 'message', '')"): 'an exception message',
    ('experiment/staged_agent.py', 'getattr(self.agent, name)'): 'delegation to the agent',
    ('experiment/staged_agent.py', "getattr(make_agent, '__name__', repr(make_agent))"):
        'a factory name for an error message',
    ('experiment/staged_agent.py', "getattr(t, 'freeze_after_warmup', False)"):
        'a preprocessing transform option',
    ('experiment/staged_agent.py', "getattr(transform, 'include_pixels', False)"):
        'a preprocessing transform option',
}


def _probes():
    found = []
    for package in CHECKED:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in sorted(files):
                if not name.endswith('.py'):
                    continue
                path = os.path.join(folder, name)
                relative = os.path.relpath(path, ROOT)
                for number, line in enumerate(open(path), 1):
                    if PROBE.search(line) and not line.strip().startswith('def __getattr__'):
                        if not any(relative == file and expression in line
                                   for file, expression in ALLOWED):
                            found.append(f'{relative}:{number}: {line.strip()}')
    return found


def test_no_backend_or_agent_is_probed_for_a_capability():
    assert _probes() == [], ('declare it in buffers.base.Capabilities or '
                             'agents.surface.AgentSurface instead')


@pytest.mark.parametrize('backend_class, expected', [
    (UniformReplay, Capabilities(xla=True, concurrent_writes=True, bulk_steps=True)),
    (PrioritizedReplay, Capabilities(xla=True, priorities=True)),
    (EpisodicReplay, Capabilities(xla=True, episode_windows=True)),
    (ReverbUniformReplay, Capabilities(own_checkpoints=True, server=True)),
    (ReverbPrioritizedReplay, Capabilities(own_checkpoints=True, server=True, priorities=True)),
])
def test_every_backend_declares_its_capabilities(backend_class, expected):
    assert backend_class.capabilities == expected


def test_instances_and_wrappers_narrow_what_their_class_declares():
    import tensorflow as tf
    from tf_agents.trajectories import trajectory

    spec = trajectory.Trajectory(
        step_type=tf.TensorSpec([], tf.int32), observation=tf.TensorSpec([4, 4, 4], tf.uint8),
        action=tf.TensorSpec([], tf.int64), policy_info=(),
        next_step_type=tf.TensorSpec([], tf.int32), reward=tf.TensorSpec([], tf.float32),
        discount=tf.TensorSpec([], tf.float32))
    two_copies = UniformReplay(spec, capacity=16, num_envs=2, batch_size=2)
    assert not two_copies.capabilities.bulk_steps  # add_steps fills one copy's ring
    big_rows = spec._replace(observation=tf.TensorSpec([84, 84], tf.uint8))
    assert not UniformReplay(big_rows, capacity=16, batch_size=2).capabilities.xla
    stacked = FrameStackedReplay(PrioritizedReplay, spec, num_frames=4, capacity=32, batch_size=2)
    assert stacked.capabilities == Capabilities(priorities=True)  # no XLA, no bulk import


def test_an_agent_without_the_surface_is_refused_in_one_line():
    from tf_agents.agents.dqn import dqn_agent

    from core.errors import UserError
    from experiment import staged_agent

    def make_plain_agent(time_step_spec, action_spec, train_step):
        return dqn_agent.DqnAgent.__new__(dqn_agent.DqnAgent)  # a bare TF-Agents agent

    with pytest.raises(UserError, match='make_plain_agent returned a DqnAgent, which does not '
                                        'implement agents.surface.AgentSurface'):
        staged_agent.build_agent(make_plain_agent, [], None, None, None, num_envs=1,
                                 collects=True)
