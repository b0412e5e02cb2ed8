"""TF-Agents' own DQN example with its replay buffer and with ours substituted.

    .venv/bin/python -m bench.tf_agents_example [--quick] [--output FILE]

Runs `tf_agents.agents.dqn.examples.v2.train_eval` (CartPole-v0, its default settings) as a
TF-Agents user would, once with `TFUniformReplayBuffer` and once with
`buffers.tf_agents_api.UniformReplayBuffer` put in its place -- the one line a user changes;
here `tf_uniform_replay_buffer.TFUniformReplayBuffer` is patched before `train_eval` runs, so
the example's code is untouched. Each run is a fresh process (pinned like every section),
seeded the same way, and reports the example's own `steps/sec` log lines (collect + train,
evaluation excluded) and its evaluation returns (10 episodes every `EVAL_INTERVAL`
iterations). Two seeds per buffer, alternated, so a drift of the machine hits both.
"""

import statistics

from bench import buffers, timing

ITERATIONS = 15_000
EVAL_INTERVAL = 2_500
SEEDS = (0, 1)
BUFFERS = ('TFUniformReplayBuffer', 'ours')
# The buffer benchmark's systems (bench/buffer_adapters.py): TF-Agents' class and ours behind
# TF-Agents' interface, built and read the same way.
SAMPLING_PAIRS = (('tfa_uniform', 'api_uniform'), ('tfa_episodic', 'api_episodic'))


def run_example(buffer, num_iterations, eval_interval, seed, root_dir):
    """One `train_eval` run in this process: {'steps_per_s': [...], 'returns': [[step, r]]}."""
    import tensorflow as tf
    from absl import logging
    from tf_agents.agents.dqn.examples.v2 import train_eval
    from tf_agents.replay_buffers import tf_uniform_replay_buffer

    if buffer == 'ours':
        from buffers.tf_agents_api import UniformReplayBuffer
        tf_uniform_replay_buffer.TFUniformReplayBuffer = UniformReplayBuffer
    tf.random.set_seed(seed)
    rates, returns = [], []
    log = logging.info

    def record_rates(message, *args):
        if message == '%.3f steps/sec':
            rates.append(float(args[0]))
        log(message, *args)

    train_eval.logging.info = record_rates
    train_eval.train_eval(
        root_dir, num_iterations=num_iterations, eval_interval=eval_interval,
        log_interval=min(1000, num_iterations // 4),
        eval_metrics_callback=lambda results, step: returns.append(
            [int(step), float(results['AverageReturn'].numpy())]))
    return {'steps_per_s': rates, 'returns': returns}


def measure(opts):
    iterations = 1_000 if opts.quick else ITERATIONS
    eval_interval = 500 if opts.quick else EVAL_INTERVAL
    results = {name: [] for name in BUFFERS}
    seeds = SEEDS[:1] if opts.quick else SEEDS
    for seed in seeds:
        for name in BUFFERS:
            cmd = timing.pin_prefix(opts.cpus) + timing.call_command(
                'bench.tf_agents_example.run_example', name, iterations, eval_interval, seed,
                f'{opts.log_dir}/tf_agents_example_{name}_{seed}')
            results[name].append(timing.child_result(f'tf_agents_example {name} seed {seed}',
                                                     cmd, opts.log_dir))
    return results, iterations, eval_interval, seeds


def _summary(runs):
    """Median logged steps/s (the first log window holds tracing: left out) and returns."""
    rates = [rate for run in runs for rate in run['steps_per_s'][1:]]
    final = [run['returns'][-1][1] for run in runs]
    best = [max(r for _, r in run['returns']) for run in runs]
    return statistics.median(rates), final, best


def sampling_rows(opts):
    """Read rates of each (TF-Agents' class, ours) pair, as the buffer benchmark measures
    them (bench/buffers.py), both data kinds. Inserts are left to that benchmark's interleaved
    pairs: an empty buffer's first writes are page faults, which single runs cannot compare,
    and `add_batch` is `UniformReplay.add` behind one structure check."""
    rows = []
    for theirs, ours in SAMPLING_PAIRS:
        for kind in buffers.KINDS:
            measured = {system: buffers.run_worker(system, kind, opts)
                        for system in (theirs, ours)}
            for path in measured[theirs]['sample']:
                them, us = measured[theirs]['sample'][path], measured[ours]['sample'][path]
                rows.append([buffers.LABELS.get(theirs, theirs), kind, path,
                             buffers.rate(them), buffers.rate(us), f'{us / them:.2f}×'])
    return rows


def section(opts):
    rows_sampling = sampling_rows(opts)
    results, iterations, eval_interval, seeds = measure(opts)
    theirs, ours = _summary(results['TFUniformReplayBuffer']), _summary(results['ours'])
    rows = [[name, f'{rate:.0f}', ', '.join(f'{r:.1f}' for r in final),
             ', '.join(f'{r:.1f}' for r in best)]
            for name, (rate, final, best) in (
                ("TF-Agents' `TFUniformReplayBuffer`", theirs),
                ('ours, `buffers.tf_agents_api.UniformReplayBuffer`', ours))]
    curves = '; '.join(
        f'{name} seed {seed}: ' + ', '.join(f'{step}: {r:.0f}' for step, r in run['returns'])
        for name in BUFFERS for seed, run in zip(seeds, results[name]))
    return '\n'.join([
        "## TF-Agents' DQN example with our replay buffer", '',
        'Measured by `python -m bench.tf_agents_example` (bench/tf_agents_example.py): '
        '`tf_agents.agents.dqn.examples.v2.train_eval` on CartPole-v0 with its default '
        f'settings, {iterations:,} iterations (one env step and one gradient step each), '
        f'evaluated every {eval_interval:,}; seeds {", ".join(map(str, seeds))}; '
        f'{timing.describe_pinning(opts.cpus)}; {timing.cpu_model()}. Speed is the median '
        "of the example's own `steps/sec` log lines (collect + train, evaluation excluded; "
        'the first window, which holds tracing, left out).', '',
        timing.markdown_table(['replay buffer', 'iterations/s', 'final eval return per seed',
                               'best eval return per seed'], rows), '',
        f'Ours / TF-Agents\': **{ours[0] / theirs[0]:.2f}×** iterations/s. Evaluation curves '
        f'(iteration: return) -- {curves}.', '',
        'The example\'s time goes to its Python loop, driver and train step, not to the '
        'buffer. The buffers alone, each pair built and read the same way by the buffer '
        'benchmark\'s workers (bench/buffer_adapters.py, bench/buffer_systems.py: 100k '
        'transitions from 32 env copies, batches of 256 two-step windows; the uniform pair '
        'read as TF-Agents\' DQN example reads it, `as_dataset(num_parallel_calls=3)'
        '.prefetch(3)`; the episodic pair filled through the stateful wrapper, episodes of '
        '200 steps), in windows/s read '
        '(`add_batch` is `UniformReplay.add`: its insert rates are in the replay-buffer '
        'section):', '',
        timing.markdown_table(['TF-Agents class', 'data', 'path', 'theirs',
                               'ours (buffers/tf_agents_api.py)', 'ours / theirs'],
                              rows_sampling, 'lllrrr'), ''])


def main(argv=None):
    timing.standalone_main(section, __doc__, argv)


if __name__ == '__main__':
    main()
