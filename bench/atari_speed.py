"""Atari DQN end to end: compressed vs raw replay, against its gradient steps alone, two cores,
and Stable-Baselines3's DQN.

    .venv/bin/python -m bench.atari_speed --output docs/atari_speed.md \\
        --sb3_python /tmp/sb3venv/bin/python        # the peer's venv: bench/sb3_atari_peer.py

Ours is configs/dqn_atari.gin on Pong with a 100,000-transition replay (SB3 stores stacks:
its 1M would not fit this machine), no evaluation, report or export, measured by the
two-budget method (bench/harness.py). "Gradient steps alone" is one Nature-CNN DQN step on a
fixed batch of 32, timed in a loop on core 0: at 4 env steps per gradient step, the env
steps/s a run would reach if everything else were free. The overlapped variant collects each
chunk on a second thread while the previous one trains (experiment/loop.py `FusedLoop`).
"""

import datetime
import sys

from bench import harness, timing

CONFIG = 'configs/dqn_atari.gin'
COMMON = harness.NO_EXTRA_WORK + [
    'run.export_final_policy=False', 'run.replay_capacity=100000', 'run.initial_collect_steps=1000',
    'run.checkpoint_interval=0', 'eval/atari_env.max_episode_frames=400']
VARIANTS = [
    ('LZ4 replay, 1 core', ['FrameStackedReplay.codec="lz4"'], '0'),
    ('raw replay, 1 core', ['FrameStackedReplay.codec="none"'], '0'),
    # The bench's budgets end while epsilon is still ~0.95, so the collect policy mostly
    # skips the Q-network (agents/epsilon_greedy.py, as SB3 and Dopamine do); late in a
    # run, at epsilon 0.01, it runs on every step. This variant measures that phase.
    ('LZ4 replay, 1 core, epsilon 0.01', ['FrameStackedReplay.codec="lz4"',
                                          'dqn.make_agent.epsilon_start=0.01'], '0'),
    ('LZ4 replay, 2 cores (run.tf_threads=2)', ['FrameStackedReplay.codec="lz4"',
                                                'run.tf_threads=2'], '0-1'),
    ('LZ4 replay, 2 cores, overlapped collection', ['FrameStackedReplay.codec="lz4"',
                                                    'run.tf_threads=2',
                                                    'run.overlap_collection=True'], '0-1'),
]
FULL = (3_000, 13_000)
QUICK = (1_200, 2_400)


def _measure_ours(opts):
    systems = [harness.train_system(name, CONFIG, COMMON + extra, uses_xla=False, cpus=cpus)
               for name, extra, cpus in VARIANTS]
    measured = harness.measure(systems, QUICK if opts.quick else FULL, opts, 'atari-speed-')
    return {item.system.name: item.rate.rate for item in measured}


def _gradient_steps_alone(opts):
    """Nature-CNN DQN gradient steps/s on batch 32, one TF thread, pinned to core 0."""
    cmd = timing.pin_prefix('0') + timing.call_command('bench.atari_replay.learner_rate')
    return timing.child_result('gradient steps alone', cmd, opts.log_dir)


def _sb3(opts):
    if not opts.sb3_python:
        return None
    cmd = timing.pin_prefix('0') + [opts.sb3_python, 'bench/sb3_atari_peer.py']
    if opts.quick:
        cmd += ['--warmup=1200', '--steps=1200']
    return timing.child_result('SB3 peer', cmd, opts.log_dir)


def section(opts):
    return render(_measure_ours(opts), _gradient_steps_alone(opts), _sb3(opts), opts)


def render(rates, gradient_steps, sb3, opts):
    lz4, raw, late, two, overlapped = (rates[name] for name, _, _ in VARIANTS)
    allowed = 4 * gradient_steps
    lines = ['## Atari DQN end to end (Pong, Nature settings)', '',
             f'Written by `python -m bench.atari_speed{" --quick" if opts.quick else ""}` on '
             f'{datetime.date.today().isoformat()} on {timing.cpu_model()}; do not edit by '
             'hand. Env steps/s '
             '(agent steps, 4 frames each) from two budgets per variant.', '',
             '| measured | env steps/s | ratio | bar |', '| --- | ---: | ---: | --- |',
             f'| LZ4 replay (the default), 1 core | {lz4:,.1f} | | |',
             f'| raw replay, 1 core | {raw:,.1f} | compressed costs {1 - lz4 / raw:+.1%} | '
             '<= 10% |',
             f'| gradient steps alone allow (4 × {gradient_steps:,.1f} steps/s) | {allowed:,.1f} | '
             f'LZ4 run reaches {lz4 / allowed:.0%} | >= 80% |',
             f'| LZ4 replay, 1 core, epsilon fixed at 0.01 (late in a run: the Q-network runs '
             f'every step) | {late:,.1f} | reaches {late / allowed:.0%} of the gradient steps\' '
             'rate | |',
             f'| LZ4 replay, 2 cores, run.tf_threads=2 | {two:,.1f} | {two / lz4:.2f}× the '
             '1-core rate | |',
             f'| LZ4 replay, 2 cores, run.tf_threads=2, run.overlap_collection=True | '
             f'{overlapped:,.1f} | {overlapped / lz4:.2f}× the 1-core rate | >= 1.4× |']
    if sb3:
        lines.append(f"| Stable-Baselines3 DQN (torch {sb3['torch']}, 1 core) | "
                     f"{sb3['rate']:,.1f} | ours (LZ4) {lz4 / sb3['rate']:.2f}× | >= 1.5× |")
    else:
        lines.append('| Stable-Baselines3 DQN | not measured (no --sb3_python) | | |')
    return '\n'.join(lines) + '\n'


def main(argv=None):
    return timing.standalone_main(section, __doc__, argv)


if __name__ == '__main__':
    sys.exit(main())
