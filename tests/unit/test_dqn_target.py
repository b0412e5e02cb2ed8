"""DqnAgent's TD target takes one target-network pass and equals TF-Agents' two-pass target."""

import numpy as np
import tensorflow as tf
from tf_agents.agents.dqn import dqn_agent
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from agents import dqn

FRAMES = tensor_spec.TensorSpec([12, 12, 2], tf.uint8, name='observation')
ACTIONS = tensor_spec.BoundedTensorSpec([], tf.int64, minimum=0, maximum=3, name='action')


def _next_time_steps(batch=16):
    frames = np.random.default_rng(3).integers(0, 256, (batch, 12, 12, 2))
    return ts.transition(tf.constant(frames, tf.uint8), reward=tf.zeros([batch]))


def test_plain_dqn_target_is_one_pass_and_matches_tf_agents():
    for dueling in (False, True):
        agent = dqn.make_agent(ts.time_step_spec(FRAMES), ACTIONS,
                               tf.Variable(0, dtype=tf.int64), conv_layer_params=((4, 3, 2),),
                               fc_layer_params=(16,), double_dqn=False, dueling=dueling)
        assert isinstance(agent, dqn.DqnAgent)
        next_time_steps = _next_time_steps()
        ours = agent._compute_next_q_values(next_time_steps, ())
        theirs = dqn_agent.DqnAgent._compute_next_q_values(agent, next_time_steps, ())
        assert ours.shape == (16,)
        np.testing.assert_allclose(ours, theirs, rtol=1e-6)
        # Counting the target network's calls: one pass, where TF-Agents makes two.
        calls = []
        target = agent._target_q_network
        network_cls = type(target)
        original_call = network_cls.__call__

        def counting_call(network, *args, **kwargs):
            if network is target:
                calls.append(network)
            return original_call(network, *args, **kwargs)

        network_cls.__call__ = counting_call
        try:
            agent._compute_next_q_values(next_time_steps, ())
            one_pass = len(calls)
            calls.clear()
            dqn_agent.DqnAgent._compute_next_q_values(agent, next_time_steps, ())
            two_passes = len(calls)
        finally:
            del network_cls.__call__
        assert (one_pass, two_passes) == (1, 2)
