"""Every agent feeds a prioritized backend: priorities read back from the backend change.

Before agents declared `sample_priorities`, the loop fed priorities back only when
the loss info happened to carry a `td_error` field, which SAC's and CQL-SAC's did not:
their prioritized runs sampled uniformly, every priority stuck at its insert value.
Here each agent trains a few chunks on a real prioritized backend and the stored
priorities are read back from it.
"""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.environments import tf_py_environment

from agents import cql_sac, dqn, sac
from agents.surface import AgentSurface
from buffers.prioritized import PrioritizedReplay
from buffers.reverb_replay import ReverbPrioritizedReplay
from buffers.sequence import PrioritizedSequenceReplay, SequenceReplay
from buffers.uniform import UniformReplay
from core.errors import UserError
from envs.suite import make_env
from experiment import replay
from experiment.loop import FusedLoop, Training

SMALL = {
    'dqn': (dqn.make_agent, 'CartPole-v1', {'fc_layer_params': (8,)}),
    'sac': (sac.make_agent, 'Pendulum-v1',
            {'actor_fc_layer_params': (8,), 'critic_joint_fc_layer_params': (8,)}),
    'cql_sac': (cql_sac.make_agent, 'Pendulum-v1',
                {'actor_fc_layer_params': (8,), 'critic_joint_fc_layer_params': (8,),
                 'num_cql_samples': 2}),
}


def _trained(name, backend_class):
    """(agent, backend, tf_env) after 32 random steps and 3 chunks of 4 steps and 4 gradient
    steps, on 2 env copies."""
    tf.random.set_seed(0)
    make_agent, env_id, small = SMALL[name]
    tf_env = tf_py_environment.TFPyEnvironment(make_env(env_id, num_envs=2, seed=0))
    agent = make_agent(tf_env.time_step_spec(), tf_env.action_spec(),
                       tf.Variable(0, dtype=tf.int64), **small)
    backend = backend_class(agent.collect_data_spec, capacity=400, num_envs=2, batch_size=16)
    loop = FusedLoop(agent=agent, tf_env=tf_env, backend=backend, observers=[],
                     env_steps=tf.Variable(0, dtype=tf.int64), batch_size=16, num_steps=2,
                     train_steps=4, use_xla=False)
    loop.collect_random(tf.constant(32))
    for _ in range(3):
        loop.iterate(tf.constant(4))
    return agent, backend, tf_env


@pytest.mark.parametrize('name', ['dqn', 'sac', 'cql_sac'])
def test_training_changes_the_stored_priorities(name):
    agent, backend, tf_env = _trained(name, PrioritizedReplay)
    stored = backend.histograms()['priority']
    assert len(stored) == 88  # 44 batched steps of 2 copies
    # Without feedback every row would hold its insert value, 1.0. The agent's priorities,
    # written back after each gradient step, give distinct values (and raise the max
    # priority, which later rows enter at).
    assert len(np.unique(stored)) >= 10, stored
    assert np.all(np.isfinite(stored)) and np.all(stored > 0)
    tf_env.close()


def test_sac_priorities_are_the_larger_critic_error():
    errors = sac.TdErrorRecorder(tf.math.squared_difference)
    targets = tf.constant([1.0, 2.0, 3.0])
    errors(targets, tf.constant([0.0, 2.5, 3.0]))  # critic 1: 1, -0.5, 0
    errors(targets, tf.constant([1.5, 0.0, 2.0]))  # critic 2: -0.5, 2, 1
    np.testing.assert_allclose(errors.priorities().numpy(), [1.0, 2.0, 1.0])


def test_sac_feeds_a_reverb_prioritized_table():
    agent, backend, tf_env = _trained('sac', ReverbPrioritizedReplay)
    try:
        # The last sampled windows' stored priorities: after the first chunk, some were set
        # by the agent (|TD error| + priority_epsilon), not the insert value 1.0.
        sampled = backend.histograms()['sampled_priority']
        assert len(sampled) > 0 and np.any(np.abs(sampled - 1.0) > 1e-6), sampled
    finally:
        backend.close()
        tf_env.close()


class _NoPriorities(AgentSurface):
    gives_priorities = False


def test_a_prioritized_backend_is_refused_for_an_agent_without_priorities():
    with pytest.raises(UserError, match='PrioritizedReplay samples by priority, but '
                                        '_NoPriorities gives no per-sample priorities'):
        replay.check_pairing(_NoPriorities(), PrioritizedReplay)
    replay.check_pairing(_NoPriorities(), UniformReplay)  # uniform needs none


def test_a_distributed_run_maps_backends_by_their_declared_capabilities():
    distributed = replay.Mode.LEARNER
    assert replay.backend_class_for(UniformReplay, distributed).__name__ == \
        'ReverbUniformReplay'
    assert replay.backend_class_for(PrioritizedReplay, distributed) is ReverbPrioritizedReplay
    assert replay.backend_class_for(PrioritizedReplay, replay.Mode.SINGLE) is PrioritizedReplay
    assert replay.backend_class_for(PrioritizedSequenceReplay, distributed).__name__ == \
        'ReverbPrioritizedSequenceReplay'
    assert replay.backend_class_for(SequenceReplay, distributed).__name__ == \
        'ReverbSequenceReplay'
    with pytest.raises(UserError, match='not a replay backend'):
        replay.backend_class_for(len, distributed)


@pytest.mark.parametrize('name', ['dqn', 'sac'])
def test_a_stacked_chunk_feeds_the_priorities_of_all_its_batches(name):
    """The distributed learner's way: batches drawn ahead, priorities written once per chunk."""
    tf.random.set_seed(0)
    make_agent, env_id, small = SMALL[name]
    tf_env = tf_py_environment.TFPyEnvironment(make_env(env_id, num_envs=2, seed=0))
    agent = make_agent(tf_env.time_step_spec(), tf_env.action_spec(),
                       tf.Variable(0, dtype=tf.int64), **small)
    backend = PrioritizedReplay(agent.collect_data_spec, capacity=400, num_envs=2,
                                batch_size=16)
    loop = FusedLoop(agent=agent, tf_env=tf_env, backend=backend, observers=[],
                     env_steps=tf.Variable(0, dtype=tf.int64), batch_size=16, num_steps=2,
                     train_steps=4, use_xla=False)
    loop.collect_random(tf.constant(64))
    assert np.all(backend.histograms()['priority'] == 1.0)  # nothing trained yet
    training = Training(agent=agent, backend=backend, batch_size=16, num_steps=2,
                        train_steps=4, use_xla=False)
    batches = [backend.sample(16, 2) for _ in range(4)]
    windows, info = tf.nest.map_structure(lambda *x: tf.stack(x), *batches)
    assert info.keys.shape == (4, 16)
    diagnostics = training.train_stacked((windows, info))
    assert diagnostics['all_finite'] and int(agent.train_step_counter.numpy()) == 4
    stored = backend.histograms()['priority']
    # Every sampled row left its insert value; rows never sampled kept it.
    keys = np.unique(info.keys.numpy())
    changed = np.flatnonzero(np.abs(stored - 1.0) > 1e-6)
    assert set(keys) <= set(changed) and len(changed) == len(keys), (keys, changed)
    tf_env.close()
