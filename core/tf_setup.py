"""Process-wide TensorFlow settings every entry point applies first (one place for all roles)."""

import tensorflow as tf
from tensorflow.python.autograph.core import config as autograph_config

# AutoGraph reads its rules in order and the first that matches decides: TF-Agents' replay
# buffers stay converted (their RLDS conversion, `push_rlds_to_reverb`, branches on tensors in
# Python), the rest of TF-Agents is left as it is.
TF_AGENTS_RULES = (autograph_config.Convert('tf_agents.replay_buffers'),
                   autograph_config.DoNotConvert('tf_agents'))


def configure_tf(seed, tf_threads):
    """Sizes TF's thread pools, seeds its global RNG, and keeps AutoGraph out of TF-Agents.

    `tf.keras.utils.set_random_seed`, not only `tf.random.set_seed`: Keras 2.15's initializers
    named by string ('glorot_uniform', as SAC's critics use) draw unseeded from Keras' own
    generator, so SAC and CQL-SAC runs with the same seed started from different critic weights.
    It seeds Python's and NumPy's global RNGs too; nothing here uses those.

    Thread pools can be set only before TF runs its first op; a process that
    already did (tests run several experiments or roles in one interpreter)
    keeps its pools, and only the seed is applied.
    """
    try:
        tf.config.threading.set_intra_op_parallelism_threads(tf_threads)
        tf.config.threading.set_inter_op_parallelism_threads(tf_threads)
    except RuntimeError:
        pass  # TF already initialised in this process: its pools stay as they are.
    tf.keras.utils.set_random_seed(seed)
    leave_tf_agents_unconverted()


def leave_tf_agents_unconverted():
    """Our `tf.function`s call TF-Agents' agents, policies, networks and environments as
    they are, without AutoGraph rewriting them first.

    AutoGraph converts every function a `tf.function` reaches, recursively, unless its
    module is on its do-not-convert list (TensorFlow, Keras and TF-Probability already
    are). TF-Agents' agents, policies, networks and environments are written for graphs
    without AutoGraph: its own `common.function` defaults to `autograph=False`, and its
    `Learner` wraps `agent.train` in `tf.autograph.experimental.do_not_convert`. Only its
    replay buffers' RLDS conversion needs AutoGraph, so they stay converted
    (`TF_AGENTS_RULES`). Converting the rest anyway parsed and rewrote
    thousands of its functions at every process start, about 10 s of a 30 s tiny DQN
    CartPole run (every run, role and test process paid it), and traced the same ops.

    TF 2.15 has no public switch per module, so TF-Agents joins the list AutoGraph
    reads at each call (`tensorflow.python.autograph.core.config.CONVERSION_RULES`, an
    internal module of the pinned TF: tests/unit/test_tf_setup.py fails if it moves, and
    a run traces the same ops either way). Our own code is still converted, and a
    function TF-Agents itself compiles with `autograph=True` (its metrics) still is:
    the list governs only what a converted function calls. Idempotent.
    """
    rules = autograph_config.CONVERSION_RULES
    if rules[:len(TF_AGENTS_RULES)] != TF_AGENTS_RULES:
        autograph_config.CONVERSION_RULES = (*TF_AGENTS_RULES, *rules)
