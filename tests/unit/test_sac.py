"""SAC's factory: refuses discrete actions, and the loop's boundary weights really mask."""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.environments import tf_py_environment
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from agents import sac
from buffers.base import Capabilities, SampleInfo
from core.errors import UserError
from envs.suite import make_env
from experiment.loop import FusedLoop

BATCH = 8


class _FixedBatch:
    """A replay backend stand-in that serves one fixed batch, to isolate the train step."""

    capabilities = Capabilities()

    def __init__(self, experience):
        self.experience = experience

    def add(self, trajectory):
        del trajectory

    def sample(self, batch_size, num_steps):
        del num_steps
        return self.experience, SampleInfo(keys=tf.range(batch_size, dtype=tf.int64),
                                           probabilities=tf.ones([batch_size]))

    def update_priorities(self, keys, priorities):
        del keys, priorities


@pytest.fixture(scope='module')
def pendulum():
    env = tf_py_environment.TFPyEnvironment(make_env('Pendulum-v1', num_envs=1, seed=0))
    yield env
    env.close()


def _make_agent(env):
    return sac.make_agent(env.time_step_spec(), env.action_spec(), tf.Variable(0, dtype=tf.int64),
                          actor_fc_layer_params=(8, 8), critic_joint_fc_layer_params=(8, 8))


def _batch(agent, first_step_type):
    """Random [BATCH, 2] windows whose first frame has `first_step_type`.

    Rewards are huge so that any leak of a masked transition into a loss would
    show up as a large update.
    """
    tf.random.set_seed(1)
    experience = tensor_spec.sample_spec_nest(agent.collect_data_spec, outer_dims=(BATCH, 2))
    step_type = tf.stack([tf.fill([BATCH], first_step_type),
                          tf.fill([BATCH], ts.StepType.FIRST)], axis=1)
    return experience._replace(
        step_type=step_type,
        next_step_type=tf.fill([BATCH, 2], ts.StepType.MID),
        reward=tf.fill([BATCH, 2], 1e3),
        discount=tf.ones([BATCH, 2]))


def _train_once_through_the_loop(env, agent, experience):
    loop = FusedLoop(agent=agent, tf_env=env, backend=_FixedBatch(experience), observers=[],
                     env_steps=tf.Variable(0, dtype=tf.int64), batch_size=BATCH, num_steps=2,
                     train_steps=1, use_xla=False)
    return loop.train()


def _values(variables):
    return [v.numpy().copy() for v in variables]


def _groups(agent):
    """The variables each SAC loss trains, and the target critics."""
    # pylint: disable=protected-access
    return {
        'critic': agent._critic_network_1.variables + agent._critic_network_2.variables,
        'actor': agent._actor_network.variables,
        'alpha': [agent._log_alpha],
        'target': (agent._target_critic_network_1.variables
                   + agent._target_critic_network_2.variables),
    }


def test_discrete_actions_are_refused_with_a_pointer_to_dqn():
    observation = tf.TensorSpec([4], tf.float32)
    action = tensor_spec.BoundedTensorSpec([], tf.int64, 0, 1)
    with pytest.raises(UserError, match='use DQN'):
        sac.make_agent(ts.time_step_spec(observation), action, tf.Variable(0, dtype=tf.int64))


def test_target_entropy_defaults_to_minus_action_dimension(pendulum):
    agent = _make_agent(pendulum)
    assert agent._target_entropy == -1.0  # pylint: disable=protected-access
    assert float(agent.summary_scalars()['train/alpha']) == pytest.approx(1.0)


def test_windows_starting_on_last_steps_change_nothing(pendulum):
    """Critic, actor and alpha losses all honour the loop's zero weights.

    A fresh Adam turns a zero gradient into a zero update, so unchanged
    variables prove a zero gradient in every one of SAC's three losses.
    """
    agent = _make_agent(pendulum)
    before = {name: _values(variables) for name, variables in _groups(agent).items()}
    diagnostics = _train_once_through_the_loop(pendulum, agent,
                                               _batch(agent, ts.StepType.LAST))
    assert float(diagnostics['loss']) == 0.0
    for name, variables in _groups(agent).items():
        # Soft target updates mix identical values, exact up to rounding.
        for old, new in zip(before[name], _values(variables)):
            np.testing.assert_allclose(new, old, rtol=1e-6, atol=1e-7, err_msg=name)


def test_the_same_windows_starting_mid_episode_do_train(pendulum):
    """The control: without the LAST first frames, every loss moves its variables."""
    agent = _make_agent(pendulum)
    before = {name: _values(variables) for name, variables in _groups(agent).items()}
    diagnostics = _train_once_through_the_loop(pendulum, agent, _batch(agent, ts.StepType.MID))
    assert float(diagnostics['loss']) != 0.0
    assert np.isfinite(float(diagnostics['mean_q']))
    for name in ('critic', 'actor', 'alpha'):
        change = max(np.abs(new - old).max()
                     for old, new in zip(before[name], _values(_groups(agent)[name])))
        assert change > 1e-5, name
