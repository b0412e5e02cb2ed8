"""Tests for the Gymnasium adapter and the batched env factory."""

import gymnasium
import numpy as np
import pytest
import tensorflow as tf
from gymnasium import spaces
from tf_agents.environments import batched_py_environment, parallel_py_environment
from tf_agents.specs import array_spec
from tf_agents.trajectories import time_step as ts

from core.errors import UserError
from envs import suite
from envs.batched import BatchedGymnasiumEnvironment
from envs.gymnasium_env import GymnasiumEnvironment, space_to_spec

_FLOAT32_MAX = np.finfo(np.float32).max


class _NestedEnv(gymnasium.Env):
    """A tiny env whose spaces cover every supported kind and nesting."""

    observation_space = spaces.Dict({
        'pos': spaces.Box(-1.0, 1.0, (2,), np.float64),
        'free': spaces.Box(-np.inf, np.inf, (1,), np.float64),
        'parts': spaces.Tuple((spaces.Discrete(3, start=1),
                               spaces.MultiBinary(4))),
        'grid': spaces.MultiDiscrete([2, 3], start=[1, -1]),
    })
    action_space = spaces.Tuple((spaces.Discrete(2),
                                 spaces.Box(-1.0, 1.0, (2,), np.float64)))

    def __init__(self):
        self.actions = []
        self.closed = False

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._observation(), {}

    def step(self, action):
        self.actions.append(action)
        return self._observation(), 1, len(self.actions) >= 2, False, {}

    def render(self):
        return 'rendered'

    def close(self):
        self.closed = True

    @staticmethod
    def _observation():
        # Python ints and float64 arrays, as real envs often return.
        return {'pos': np.array([0.5, -0.5]), 'free': np.array([1e6]),
                'parts': (2, np.array([1, 0, 1, 0], np.int8)),
                'grid': np.array([1, 0])}


def _run_episodes(env, action, num_episodes):
    """Returns all observations of the next episodes under a fixed action."""
    observations = [env.reset().observation]
    finished = 0
    while finished < num_episodes:
        step = env.step(action)
        observations.append(step.observation)
        finished += int(step.is_last())
    return np.stack(observations)


def _cartpole(seed=None):
    return GymnasiumEnvironment(gymnasium.make('CartPole-v1'), seed=seed)


def test_cartpole_specs():
    env = _cartpole()
    obs_spec, action_spec = env.observation_spec(), env.action_spec()
    assert (obs_spec.shape, obs_spec.dtype) == ((4,), np.float32)
    assert (action_spec.shape, action_spec.dtype) == ((), np.int64)
    assert (action_spec.minimum, action_spec.maximum) == (0, 1)
    step_spec = env.time_step_spec()
    assert step_spec.reward == array_spec.ArraySpec((), np.float32, 'reward')
    assert step_spec.discount.dtype == np.float32


def test_pendulum_box_action_spec():
    spec = GymnasiumEnvironment(gymnasium.make('Pendulum-v1')).action_spec()
    assert (spec.shape, spec.dtype) == ((1,), np.float32)
    np.testing.assert_array_equal(spec.minimum, [-2.0])
    np.testing.assert_array_equal(spec.maximum, [2.0])


def test_nested_space_specs():
    spec = space_to_spec(_NestedEnv.observation_space, 'obs')
    assert set(spec) == {'pos', 'free', 'parts', 'grid'}
    assert spec['pos'].dtype == np.float32
    np.testing.assert_array_equal(spec['pos'].maximum, [1.0, 1.0])
    # Infinite bounds survive as float32's extremes.
    assert spec['free'].maximum == _FLOAT32_MAX
    discrete, binary = spec['parts']
    assert (discrete.shape, discrete.dtype) == ((), np.int64)
    assert (discrete.minimum, discrete.maximum) == (1, 3)
    assert (binary.shape, binary.dtype) == ((4,), np.int8)
    assert (binary.minimum, binary.maximum) == (0, 1)
    assert (spec['grid'].shape, spec['grid'].dtype) == ((2,), np.int64)
    np.testing.assert_array_equal(spec['grid'].minimum, [1, -1])
    np.testing.assert_array_equal(spec['grid'].maximum, [2, 1])


def test_float64_kept_when_not_narrowing():
    spec = space_to_spec(spaces.Box(-1.0, 1.0, (2,), np.float64), 'obs',
                         float32=False)
    assert spec.dtype == np.float64


def test_unsupported_space_names_its_type():
    with pytest.raises(UserError, match='Text'):
        space_to_spec(spaces.Dict({'name': spaces.Text(5)}), 'obs')


