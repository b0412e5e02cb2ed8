"""Pixel replay (buffers/frames.py) and acting-side stacks (agents/frame_stack.py).

A scripted stream of frames that encode (env copy, episode, step in episode)
goes through every backend; each sampled stack must show its own episode's
frames only, consecutive, the first frame repeated before the episode start,
with the window's other fields aligned to the stack's newest frame.
"""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.policies import tf_policy
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import policy_step, trajectory
from tf_agents.trajectories import time_step as ts

from agents.frame_stack import FrameStackingPolicy, frames_to_stack, stacking_actor
from buffers.episodic import EpisodicReplay
from buffers.frames import Codec, FrameStackedReplay, stack_windows
from buffers.prioritized import PrioritizedReplay
from buffers.reverb_replay import ReverbPrioritizedReplay, ReverbUniformReplay
from buffers.uniform import UniformReplay
from core.errors import UserError

K = 4
FRAME = (12, 12)
NUM_ENVS = 2
EPISODE_LENGTHS = (7, 5)  # rows per episode of copy 0 and 1, FIRST .. LAST
BACKENDS = [UniformReplay, PrioritizedReplay,
            pytest.param(ReverbUniformReplay, marks=pytest.mark.reverb),
            pytest.param(ReverbPrioritizedReplay, marks=pytest.mark.reverb)]


def _spec():
    return trajectory.Trajectory(
        step_type=tf.TensorSpec([], tf.int32), observation=tf.TensorSpec([*FRAME, K], tf.uint8),
        action=tf.TensorSpec([], tf.int64), policy_info=(),
        next_step_type=tf.TensorSpec([], tf.int32), reward=tf.TensorSpec([], tf.float32),
        discount=tf.TensorSpec([], tf.float32))


def _frame(copy, episode, step):
    """A frame whose pixels say where it comes from; the rest is texture to compress."""
    rng = np.random.default_rng(copy * 1000 + episode * 50 + step)
    frame = rng.integers(0, 4, FRAME).astype(np.uint8) * 60
    frame[0, :3] = (copy, episode, step)
    return frame


def _stream(num_steps):
    """Batched steps of auto-resetting copies: F, M, ..., L, F, ... per copy."""
    for t in range(num_steps):
        step_types, frames, steps = [], [], []
        for copy, length in enumerate(EPISODE_LENGTHS):
            episode, step = divmod(t, length)
            step_types.append(ts.StepType.FIRST if step == 0 else
                              ts.StepType.LAST if step == length - 1 else ts.StepType.MID)
            frames.append(_frame(copy, episode, step))
            steps.append(step)
        step_type = np.array(step_types, np.int32)
        yield trajectory.Trajectory(
            step_type=tf.constant(step_type), observation=tf.constant(np.stack(frames)),
            action=tf.constant(np.array(steps, np.int64)), policy_info=(),
            next_step_type=tf.constant(step_type), reward=tf.constant(np.array(steps, np.float32)),
            discount=tf.ones([NUM_ENVS]))


def _make(backend_cls, codec='lz4', capacity=200, seed=0, num_steps=2):
    return FrameStackedReplay(backend_cls, _spec(), num_frames=K, capacity=capacity,
                              num_envs=NUM_ENVS, batch_size=8, num_steps=num_steps, seed=seed,
                              codec=codec)


def _fill(buffer, steps):
    for step in _stream(steps):
        buffer.add(step)


def _check_stacks(window):
    """Every stack: one episode, consecutive steps, the first frame repeated before it starts."""
    stacks = window.observation.numpy()  # [B, T, H, W, K]
    tags = stacks[:, :, 0, :3, :].astype(np.int64)  # [B, T, 3 (copy, episode, step), K]
    newest = tags[..., -1]
    for d in range(K):
        np.testing.assert_array_equal(tags[..., 0, d], newest[..., 0])  # same copy
        np.testing.assert_array_equal(tags[..., 1, d], newest[..., 1])  # same episode
        np.testing.assert_array_equal(tags[..., 2, d],
                                      np.maximum(newest[..., 2] - (K - 1 - d), 0))
    # The other fields belong to the stack's newest frame.
    np.testing.assert_array_equal(window.action.numpy(), newest[..., 2])
    np.testing.assert_array_equal(window.step_type.numpy() == ts.StepType.FIRST,
                                  newest[..., 2] == 0)
    # Whole frames, not only the tags, come back as stored.
    for b in range(stacks.shape[0]):
        copy, episode, step = newest[b, 0]
        np.testing.assert_array_equal(stacks[b, 0, ..., -1], _frame(copy, episode, step))


