"""The preprocessing stage: statistics as numpy computes them, exact resume, frozen evaluation,
SavedModel parity on raw observations, and augmentation that never touches stored data."""

import functools

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.environments import tf_py_environment
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory as trajectory_lib

from agents import dqn, sac
from buffers.uniform import UniformReplay
from core.errors import UserError
from core.export import export_policy
from envs.suite import make_env
from experiment import staged_agent
from experiment.evaluation import greedy_actor, play_episodes
from preprocessing.augment import random_shift
from preprocessing.features import squared_features
from preprocessing.running_stats import RunningMeanStd
from preprocessing.stage import Preprocessor
from preprocessing.transforms import (
    FeatureFunction,
    GaussianNoise,
    ObservationNormalization,
    RandomShift,
    RewardScaling,
)

MID, FIRST, LAST = ts.StepType.MID, ts.StepType.FIRST, ts.StepType.LAST


def _trajectory(observation, reward, step_type, next_step_type):
    n = len(reward)
    return trajectory_lib.Trajectory(
        step_type=tf.constant(step_type, tf.int32), observation=tf.constant(observation),
        action=tf.zeros([n], tf.int64), policy_info=(),
        next_step_type=tf.constant(next_step_type, tf.int32),
        reward=tf.constant(reward, tf.float32), discount=tf.ones([n]))


def _state(module):
    return [v.numpy().copy() for v in module.variables]