def test_nested_observations_cast_and_actions_converted():
    gym_env = _NestedEnv()
    env = GymnasiumEnvironment(gym_env)
    first = env.reset()
    assert array_spec.check_arrays_nest(first.observation,
                                        env.observation_spec())
    step = env.step((np.int64(1), np.array([0.25, -0.25], np.float32)))
    assert array_spec.check_arrays_nest(step.observation,
                                        env.observation_spec())
    assert (step.reward.dtype, step.reward.shape) == (np.float32, ())
    discrete, box = gym_env.actions[0]
    assert type(discrete) is int
    assert box.dtype == np.float64


def test_render_close_and_gym_env_delegate():
    gym_env = _NestedEnv()
    env = GymnasiumEnvironment(gym_env)
    assert env.gym_env is gym_env
    assert env.render() == 'rendered'
    env.close()
    assert gym_env.closed


def test_termination_has_zero_discount_then_auto_resets():
    env = _cartpole(seed=0)
    env.reset()
    step = env.step(np.int64(1))
    while not step.is_last():  # Always pushing right topples the pole.
        step = env.step(np.int64(1))
    assert step.discount == 0.0 and step.discount.dtype == np.float32
    assert env.step(np.int64(1)).step_type == ts.StepType.FIRST


@pytest.mark.parametrize('discount', [1.0, 0.9])
def test_truncation_keeps_discount(discount):
    gym_env = gymnasium.make('Pendulum-v1', max_episode_steps=3)
    env = GymnasiumEnvironment(gym_env, discount=discount, seed=0)
    env.reset()
    steps = [env.step(np.zeros(1, np.float32)) for _ in range(3)]
    assert [s.step_type for s in steps] == [ts.StepType.MID] * 2 + [
        ts.StepType.LAST]
    assert steps[-1].discount == np.float32(discount)


def test_batched_truncation_and_auto_reset():
    env = suite.make_env('Pendulum-v1', num_envs=2, max_episode_steps=5)
    env.reset()
    action = np.zeros((2, 1), np.float32)
    for _ in range(5):
        step = env.step(action)
    np.testing.assert_array_equal(step.step_type, [ts.StepType.LAST] * 2)
    np.testing.assert_array_equal(step.discount, [1.0, 1.0])
    np.testing.assert_array_equal(env.step(action).step_type,
                                  [ts.StepType.FIRST] * 2)


def test_bad_discount_is_user_error():
    with pytest.raises(UserError, match='discount'):
        GymnasiumEnvironment(_NestedEnv(), discount=1.5)


def test_same_seed_same_first_episodes():
    first = _run_episodes(_cartpole(seed=7), np.int64(1), num_episodes=2)
    again = _run_episodes(_cartpole(seed=7), np.int64(1), num_episodes=2)
    other = _run_episodes(_cartpole(seed=8), np.int64(1), num_episodes=2)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_seed_method_restarts_the_sequence():
    env = _cartpole(seed=7)
    first = _run_episodes(env, np.int64(0), num_episodes=1)
    env.seed(7)
    np.testing.assert_array_equal(
        first, _run_episodes(env, np.int64(0), num_episodes=1))


def test_batched_copies_get_consecutive_seeds():
    env = suite.make_env('CartPole-v1', num_envs=3, seed=0)
    assert env.batched and env.batch_size == 3
    observations = env.reset().observation
    assert observations.shape == (3, 4)
    assert len({row.tobytes() for row in observations}) == 3
    shifted = suite.make_env('CartPole-v1', num_envs=1, seed=1)
    assert shifted.batch_size == 1
    np.testing.assert_array_equal(shifted.reset().observation[0],
                                  observations[1])


def test_env_kwargs_and_max_episode_steps_reach_gymnasium():
    env = suite.make_env('Pendulum-v1', max_episode_steps=4,
                         env_kwargs={'g': 5.0})
    gym_env = env.envs[0].gym_env
    assert gym_env.unwrapped.g == 5.0
    assert gym_env.spec.max_episode_steps == 4


def test_parallel_matches_in_process():
    in_process = suite.make_env('CartPole-v1', num_envs=2, seed=3)
    parallel = suite.make_env('CartPole-v1', num_envs=2, seed=3,
                              parallel=True)
    try:
        assert isinstance(parallel,
                          parallel_py_environment.ParallelPyEnvironment)
        assert parallel.batch_size == 2
        assert parallel.time_step_spec() == in_process.time_step_spec()
        np.testing.assert_array_equal(parallel.reset().observation,
                                      in_process.reset().observation)
        actions = np.array([0, 1], np.int64)
        for _ in range(3):
            expected, got = in_process.step(actions), parallel.step(actions)
            np.testing.assert_array_equal(got.observation,
                                          expected.observation)
            np.testing.assert_array_equal(got.reward, expected.reward)
    finally:
        parallel.close()