@pytest.mark.parametrize('backend_cls', BACKENDS)
@pytest.mark.parametrize('codec', ['lz4', 'zlib', 'none'])
def test_stacks_never_cross_an_episode_start(backend_cls, codec):
    buffer = _make(backend_cls, codec=codec, num_steps=3)
    _fill(buffer, 40)
    window, info = buffer.sample(64, 3)
    assert window.observation.shape == (64, 3, *FRAME, K)
    assert window.reward.shape == (64, 3) and info.keys.shape == (64,)
    _check_stacks(window)
    window, _ = next(iter(buffer.as_dataset(16, 3)))
    _check_stacks(window)


def test_compressed_frames_are_stored_once_as_strings():
    buffer = _make(UniformReplay)
    assert buffer.stored_spec.observation.dtype == tf.string
    assert buffer.inner.data_spec.observation.shape == ()  # one frame per step, no stack
    raw = _make(UniformReplay, codec='none')
    assert raw.inner.data_spec.observation.shape == FRAME
    assert buffer.inner.capacity == 200


def test_jpeg_codec_is_lossy_but_close():
    buffer = _make(UniformReplay, codec='jpeg')
    _fill(buffer, 20)
    window, _ = buffer.sample(8, 2)
    assert window.observation.dtype == tf.uint8 and window.observation.shape[-1] == K
    # The pixels themselves: a smooth frame comes back within a few grey levels, a noisy one
    # visibly changed (lossy), and both keep their shape.
    codec = Codec('jpeg', FRAME, jpeg_quality=95)
    ramp = np.add.outer(np.arange(12) * 10, np.arange(12) * 5).astype(np.uint8)
    noise = np.random.default_rng(0).integers(0, 256, FRAME, dtype=np.uint8)
    frames = tf.constant(np.stack([ramp, noise]))
    decoded = codec.decode(codec.encode(frames)).numpy().astype(np.int64)
    assert decoded.shape == (2, *FRAME)
    assert np.abs(decoded[0] - ramp).mean() < 3.0
    assert np.abs(decoded[1] - noise).mean() > 1.0


