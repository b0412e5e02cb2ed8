"""CQL-SAC's conservative term really is conservative, and its alpha behaves as configured."""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.environments import tf_py_environment
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from agents import cql_sac
from envs.suite import make_env

BATCH, STEPS = 32, 60


@pytest.fixture(scope='module')
def pendulum():
    env = tf_py_environment.TFPyEnvironment(make_env('Pendulum-v1', num_envs=1, seed=0))
    yield env
    env.close()


def _agent(env, **options):
    # Keras' unseeded initializers draw from Python's `random` too: seeding all three makes
    # the runs in `trained` start alike, so they differ by the conservative term alone.
    tf.keras.utils.set_random_seed(3)
    return cql_sac.make_agent(env.time_step_spec(), env.action_spec(),
                              tf.Variable(0, dtype=tf.int64), actor_fc_layer_params=(16,),
                              critic_joint_fc_layer_params=(16,), num_cql_samples=4, seed=3,
                              **options)


def _dataset_batch(agent):
    """[BATCH, 2] mid-episode windows whose actions all sit near +1.5 (a narrow dataset)."""
    tf.random.set_seed(1)
    experience = tensor_spec.sample_spec_nest(agent.collect_data_spec, outer_dims=(BATCH, 2))
    mid = tf.fill([BATCH, 2], ts.StepType.MID)
    action = 1.5 + 0.05 * tf.random.normal([BATCH, 2, 1])
    return experience._replace(step_type=mid, next_step_type=mid, action=action,
                               reward=tf.zeros([BATCH, 2]), discount=tf.ones([BATCH, 2]))


def _q_gap(agent, experience):
    """Mean Q(s, a_dataset) minus mean Q(s, a) over actions spread across [-2, 2]."""
    observation = experience.observation[:, 0]
    q_data, _ = agent._critic_network_1((observation, experience.action[:, 0]))
    others = [agent._critic_network_1((observation, tf.fill([BATCH, 1], value)))[0]
              for value in (-2.0, -1.0, 0.0)]
    return float(tf.reduce_mean(q_data) - tf.reduce_mean(tf.stack(others)))


@pytest.fixture(scope='module')
def trained(pendulum):
    """{cql_alpha: (agent, the batch, last loss info)} after STEPS steps on one narrow batch,
    for alpha 0 (SAC's critic alone) and 5; shared: tracing a CQL-SAC step is the slow part."""
    runs = {}
    for cql_alpha in (0.0, 5.0):
        # A fast critic (3e-3): in 60 steps the term moves the gap by ~2; without it (same
        # seeds, same batch) the two gaps are equal.
        agent = _agent(pendulum, cql_alpha=cql_alpha, critic_learning_rate=3e-3)
        experience = _dataset_batch(agent)
        train = tf.function(agent.train)  # as the loop runs it (eager steps are ~10x slower)
        for _ in range(STEPS):
            loss_info = train(experience)
        assert np.isfinite(float(loss_info.loss))
        runs[cql_alpha] = agent, experience, loss_info
    return runs


def test_the_conservative_term_raises_dataset_actions_above_the_others(trained):
    plain_gap = _q_gap(*trained[0.0][:2])
    conservative_gap = _q_gap(*trained[5.0][:2])
    # Same seeds, same batch: only the CQL term differs, and it pushes Q down on sampled
    # (policy and uniform) actions and up on the dataset's.
    assert conservative_gap > plain_gap + 0.5, (plain_gap, conservative_gap)
    assert float(trained[5.0][2].extra.cql_loss) != 0.0


def test_cql_alpha_stays_fixed_without_lagrange_and_is_learned_with_it(pendulum, trained):
    fixed = trained[5.0][0]
    assert float(fixed.summary_scalars()['train/cql_alpha']) == pytest.approx(5.0)
    learned = _agent(pendulum, cql_alpha=2.0, use_lagrange_cql_alpha=True, cql_tau=-100.0,
                     cql_alpha_learning_rate=0.1)
    experience = _dataset_batch(learned)
    train = tf.function(learned.train)
    for _ in range(5):
        train(experience)
    # The action gap is far above tau = -100, so the multiplier grows to enforce it.
    assert float(learned.summary_scalars()['train/cql_alpha']) > 2.0


def test_zero_weighted_windows_leave_the_sac_part_of_the_loss(trained):
    """The loop zeroes boundary windows' weights: the critic's TD loss must ignore them."""
    agent, experience, _ = trained[0.0]
    huge = experience._replace(reward=tf.fill([BATCH, 2], 1e4))
    weights = tf.constant([1.0] * (BATCH // 2) + [0.0] * (BATCH // 2))
    mixed = tf.nest.map_structure(
        lambda calm, wild: tf.concat([calm[:BATCH // 2], wild[BATCH // 2:]], 0),
        experience, huge)
    loss = float(agent.train(mixed, weights=weights).extra.critic_loss)
    assert loss < 1e3, loss  # a 1e4 reward leaking in would give a loss of ~1e8