def test_parallel_reports_bad_id_in_caller():
    with pytest.raises(UserError, match='Unknown environment id'):
        suite.make_env('CartPol-v1', num_envs=2, parallel=True)


def test_unknown_id_is_one_line_with_suggestion():
    with pytest.raises(UserError) as raised:
        suite.make_env.__wrapped__('CartPol-v1')
    message = str(raised.value)
    assert '\n' not in message
    assert "'CartPol-v1'" in message and 'CartPole-v1' in message
    # Through Gin, which appends "In call to configurable ..." lines to
    # anything raised in a configurable, our message stays the first line.
    with pytest.raises(UserError) as raised:
        suite.make_env('CartPol-v1')
    assert str(raised.value).splitlines()[0] == message


def test_deprecated_id_suggests_current_version():
    with pytest.raises(UserError, match='deprecated.*Pendulum-v1'):
        suite.make_env.__wrapped__('Pendulum-v0')


@pytest.mark.parametrize('num_envs', [0, -1, 1.5])
def test_bad_num_envs_is_user_error(num_envs):
    with pytest.raises(UserError, match='num_envs'):
        suite.make_env.__wrapped__(num_envs=num_envs)


def _assert_same_time_steps(got, expected):
    tf.nest.map_structure(np.testing.assert_array_equal, got, expected)


def test_fast_batched_env_matches_tf_agents_batching():
    """Our BatchedGymnasiumEnvironment = TF-Agents' BatchedPyEnvironment, step for step."""
    def copies():
        return [GymnasiumEnvironment(gymnasium.make('CartPole-v1', max_episode_steps=9),
                                     seed=5 + i) for i in range(3)]

    ours = BatchedGymnasiumEnvironment(copies())
    reference = batched_py_environment.BatchedPyEnvironment(copies(), multithreading=False)
    assert ours.time_step_spec() == reference.time_step_spec()
    _assert_same_time_steps(ours.reset(), reference.reset())
    rng = np.random.default_rng(0)
    step_types = set()
    for _ in range(60):  # long enough for terminations, truncations and auto-resets
        action = rng.integers(0, 2, size=3).astype(np.int64)
        got, expected = ours.step(action), reference.step(action)
        _assert_same_time_steps(got, expected)
        step_types.update(got.step_type.tolist())
    assert step_types == {0, 1, 2}


def test_fast_batched_env_handles_nested_spaces():
    ours = BatchedGymnasiumEnvironment(
        [GymnasiumEnvironment(_NestedEnv(), seed=i) for i in range(2)])
    reference = batched_py_environment.BatchedPyEnvironment(
        [GymnasiumEnvironment(_NestedEnv(), seed=i) for i in range(2)], multithreading=False)
    _assert_same_time_steps(ours.reset(), reference.reset())
    action = (np.array([0, 1], np.int64), np.zeros((2, 2), np.float32))
    for _ in range(4):
        _assert_same_time_steps(ours.step(action), reference.step(action))


@pytest.mark.parametrize('env_id, discrete', [('LunarLander-v3', True),
                                              ('LunarLanderContinuous-v3', False)])
def test_box2d_environments_build_and_step(env_id, discrete):
    """Gymnasium's Box2D classics are in the lock file and run through make_env."""
    env = suite.make_env(env_id, num_envs=2, seed=0)
    try:
        spec = env.action_spec()
        assert (spec.dtype.kind == 'i') == discrete
        time_step = env.reset()
        assert time_step.observation.shape == (2, 8)
        for _ in range(5):
            if discrete:
                action = np.zeros(2, spec.dtype)
            else:
                action = np.zeros((2, *spec.shape), spec.dtype)
            time_step = env.step(action)
        assert np.all(np.isfinite(time_step.reward))
    finally:
        env.close()


def test_hidden_observations_make_a_partially_observed_task_from_a_module_id():
    """`module:EnvId` ids (as gymnasium.make takes them) and hidden entries, with clear errors."""
    env = suite.make_env('gymnasium.envs.classic_control:Pendulum-v1', num_envs=2,
                         hidden_observations=(2,), seed=3)
    assert env.observation_spec().shape == (2,)
    observation = env.reset().observation
    np.testing.assert_allclose(np.square(observation).sum(axis=1), 1.0, rtol=1e-5)  # cos, sin
    cartpole = suite.make_env('CartPole-v1', hidden_observations=(1, 3))
    assert cartpole.observation_spec().shape == (2,)
    with pytest.raises(UserError, match="module 'no_such_module'"):
        suite.make_env('no_such_module:Thing-v0')
    with pytest.raises(UserError, match='does not fit'):
        suite.make_env('CartPole-v1', hidden_observations=(0, 1, 2, 3))
    with pytest.raises(UserError, match='does not fit'):
        suite.make_env('CartPole-v1', hidden_observations=(7,))
