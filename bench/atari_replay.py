"""Atari replay: memory per stored transition on real frames, and stacked-window sampling speed.

    .venv/bin/python -m bench.atari_replay --output docs/atari_replay.md
    .venv/bin/python -m bench.run_all --only atari_replay      # the same, as a make bench section

Memory: each (game, layout) is filled with frames of the real game in a process of its own,
and the process RSS growth is what a user's run pays, allocator and TF overheads included.
TF-Agents' layout is its Atari example's (and that of any replay that stores the agent's
stacked observations as they are). Speed: sampling from a full buffer of real Pong frames on
one core, against the rate the Nature-CNN learner consumes batches.
"""

import datetime
import sys

from bench import inprocess, timing

GAMES = ('ALE/Pong-v5', 'ALE/Breakout-v5', 'ALE/Boxing-v5')
LAYOUTS = {
    'lz4': 'one frame per step, LZ4 HC (this project, default)',
    'zlib': 'one frame per step, zlib level 1 (this project, codec zlib)',
    'none': 'one frame per step, raw uint8 (this project, codec none)',
    'jpeg': 'one frame per step, JPEG q95 (this project, lossy)',
    'tf_agents': "stacked [84, 84, 4] rows (TF-Agents' TFUniformReplayBuffer)",
    'control': 'no buffer: the harness alone (env, chunks, a no-op add)',
}
# Which layouts run on which games: every game for the two layouts the issue bounds.
PLAN = [(game, layout) for game in GAMES for layout in ('lz4', 'zlib', 'none')] + [
    ('ALE/Pong-v5', 'jpeg'), ('ALE/Pong-v5', 'tf_agents'), ('ALE/Pong-v5', 'control')]
K = 4


def _build(layout, capacity):
    """The `add` of a buffer of `layout` holding `capacity` transitions."""
    from tf_agents.replay_buffers import tf_uniform_replay_buffer

    from bench.buffer_adapters import data_spec

    if layout == 'control':
        return lambda items: None
    if layout == 'tf_agents':
        buffer = tf_uniform_replay_buffer.TFUniformReplayBuffer(data_spec('image'), batch_size=1,
                                                                max_length=capacity)

        def add_batch(items):
            buffer.add_batch(items)  # returns an Operation, which tf.function cannot return
        return add_batch
    return _frame_replay(layout, capacity, num_steps=2).add


def _frame_replay(codec, capacity, num_steps):
    """This project's FrameStackedReplay of [84, 84, K] stacks (bench.buffer_adapters' images)."""
    from bench.buffer_adapters import data_spec
    from buffers.frames import FrameStackedReplay
    from buffers.uniform import UniformReplay

    return FrameStackedReplay(UniformReplay, data_spec('image'), num_frames=K,
                              capacity=capacity, batch_size=32, num_steps=num_steps, codec=codec)


def _frames(game, count, seed=0):
    """Yields (frame, step_type, action, reward, discount) of random play, auto-resetting."""
    import numpy as np

    from envs.suite import make_env

    env = make_env(game, num_envs=1, seed=seed)
    rng = np.random.default_rng(seed)
    time_step = env.reset()
    num_actions = int(env.action_spec().maximum) + 1
    for _ in range(count):
        action = rng.integers(0, num_actions, size=1)
        yield time_step, action
        time_step = env.step(action)
    env.close()


CHUNK = 250  # steps per compiled fill call, as the collect loop adds them


def _chunks(game, transitions, stacks):
    """Trajectories of CHUNK real steps each ([CHUNK, 1, ...] numpy), frames or stacks."""
    import numpy as np

    ring = None
    buffered = []
    for time_step, action in _frames(game, transitions):
        frames = time_step.observation
        if ring is None or time_step.step_type[0] == 0:
            ring = np.repeat(frames[..., None], K, axis=-1)
        else:
            ring = np.concatenate([ring[..., 1:], frames[..., None]], axis=-1)
        buffered.append((time_step.step_type, ring if stacks else frames,
                         action.astype(np.int64), time_step.reward, time_step.discount))
        if len(buffered) == CHUNK:
            yield [np.stack(column) for column in zip(*buffered)]
            buffered = []
    if buffered:
        yield [np.stack(column) for column in zip(*buffered)]


def _filler(add):
    """A compiled loop that `add`s one chunk from `_chunks` step by step."""
    import tensorflow as tf
    from tf_agents.trajectories import trajectory

    def fill(step_type, observation, action, reward, discount):
        for t in tf.range(tf.shape(step_type)[0]):
            add(trajectory.Trajectory(
                step_type=step_type[t], observation=observation[t], action=action[t],
                policy_info=(), next_step_type=step_type[t], reward=reward[t],
                discount=discount[t]))
    return tf.function(fill)


def measure_memory(game, layout, transitions):
    """RSS growth per transition of one layout filled with `transitions` real frames.

    Steps are added inside one compiled loop per CHUNK, as the collect loop adds them
    (an eager call per step would charge TF's per-call overheads to the buffer).
    """
    from core.quiet import quiet_startup
    quiet_startup()
    chunks = _chunks(game, transitions, stacks=layout == 'tf_agents')
    first = next(chunks)
    # Warm-up: a small buffer of the same layout, traced and filled, so TF's one-off
    # allocations (kernels, tracing) are in the baseline, not charged to the transitions.
    _filler(_build(layout, 64))(*[column[:8] for column in first])
    before = inprocess.rss_bytes()
    fill = _filler(_build(layout, transitions))
    fill(*first)
    del first
    for chunk in chunks:
        fill(*chunk)
    after = inprocess.rss_bytes()
    return {'game': game, 'layout': layout, 'transitions': transitions,
            'bytes_per_transition': (after - before) / transitions}