def test_lz4_keeps_frames_that_end_in_zero_bytes():
    """An LZ4 block of a frame with a black bottom ends in NUL bytes, which numpy's
    fixed-width strings drop; the stored end byte keeps such frames whole."""
    codec = Codec('lz4', FRAME)
    rng = np.random.default_rng(0)
    noisy = rng.integers(0, 255, [3, *FRAME], dtype=np.uint8)
    noisy[1, FRAME[0] // 2:] = 0
    frames = np.concatenate([np.zeros([1, *FRAME], np.uint8), noisy])
    encoded = codec.encode(tf.constant(frames))
    assert all(blob.endswith(b'\x01') for blob in encoded.numpy())
    np.testing.assert_array_equal(codec.decode(encoded).numpy(), frames)
    # Through numpy's fixed-width bytes, as a batch of strings may reach the decoder.
    fixed = tf.constant(np.array(list(encoded.numpy()), dtype=bytes))
    np.testing.assert_array_equal(codec.decode(fixed).numpy(), frames)


@pytest.mark.parametrize('backend_cls,codec', [(UniformReplay, 'lz4'), (PrioritizedReplay, 'lz4'),
                                               (UniformReplay, 'zlib')])
def test_compressed_buffer_restores_exactly(backend_cls, codec, tmp_path):
    buffer = _make(backend_cls, codec=codec, seed=1)
    _fill(buffer, 30)
    path = tf.train.Checkpoint(replay=buffer.checkpoint_items()).save(str(tmp_path / 'ckpt'))
    restored = _make(backend_cls, codec=codec, seed=7)
    tf.train.Checkpoint(replay=restored.checkpoint_items()).restore(path).assert_consumed()
    a, a_info = buffer.sample(32, 2)
    b, b_info = restored.sample(32, 2)
    tf.nest.map_structure(np.testing.assert_array_equal, a, b)
    tf.nest.map_structure(np.testing.assert_array_equal, a_info, b_info)


def test_stack_windows_first_frame_fills_before_the_start():
    first, mid, last = ts.StepType.FIRST, ts.StepType.MID, ts.StepType.LAST
    step_type = tf.constant([[mid, mid, last, first, mid, mid, mid]])
    frames = tf.cast(tf.reshape(tf.range(1, 8), [1, 7, 1, 1]), tf.uint8)
    stacks = stack_windows(frames, step_type, K)[0, :, 0, 0, :].numpy()
    np.testing.assert_array_equal(stacks, [[4, 4, 4, 4], [4, 4, 4, 5], [4, 4, 5, 6],
                                           [4, 5, 6, 7]])


@pytest.mark.parametrize('num_frames', [2, 3, 4])
def test_stack_windows_matches_a_plain_gather_for_every_stack_size(num_frames):
    """k = 4 packs channels into uint32s; the stacks must equal the gathered frames."""
    rng = np.random.default_rng(num_frames)
    frames = rng.integers(0, 256, [5, 9, 6, 7]).astype(np.uint8)
    step_type = rng.choice([ts.StepType.FIRST, ts.StepType.MID, ts.StepType.LAST], [5, 9],
                           p=[0.2, 0.6, 0.2]).astype(np.int32)
    compiled = tf.function(stack_windows, jit_compile=True, autograph=False)
    for stack in (stack_windows, lambda *args: compiled(*args)):
        stacks = stack(tf.constant(frames), tf.constant(step_type), num_frames).numpy()
        assert stacks.shape == (5, 9 - num_frames + 1, 6, 7, num_frames)
        for b in range(5):
            for t in range(9 - num_frames + 1):
                newest = t + num_frames - 1
                starts = [i for i in range(newest + 1) if step_type[b, i] == ts.StepType.FIRST]
                sources = [max(i, starts[-1] if starts else 0)
                           for i in range(t, newest + 1)]
                np.testing.assert_array_equal(stacks[b, t],
                                              np.moveaxis(frames[b, sources], 0, -1))


def test_episodic_replay_is_refused_with_frame_stacks():
    # Its windows stay inside an episode: an episode's first k - 1 steps would never train.
    with pytest.raises(UserError, match='first 3 steps'):
        _make(EpisodicReplay)


def test_non_frame_observations_are_refused():
    spec = _spec()._replace(observation=tf.TensorSpec([3], tf.float32))
    with pytest.raises(UserError, match='frame_stack'):
        FrameStackedReplay(UniformReplay, spec, num_frames=K, capacity=100)
    with pytest.raises(UserError, match='codec'):
        _make(UniformReplay, codec='png')


def test_a_resume_with_another_codec_is_refused(tmp_path):
    buffer = _make(UniformReplay, codec='zlib')
    _fill(buffer, 10)
    path = tf.train.Checkpoint(replay=buffer.checkpoint_items()).save(str(tmp_path / 'ckpt'))
    other = _make(UniformReplay, codec='lz4')
    with pytest.raises(UserError, match="codec='zlib'"):
        tf.train.Checkpoint(replay=other.checkpoint_items()).restore(path)


class _ReadStack(tf_policy.TFPolicy):
    """Acts with a number that encodes the step tags of the stack it is given."""

    def __init__(self, time_step_spec, action_spec):
        super().__init__(time_step_spec, action_spec)

    def _action(self, time_step, policy_state, seed):
        steps = tf.cast(time_step.observation[:, 0, 2, :], tf.int64)  # [N, K]
        code = tf.reduce_sum(steps * (100 ** tf.range(K, dtype=tf.int64)), axis=1)
        return policy_step.PolicyStep(code, policy_state, ())

    def _distribution(self, time_step, policy_state):
        raise NotImplementedError


def _expected_code(step):
    return sum(max(step - (K - 1 - d), 0) * 100 ** d for d in range(K))


def test_acting_stacks_match_the_sampled_ones():
    """The TF ring (collection) and the numpy ring (evaluation) give the stacks replay builds."""
    frame_spec = tensor_spec.BoundedTensorSpec(FRAME, tf.uint8, 0, 255)
    stack_spec = tensor_spec.BoundedTensorSpec([*FRAME, K], tf.uint8, 0, 255)
    action_spec = tensor_spec.BoundedTensorSpec([], tf.int64, 0, 10**9)
    inner = _ReadStack(ts.time_step_spec(stack_spec), action_spec)
    assert frames_to_stack(stack_spec.shape, frame_spec.shape) == K
    assert frames_to_stack(stack_spec.shape, stack_spec.shape) is None
    stacking = FrameStackingPolicy(inner, ts.time_step_spec(frame_spec))
    act = tf.function(lambda step: stacking.action(step).action)
    numpy_act = stacking_actor(lambda step: inner.action(
        tf.nest.map_structure(tf.convert_to_tensor, step)).action.numpy(), K)
    for step in _stream(20):
        time_step = ts.TimeStep(step.step_type, tf.zeros([NUM_ENVS]), tf.ones([NUM_ENVS]),
                                step.observation)
        expected = [_expected_code(int(s)) for s in step.action.numpy()]
        np.testing.assert_array_equal(act(time_step).numpy(), expected)
        numpy_step = tf.nest.map_structure(lambda x: x.numpy(), time_step)
        np.testing.assert_array_equal(numpy_act(numpy_step), expected)


def _memmap(directory, seed=1, capacity=20):
    return FrameStackedReplay(UniformReplay, _spec(), num_frames=K, capacity=capacity,
                              num_envs=NUM_ENVS, batch_size=8, num_steps=2, seed=seed,
                              codec='none', storage='memmap', directory=str(directory))


def test_memmap_storage_samples_what_memory_storage_samples(tmp_path):
    on_disk, in_memory = _memmap(tmp_path / 'frames'), _make(UniformReplay, 'none', 20, seed=1)
    _fill(on_disk, 30)
    _fill(in_memory, 30)
    assert on_disk.inner.data_spec.observation.dtype == tf.int64  # frame ids, not frames
    assert (tmp_path / 'frames' / 'frames.u8').stat().st_size == 2 * 20 * FRAME[0] * FRAME[1]
    a, _ = on_disk.sample(32, 2)
    b, _ = in_memory.sample(32, 2)
    tf.nest.map_structure(np.testing.assert_array_equal, a, b)
    _check_stacks(a)


def test_memmap_storage_resumes_from_the_checkpoint_and_refuses_lost_frames(tmp_path):
    writer = _memmap(tmp_path / 'frames')
    steps = list(_stream(60))
    for step in steps[:30]:
        writer.add(step)
    path = tf.train.Checkpoint(replay=writer.checkpoint_items()).save(str(tmp_path / 'ckpt'))
    for step in steps[30:36]:  # written after the checkpoint, then the process dies
        writer.add(step)
    restored = _memmap(tmp_path / 'frames', seed=7)
    tf.train.Checkpoint(replay=restored.checkpoint_items()).restore(path).assert_consumed()
    reference = _make(UniformReplay, 'none', 20, seed=1)
    for step in steps[:30]:
        reference.add(step)
    tf.nest.map_structure(np.testing.assert_array_equal, restored.sample(32, 2)[0],
                          reference.sample(32, 2)[0])
    for step in steps[30:]:  # more than a buffer's worth after the checkpoint
        writer.add(step)
    with pytest.raises(UserError, match='lost'):
        tf.train.Checkpoint(replay=_memmap(tmp_path / 'frames').checkpoint_items()).restore(path)
    # A run directory whose frame file is gone is refused as such, not trained on zeros.
    with pytest.raises(UserError, match='missing'):
        tf.train.Checkpoint(replay=_memmap(tmp_path / 'elsewhere').checkpoint_items()).restore(
            path)
    with pytest.raises(UserError, match='another capacity'):
        _memmap(tmp_path / 'frames', capacity=30)


def test_memmap_storage_needs_raw_frames_and_a_directory(tmp_path):
    with pytest.raises(UserError, match="codec='none'"):
        FrameStackedReplay(UniformReplay, _spec(), num_frames=K, capacity=100,
                           storage='memmap', directory=str(tmp_path))
    with pytest.raises(UserError, match='directory'):
        FrameStackedReplay(UniformReplay, _spec(), num_frames=K, capacity=100, codec='none',
                           storage='memmap')


def test_the_warm_up_policy_keeps_the_collect_policys_ring_filled():
    """Random warm-up and agent share one ring: the agent's first stack is complete."""
    frame_spec = tensor_spec.BoundedTensorSpec(FRAME, tf.uint8, 0, 255)
    stack_spec = tensor_spec.BoundedTensorSpec([*FRAME, K], tf.uint8, 0, 255)
    action_spec = tensor_spec.BoundedTensorSpec([], tf.int64, 0, 10**9)
    inner = _ReadStack(ts.time_step_spec(stack_spec), action_spec)
    agent = FrameStackingPolicy(inner, ts.time_step_spec(frame_spec))
    warm_up = FrameStackingPolicy(inner, ts.time_step_spec(frame_spec), ring=agent.ring)
    for index, step in enumerate(_stream(20)):
        policy = warm_up if index < 10 else agent
        time_step = ts.TimeStep(step.step_type, tf.zeros([NUM_ENVS]), tf.ones([NUM_ENVS]),
                                step.observation)
        expected = [_expected_code(int(s)) for s in step.action.numpy()]
        np.testing.assert_array_equal(policy.action(time_step).action.numpy(), expected)


def test_acting_for_some_copies_keeps_every_copys_stack():
    """Evaluation stops acting for copies whose episode ended: the others' stacks go on."""
    seen = []
    act = stacking_actor(lambda step: seen.append(step.observation) or np.zeros(3), 2)
    frame = lambda values: np.asarray(values, np.uint8).reshape(-1, 1, 1)  # noqa: E731
    act(ts.TimeStep(np.zeros(3, np.int32), None, None, frame([1, 2, 3])))
    act(ts.TimeStep(np.ones(2, np.int32), None, None, frame([5, 7])), rows=np.array([0, 2]))
    act(ts.TimeStep(np.ones(1, np.int32), None, None, frame([9])), rows=np.array([2]))
    np.testing.assert_array_equal(seen[1][:, 0, 0], [[1, 5], [3, 7]])
    np.testing.assert_array_equal(seen[2][:, 0, 0], [[7, 9]])