def test_running_statistics_equal_numpy_over_merged_batches_of_any_size():
    rng = np.random.default_rng(0)
    stats = RunningMeanStd([3])
    seen = []
    # Batches as several env copies deliver them (3 copies per step), plus odd-sized merges.
    for size in [3, 3, 1, 7, 3, 250, 3, 2]:
        batch = rng.normal(loc=[5.0, -2.0, 1e3], scale=[1.0, 0.1, 50.0], size=(size, 3))
        stats.update(batch)
        seen.append(batch)
    everything = np.concatenate(seen)
    np.testing.assert_allclose(stats.mean.numpy(), everything.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(stats.var.numpy(), everything.var(axis=0), rtol=1e-10)
    assert stats.count.numpy() == len(everything)
    # Masked rows are left out entirely.
    batch = rng.normal(size=(6, 3))
    mask = np.array([True, False, True, False, False, True])
    stats.update(batch, mask)
    everything = np.concatenate([everything, batch[mask]])
    np.testing.assert_allclose(stats.var.numpy(), everything.var(axis=0), rtol=1e-10)
    stats.update(batch, np.zeros(6, bool))  # an all-masked batch changes nothing
    np.testing.assert_allclose(stats.mean.numpy(), everything.mean(axis=0), rtol=1e-12)


def test_statistics_gathered_step_by_step_and_folded_in_per_chunk_equal_numpy():
    rng = np.random.default_rng(1)
    stats = RunningMeanStd([1])
    seen = []
    for chunk in range(4):
        for _ in range(32):  # one collect chunk of steps, folded in at its end
            batch = rng.normal(1e4, 1.0, size=(8, 1))
            stats.accumulate(batch)
            seen.append(batch)
        stats.merge_pending()
    everything = np.concatenate(seen)
    np.testing.assert_allclose(stats.mean.numpy(), everything.mean(axis=0), rtol=1e-14)
    np.testing.assert_allclose(stats.var.numpy(), everything.var(axis=0), rtol=1e-6)


def test_reward_scale_is_the_std_of_per_copy_discounted_returns():
    gamma = 0.9
    scaling = RewardScaling(gamma=gamma, clip=100.0)
    scaling.build(tf.TensorSpec([1]), num_envs=2)
    # Two auto-resetting copies; copy 0's episode ends after step 1 (then a LAST->FIRST
    # boundary step, reward 0, which is no transition), copy 1's runs on.
    steps = [  # (step_type, next_step_type, reward) per copy
        ([FIRST, FIRST], [MID, MID], [1.0, 2.0]),
        ([MID, MID], [LAST, MID], [3.0, -1.0]),
        ([LAST, MID], [FIRST, MID], [0.0, 4.0]),
        ([FIRST, MID], [MID, LAST], [5.0, 0.5]),
    ]
    for step_type, next_step_type, reward in steps:
        scaling.observe(None, _trajectory(np.zeros((2, 1), np.float32), reward, step_type,
                                          next_step_type))
    assert float(scaling.scale) == pytest.approx(1.0, abs=1e-7)  # gathered, not yet folded in
    scaling.end_chunk()
    copy0 = [1.0, 0.9 * 1.0 + 3.0, 5.0]            # reset after the episode's last step
    copy1 = [2.0, 0.9 * 2.0 - 1.0]
    copy1 += [0.9 * copy1[-1] + 4.0]
    copy1 += [0.9 * copy1[-1] + 0.5]
    expected_std = np.std(copy0 + copy1)
    np.testing.assert_allclose(float(scaling.scale), np.sqrt(expected_std**2 + 1e-8), rtol=1e-9)
    np.testing.assert_allclose(scaling.reward(tf.constant([2.0])).numpy(),
                               [2.0 / float(scaling.scale)], rtol=1e-6)
    tight = RewardScaling(clip=0.5)
    tight.build(tf.TensorSpec([1]), num_envs=1)
    assert tight.reward(tf.constant([3.0, -3.0])).numpy().tolist() == [0.5, -0.5]


def test_a_new_episode_starts_a_new_return_even_after_a_resume():
    scaling = RewardScaling(gamma=0.9, clip=100.0)
    scaling.build(tf.TensorSpec([1]), num_envs=1)
    scaling.returns.assign([50.0])  # a partial return restored from a checkpoint
    for step_type, reward in [(FIRST, 1.0), (MID, 2.0), (MID, 3.0)]:
        scaling.observe(None, _trajectory(np.zeros((1, 1), np.float32), [reward], [step_type],
                                          [MID]))
    scaling.end_chunk()
    expected = np.std([1.0, 0.9 * 1.0 + 2.0, 0.9 * (0.9 + 2.0) + 3.0])
    np.testing.assert_allclose(float(scaling.scale), np.sqrt(expected**2 + 1e-8), rtol=1e-9)


def _stage(num_envs=2):
    return Preprocessor([ObservationNormalization(clip=5.0), RewardScaling()],
                        tf.TensorSpec([4], tf.float32), num_envs)


def _batches(seed, count, num_envs=2):
    rng = np.random.default_rng(seed)
    for i in range(count):
        yield _trajectory(rng.normal(3.0, 2.0, (num_envs, 4)).astype(np.float32),
                          rng.normal(size=num_envs), [MID] * num_envs,
                          [LAST if i % 5 == 4 else MID] * num_envs)


def test_a_restored_stage_continues_bit_for_bit(tmp_path):
    stage = _stage()
    for i, batch in enumerate(_batches(0, 20)):
        stage.observe(batch)
        if i % 8 == 7:
            stage.end_chunk()
    # Saved mid-chunk: what was gathered but not yet folded in is restored too.
    path = tf.train.Checkpoint(preprocess=stage).save(str(tmp_path / 'ckpt'))
    restored = _stage()
    tf.train.Checkpoint(preprocess=restored).restore(path).assert_consumed()
    assert all(np.array_equal(a, b) for a, b in zip(_state(stage), _state(restored)))
    for batch in _batches(1, 10):
        stage.observe(batch)
        restored.observe(batch)
    stage.end_chunk()
    restored.end_chunk()
    assert all(np.array_equal(a, b) for a, b in zip(_state(stage), _state(restored)))


def test_normalisation_uses_the_current_statistics_and_clips():
    stage = _stage()
    for batch in _batches(0, 50):
        stage.observe(batch)
    stage.end_chunk()
    stats = stage.transforms[0].stats
    raw = tf.constant([[3.0, 3.0, 3.0, 1e6]])
    expected = (raw.numpy() - stats.mean.numpy()) / np.sqrt(stats.var.numpy() + 1e-8)
    expected = np.clip(expected, -5.0, 5.0)
    np.testing.assert_allclose(stage.observation(raw).numpy(), expected, rtol=1e-5, atol=1e-6)
    # Windows [B, T, 4] get the same per-frame transform.
    windows = stage.observation(tf.reshape(tf.tile(raw, [6, 1]), [2, 3, 4])).numpy()
    np.testing.assert_allclose(windows.reshape(6, 4), np.tile(expected, (6, 1)), rtol=1e-5,
                               atol=1e-6)


def test_frozen_after_warmup_stops_moving():
    stage = Preprocessor([ObservationNormalization(freeze_after_warmup=True)],
                         tf.TensorSpec([4], tf.float32), 2)
    stats = stage.transforms[0].stats

    def running():
        return [stats.count.numpy(), stats.mean.numpy().copy(), stats.var.numpy().copy()]

    for batch in _batches(0, 5):
        stage.observe(batch)
    stage.end_chunk()
    stage.freeze()
    before = running()
    assert before[0] == 10 and np.any(before[1] != 0)
    for batch in _batches(1, 5):
        stage.observe(batch)
    stage.end_chunk()
    assert all(np.array_equal(a, b) for a, b in zip(before, running()))


@pytest.fixture(scope='module')
def staged_sac():
    """A SAC agent on Pendulum behind normalisation whose statistics are far from (0, 1)."""
    env = make_env('Pendulum-v1', num_envs=2, seed=0)
    tf_env = tf_py_environment.TFPyEnvironment(env)
    make = functools.partial(sac.make_agent, actor_fc_layer_params=(16,),
                             critic_joint_fc_layer_params=(16,))
    agent = staged_agent.build_agent(
        make, [ObservationNormalization()], tf_env.time_step_spec(), tf_env.action_spec(),
        tf.Variable(0, dtype=tf.int64), num_envs=2, collects=True)
    stats = agent.preprocessor.transforms[0].stats
    stats.mean.assign([0.5, -0.3, 2.0])
    stats.var.assign([0.04, 0.25, 9.0])
    stats.count.assign(100.0)
    agent.preprocessor.transforms[0].refresh()
    yield agent, env, tf_env
    env.close()


def test_evaluation_does_not_move_the_statistics(staged_sac):
    agent, env, _ = staged_sac
    before = _state(agent.preprocessor)
    returns, _ = play_episodes(env, greedy_actor(agent.policy), seed=5)
    assert len(returns) == 2
    assert all(np.array_equal(a, b) for a, b in zip(before, _state(agent.preprocessor)))


def test_the_exported_policy_takes_raw_observations_and_acts_like_the_agent(staged_sac, tmp_path):
    agent, _, tf_env = staged_sac
    export_policy(agent.policy, str(tmp_path / 'policy'), tf.Variable(0, dtype=tf.int64))
    loaded = tf.saved_model.load(str(tmp_path / 'policy'))
    rng = np.random.default_rng(3)
    raw = tf.constant(rng.uniform([-1, -1, -8], [1, 1, 8], (16, 3)), tf.float32)
    time_step = ts.TimeStep(step_type=tf.ones([16], tf.int32), reward=tf.zeros([16]),
                            discount=tf.ones([16]), observation=raw)
    in_process = agent.policy.action(time_step).action.numpy()
    exported = loaded.action(time_step).action.numpy()
    np.testing.assert_allclose(exported, in_process, rtol=1e-5, atol=1e-6)
    # The statistics really are applied: the bare network on raw inputs acts differently.
    bare = agent.agent.policy.action(time_step).action.numpy()
    assert np.abs(bare - in_process).max() > 1e-3
    # And the export carries the statistics as variables.
    names = {v.name for v in loaded.model_variables}
    assert {'mean:0', 'var:0', 'count:0'} <= names


def test_the_collect_policy_publishes_the_statistics_with_the_weights(staged_sac):
    agent, _, _ = staged_sac
    published = {id(v) for v in agent.collect_policy.variables()}
    assert {id(v) for v in agent.preprocessor.variables} <= published
    assert {id(v) for v in agent.agent.collect_policy.variables()} <= published


def _windows(batch=8, steps=2, dim=4, seed=0):
    rng = np.random.default_rng(seed)
    return trajectory_lib.Trajectory(
        step_type=tf.constant(np.full((batch, steps), MID), tf.int32),
        observation=tf.constant(rng.normal(size=(batch, steps, dim)), tf.float32),
        action=tf.zeros([batch, steps], tf.int64), policy_info=(),
        next_step_type=tf.constant(np.full((batch, steps), MID), tf.int32),
        reward=tf.constant(rng.normal(size=(batch, steps)), tf.float32),
        discount=tf.ones([batch, steps]))


def test_augmentation_changes_sampled_batches_but_never_stored_data():
    spec = trajectory_lib.Trajectory(
        step_type=tf.TensorSpec([], tf.int32), observation=tf.TensorSpec([4], tf.float32),
        action=tf.TensorSpec([], tf.int64), policy_info=(),
        next_step_type=tf.TensorSpec([], tf.int32), reward=tf.TensorSpec([], tf.float32),
        discount=tf.TensorSpec([], tf.float32))
    backend = UniformReplay(spec, capacity=64, num_envs=2, batch_size=8, num_steps=2)
    for batch in _batches(0, 16):
        backend.add(batch)
    experience, _ = backend.sample(8, 2)
    stored = [v.numpy().copy() for v in backend.checkpoint_items()['storage']]
    stage = Preprocessor([GaussianNoise(std=0.1)], tf.TensorSpec([4], tf.float32), 2)
    augmented = stage.experience(experience)
    difference = augmented.observation.numpy() - experience.observation.numpy()
    assert np.all(difference != 0) and 0.05 < difference.std() < 0.2
    # Acting never augments.
    np.testing.assert_array_equal(stage.observation(experience.observation).numpy(),
                                  experience.observation.numpy())
    after = [v.numpy() for v in backend.checkpoint_items()['storage']]
    assert stored and all(np.array_equal(a, b) for a, b in zip(stored, after))


def test_random_shift_gives_each_frame_its_own_shift_of_an_edge_padded_frame():
    height, width, pad = 12, 10, 3
    codes = (np.arange(height)[:, None] * 100 + np.arange(width)[None, :]).astype(np.int32)
    frames = np.tile(codes[None, :, :, None], (64, 1, 1, 2))
    shifted = random_shift(tf.constant(frames), pad).numpy()
    shifts = set()
    for frame in shifted:
        row0, col0 = frame[0, 0, 0] // 100, frame[0, 0, 0] % 100
        # Reconstruct (dy, dx) from an interior pixel, then compare with numpy's pad + crop.
        dy, dx = frame[pad, pad, 0] // 100 - pad, frame[pad, pad, 0] % 100 - pad
        padded = np.pad(codes, pad, mode='edge')
        expected = padded[pad + dy:pad + dy + height, pad + dx:pad + dx + width]
        np.testing.assert_array_equal(frame[:, :, 0], expected)
        np.testing.assert_array_equal(frame[:, :, 1], expected)
        assert abs(dy) <= pad and abs(dx) <= pad and row0 >= 0 and col0 >= 0
        shifts.add((int(dy), int(dx)))
    assert len(shifts) > 20  # per-sample: 64 frames, 49 possible shifts


def test_random_shift_in_the_stage_shifts_windows_per_frame_and_only_when_sampling():
    stage = Preprocessor([RandomShift(pad=2)], tf.TensorSpec([8, 8, 1], tf.uint8), 1)
    frames = tf.constant(np.arange(64, dtype=np.uint8).reshape(1, 1, 8, 8, 1))
    windows = tf.tile(frames, [4, 3, 1, 1, 1])  # [B=4, T=3, 8, 8, 1]
    assert stage.observation(windows).shape == windows.shape
    np.testing.assert_array_equal(stage.observation(windows).numpy(), windows.numpy())
    shifted = stage.observation(windows, training=True).numpy().reshape(12, 64)
    assert len({row.tobytes() for row in shifted}) > 3


def test_feature_function_output_builds_the_agent():
    env = make_env('CartPole-v1', num_envs=1, seed=0)
    tf_env = tf_py_environment.TFPyEnvironment(env)
    agent = staged_agent.build_agent(
        functools.partial(dqn.make_agent, fc_layer_params=(8,)),
        [FeatureFunction(fn=squared_features), ObservationNormalization()],
        tf_env.time_step_spec(), tf_env.action_spec(), tf.Variable(0, dtype=tf.int64),
        num_envs=1, collects=True)
    assert agent.agent.time_step_spec.observation.shape == (8,)
    assert agent.collect_data_spec.observation.shape == (4,)  # replay keeps raw observations
    assert agent.preprocessor.transforms[1].stats.mean.shape == (8,)
    action = agent.policy.action(tf_env.reset()).action
    assert action.shape == (1,)
    env.close()


def test_learners_that_do_not_collect_learn_statistics_from_sampled_windows():
    spec = tensor_spec.TensorSpec([4], tf.float32)
    stage = Preprocessor([ObservationNormalization()], spec, 1)
    windows = _windows(batch=8)
    valid = tf.constant([True] * 6 + [False] * 2)
    stage.observe_sampled(windows, valid)
    first = windows.observation.numpy()[:6, 0]
    stats = stage.transforms[0].stats
    assert stats.count.numpy() == 6  # the two masked (boundary) windows are left out
    np.testing.assert_allclose(stats.mean.numpy(), first.mean(0), rtol=1e-6)
    np.testing.assert_allclose(stats.var.numpy(), first.var(0), rtol=1e-5)
    np.testing.assert_allclose(stage.transforms[0].scale.numpy(),
                               1 / np.sqrt(first.var(0) + 1e-8), rtol=1e-5)


@pytest.mark.parametrize('transforms, spec, message', [
    (lambda: [GaussianNoise()], tf.TensorSpec([8, 8, 1], tf.uint8), 'RandomShift'),
    (lambda: [RandomShift()], tf.TensorSpec([4], tf.float32), 'GaussianNoise'),
    (lambda: [FeatureFunction(fn=lambda x: x[:, :, :, 0])], tf.TensorSpec([4], tf.float32),
     'failed on observations'),
    (lambda: ['normalize'], tf.TensorSpec([4], tf.float32), 'no preprocessing transform'),
])
def test_misconfigured_transforms_are_one_line_errors(transforms, spec, message):
    with pytest.raises(UserError, match=message):
        Preprocessor(transforms(), spec, 1)


def test_reward_scaling_needs_collection_and_feature_function_needs_a_function():
    spec = ts.time_step_spec(tf.TensorSpec([4], tf.float32))
    with pytest.raises(UserError, match='reward_scale_factor'):
        staged_agent.build_agent(None, [RewardScaling()], spec, None, None, num_envs=1,
                                 collects=False)
    with pytest.raises(UserError, match='freeze_after_warmup'):
        staged_agent.build_agent(None, [ObservationNormalization(freeze_after_warmup=True)],
                                 spec, None, None, num_envs=1, collects=False)
    with pytest.raises(UserError, match='FeatureFunction.fn'):
        FeatureFunction()
    with pytest.raises(UserError, match='clip'):
        ObservationNormalization(clip=-1.0)


def test_pixels_pass_normalisation_unchanged_by_default():
    stage = Preprocessor([ObservationNormalization()], tf.TensorSpec([8, 8, 4], tf.uint8), 1)
    assert stage.observation_spec.dtype == tf.uint8
    frames = tf.constant(np.full((2, 8, 8, 4), 200, np.uint8))
    np.testing.assert_array_equal(stage.observation(frames).numpy(), frames.numpy())


def test_without_transforms_the_agent_is_used_as_it_is():
    env = make_env('CartPole-v1', num_envs=1, seed=0)
    tf_env = tf_py_environment.TFPyEnvironment(env)
    agent = staged_agent.build_agent(
        functools.partial(dqn.make_agent, fc_layer_params=(8,)), [], tf_env.time_step_spec(),
        tf_env.action_spec(), tf.Variable(0, dtype=tf.int64), num_envs=1, collects=True)
    assert not isinstance(agent, staged_agent.StagedAgent)  # nothing added to any graph
    assert agent.checkpoint_items() == {'agent': agent}
    assert agent.collection_observers() == [] and agent.stage_summaries() == {}
    env.close()