def measure_speed(transitions, rounds=200):
    """Sampling rate of stacked windows vs one Nature-CNN gradient step (one core)."""
    import tensorflow as tf

    from core.quiet import quiet_startup
    from core.tf_setup import configure_tf
    quiet_startup()
    configure_tf(0, 1)
    chunks = list(_chunks('ALE/Pong-v5', transitions, stacks=False))
    results = {}
    for codec in ('none', 'lz4', 'zlib'):
        buffer = _frame_replay(codec, transitions, num_steps=4)
        fill = _filler(buffer.add)
        for chunk in chunks:
            fill(*chunk)
        for num_steps in (2, 4):
            sample = tf.function(lambda n=num_steps, b=buffer: b.sample(32, n)[0].observation)
            results[f'{codec}, {num_steps}-step windows'] = inprocess.rate(sample, 1,
                                                                           calls=rounds)
    results['Nature-CNN gradient steps'] = learner_rate(rounds // 4)
    return results


def learner_rate(steps=50):
    """Nature-CNN DQN gradient steps/s on a fixed batch of 32 (what the learner consumes)."""
    import numpy as np
    import tensorflow as tf
    from tf_agents.specs import tensor_spec
    from tf_agents.trajectories import time_step as ts
    from tf_agents.trajectories import trajectory

    from agents import dqn
    from core.quiet import quiet_startup
    from core.tf_setup import configure_tf
    quiet_startup()
    configure_tf(0, 1)
    spec = tensor_spec.BoundedTensorSpec([84, 84, K], tf.uint8, 0, 255)
    action_spec = tensor_spec.BoundedTensorSpec([], tf.int64, 0, 5)
    # The agent of configs/dqn_atari.gin: DQN (not double), Nature CNN, Adam.
    agent = dqn.make_agent(ts.time_step_spec(spec), action_spec, tf.Variable(0, dtype=tf.int64),
                           conv_layer_params=((32, 8, 4), (64, 4, 2), (64, 3, 1)),
                           fc_layer_params=(512,), double_dqn=False, learning_rate=6.25e-5,
                           adam_epsilon=1.5e-4)
    batch = trajectory.Trajectory(
        step_type=tf.ones([32, 2], tf.int32), observation=tf.constant(
            np.random.default_rng(0).integers(0, 255, [32, 2, 84, 84, K]), tf.uint8),
        action=tf.zeros([32, 2], tf.int64), policy_info=(),
        next_step_type=tf.ones([32, 2], tf.int32), reward=tf.zeros([32, 2]),
        discount=tf.ones([32, 2]))
    return inprocess.rate(tf.function(lambda: agent.train(batch).loss), 1, calls=steps)


def _child(function, *args, opts):
    # A fixed mmap threshold: glibc otherwise raises it after the first large free, and the
    # harness's own temporary chunks then stay in the heap and would count as buffer memory.
    return timing.child_result(f"atari_replay {' '.join(map(str, args))}".strip(),
                               timing.call_command(f'bench.atari_replay.{function}', *args),
                               opts.log_dir, env={'MALLOC_MMAP_THRESHOLD_': '131072'})


def section(opts):
    transitions = 3_000 if opts.quick else 100_000
    rows = [_child('measure_memory', game, layout, transitions, opts=opts)
            for game, layout in PLAN]
    speed_frames = 2_000 if opts.quick else 20_000
    speed = _child('measure_speed', speed_frames, opts=opts)
    return render(rows, speed, transitions, speed_frames, opts)


def render(rows, speed, transitions, speed_frames, opts):
    lines = ['## Atari replay memory and sampling speed', '',
             f'Written by `python -m bench.atari_replay{" --quick" if opts.quick else ""}` on '
             f'{datetime.date.today().isoformat()}; do not edit by hand. Memory: process RSS '
             f'growth from before the buffer was built to after {transitions:,} transitions of '
             'real frames (random play, 84x84 grayscale, frame skip 4), per transition; the '
             'issue\'s bars are raw <= 7.5 KB and lossless compressed <= 1.0 KB on every game.',
             'The harness alone (no buffer) is measured too, and subtracted in the last '
             'columns.', '',
             '| game | layout | RSS growth per transition | net of the harness | '
             '1M transitions (net) |', '| --- | --- | ---: | ---: | ---: |']
    harness = next((row['bytes_per_transition'] for row in rows
                     if row['layout'] == 'control'), 0.0)
    for row in rows:
        per = row['bytes_per_transition']
        if row['layout'] == 'control':
            lines.append(f"| {row['game']} | {LAYOUTS['control']} | {per:,.0f} | | |")
            continue
        lines.append(f"| {row['game']} | {LAYOUTS[row['layout']]} | {per:,.0f} | "
                     f"{per - harness:,.0f} | {(per - harness) * 1e6 / 2**30:,.2f} GiB |")
    learner = speed.pop('Nature-CNN gradient steps')
    lines += ['', f'Sampling batches of 32 stacked windows from {speed_frames:,} Pong frames, one '
              f'core, against the Nature-CNN DQN learner ({learner:,.1f} gradient steps/s on '
              'batch 32, i.e. batches consumed per second); the bar is >= 10x.', '',
              '| sampled | batches/s | × the learner\'s rate |', '| --- | ---: | ---: |']
    for name, rate in speed.items():
        lines.append(f'| {name} | {rate:,.0f} | {rate / learner:,.1f}× |')
    return '\n'.join(lines) + '\n'


def main(argv=None):
    return timing.standalone_main(section, __doc__, argv)


if __name__ == '__main__':
    sys.exit(main())
