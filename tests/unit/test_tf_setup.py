"""core/tf_setup.py: the seed reaches every initializer a run uses, and AutoGraph leaves
TF-Agents' code as it is."""

import numpy as np
import tensorflow as tf
from tensorflow.python.autograph.core import config as autograph_config
from tensorflow.python.autograph.impl import conversion
from tf_agents.agents.dqn import dqn_agent
from tf_agents.replay_buffers import rlds_to_reverb
from tf_agents.trajectories import trajectory

from agents import nstep
from core.tf_setup import TF_AGENTS_RULES, configure_tf, leave_tf_agents_unconverted


def _critic_like_kernel():
    configure_tf(0, 1)
    # SAC's critics name their initializer by string, which Keras 2.15 draws from its own
    # generator: tf.random.set_seed alone left it unseeded (same-seed SAC runs differed).
    layer = tf.keras.layers.Dense(4, kernel_initializer='glorot_uniform')
    layer.build([None, 3])
    return layer.kernel.numpy()


def test_the_same_seed_gives_the_same_keras_initial_weights():
    np.testing.assert_array_equal(_critic_like_kernel(), _critic_like_kernel())


def test_autograph_converts_our_code_but_not_tf_agents():
    leave_tf_agents_unconverted()
    leave_tf_agents_unconverted()
    rules = autograph_config.CONVERSION_RULES
    assert all(rules.count(rule) == 1 for rule in TF_AGENTS_RULES)  # idempotent
    # What a converted function calls is left alone when AutoGraph allow-lists it.
    assert conversion.is_allowlisted(trajectory.from_transition)
    assert conversion.is_allowlisted(dqn_agent.DqnAgent.train)
    # TF-Agents' RLDS conversion branches on tensors in Python: it stays converted.
    assert not conversion.is_allowlisted(rlds_to_reverb.convert_rlds_to_trajectories)
    assert not conversion.is_allowlisted(nstep.stop_windows_at_episode_end)
