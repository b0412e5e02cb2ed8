"""How far a distributed run scales: per-role costs on one core, server capacity, and a model.

Measured here, each with nothing else running:

- **a collector on one core**: the collector's own work (the env, the agent's collect
  policy, writes to the server through its backend) pinned to core 0, the replay role on
  core 1 with its rate limiter open: env steps/s;
- **the learner on one core** (bench/learner_alone.py): the real learner role against a
  pre-filled server, the single-process gradient steps alone, and sampling alone;
- **one replay server's capacity** (bench/server_capacity.py): CPU per 1,000 windows
  inserted and sampled, for CartPole-sized and Atari frame windows.

From these, per workload, at the config's replay ratio r (gradient steps per env step)
and batch B: a learner at L gradient steps/s consumes L / r env steps/s, so it absorbs
L / (r x collector rate) collectors; the server then inserts L / r and samples L x B
windows/s, which at the measured CPU per window needs that many server cores. A faster
learner (a GPU at 10x the single-process gradient rate) multiplies both, and its input
pipeline needs L x B / (sampling windows/s per core) CPU cores of its own.

A learner holding the replay (`distributed.settings.learner_holds_replay`) takes each
window from the server once: the server inserts and samples L / r windows/s, and the
learner's intake is L / r windows/s at the sampling rate one core reached; its own model
table uses its measured rate (bench/learner_alone.py, "learner holding the replay").

In full mode it writes docs/scaling.md, and the model's table into docs/distributed.md
between its `scaling-model` markers; as a `make bench` section it adds the model's table
to docs/benchmarks.md. `--quick` only prints (its numbers are not a benchmark).
"""

import math
import os
import shutil
import tempfile

from bench import learner_alone, server_capacity, timing

WORKLOADS = [  # (name, config, windows kind: the server_capacity.WINDOWS row it uses)
    ('DQN CartPole', 'configs/dqn_cartpole.gin', 0),
    ('SAC Pendulum', 'configs/sac_pendulum.gin', 0),
    ('DQN Pong (LZ4 frames)', 'configs/dqn_atari.gin', 1),
]
FASTER_LEARNER = 10  # "a GPU at 10x the gradient rate"
SCALING_DOC = os.path.join(timing.REPO_ROOT, 'docs', 'scaling.md')
DISTRIBUTED_DOC = os.path.join(timing.REPO_ROOT, 'docs', 'distributed.md')
BEGIN_MARK = '<!-- scaling-model: written by `python -m bench.scaling`; do not edit -->'
END_MARK = '<!-- /scaling-model -->'


def collector_rate(config, bindings, address, seconds):
    """Child: env steps/s of one collector (its env, collect policy and writes) on one core."""
    params, settings = learner_alone._load(config, bindings)
    import tensorflow as tf

    from bench import inprocess
    from experiment.distributed import common
    from experiment.loop import Collection
    from experiment.replay import Mode

    agent, _, tf_env = common.build_agent(params, seed=1)
    backend = common.remote_backend(Mode.COLLECTOR, params, settings, agent,
                                    num_envs=tf_env.batch_size, address=address, seed=1)
    collection = Collection(tf_env=tf_env, collect_policy=agent.collect_policy,
                            observers=[backend.add], env_steps=tf.Variable(0, dtype=tf.int64))
    chunk = max(1, params.collect_steps_per_iteration // tf_env.batch_size)  # the role's chunk
    rate = inprocess.rate(lambda: collection.collect_with_agent(tf.constant(chunk, tf.int32)),
                          chunk * tf_env.batch_size, seconds=seconds, warmup=2)
    backend.metrics()  # flushes
    return {'rate': rate}


def measure_collector(name, config, opts):
    from experiment.distributed.cluster import free_port

    bindings = learner_alone._bindings([])
    root = tempfile.mkdtemp(prefix='bench-collector-')
    port = free_port()
    address = f'localhost:{port}'
    server, log = learner_alone._start_server(config, bindings, root, port, opts.log_dir)
    try:
        learner_alone._wait_for(address, server)
        label = name.split(' (')[0].lower().replace(' ', '_')
        return timing.child_result(f'{label} collector', timing.pin_prefix('0') +
                                   timing.call_command('bench.scaling.collector_rate', config,
                                                       bindings, address,
                                                       5 if opts.quick else 20),
                                   opts.log_dir)['rate']
    finally:
        learner_alone.stop(server, log)
        shutil.rmtree(root, ignore_errors=True)


def _replay_ratio(config):
    params, _ = learner_alone._load(config, learner_alone._bindings([]))
    return params.replay_ratio


def costliest(phases, kind):
    """The highest server CPU ms per 1,000 windows measured for `kind` (any client count)."""
    return max(phase['cpu_ms_per_1000'] for phase in phases if phase['kind'] == kind)


def model_row(name, ratio, batch_size, collector, learner, alone, sampling, phases):
    """The scaling model of one workload (see the module docstring)."""
    insert_ms, sample_ms = costliest(phases, 'insert'), costliest(phases, 'sample')

    def at(rate):
        env_steps = rate / ratio
        server_cores = (env_steps * insert_ms + rate * batch_size * sample_ms) / 1e6
        return env_steps / collector, server_cores

    collectors, server_cores = at(learner)
    fast = FASTER_LEARNER * alone
    fast_collectors, fast_server_cores = at(fast)
    per_10k = 1e4 * (insert_ms + ratio * batch_size * sample_ms) / 1e6
    return {'name': name, 'ratio': ratio, 'collector': collector, 'learner': learner,
            'collectors': collectors, 'server_cores': server_cores, 'per_10k': per_10k,
            'fast': fast, 'fast_collectors': fast_collectors,
            'fast_server_cores': fast_server_cores,
            'fast_input_cores': fast * batch_size / sampling}


def section(opts):
    capacity = server_capacity.measure(opts)
    rows = []
    for name, config, windows in WORKLOADS:
        learner = learner_alone.measured(name, opts)
        collector = measure_collector(name, config, opts)
        rows.append({'learner': learner, 'collector': collector, 'windows': windows,
                     'ratio': _replay_ratio(config)})
    models = [model_row(row['learner']['name'], row['ratio'], row['learner']['batch_size'],
                        row['collector'], row['learner']['learner'], row['learner']['alone'],
                        row['learner']['windows_per_sec'], capacity[row['windows']]['phases'])
              for row in rows]
    held = [held_model_row(row['learner']['name'], row['ratio'], row['collector'],
                           row['learner']['held'], row['learner']['alone'],
                           row['learner']['windows_per_sec'], capacity[row['windows']]['phases'])
            for row in rows if row['learner'].get('held')]
    document = render(capacity, rows, models, opts, held)
    if opts.quick:
        return document
    timing.write_doc(SCALING_DOC, document)
    update_distributed_doc(models, held)
    print(f'Wrote {os.path.relpath(SCALING_DOC)} and the model in '
          f'{os.path.relpath(DISTRIBUTED_DOC)}', flush=True)
    return '\n'.join([
        '## Scaling: the model', '',
        'The whole measurement (each role on one core, one server\'s capacity) is in '
        '[scaling.md](scaling.md), written by this run.', '', _model_table(models), '',
        HELD_TITLE, '', _model_table(held), ''])


HELD_TITLE = ('With the learner holding the replay (`distributed.settings.learner_holds_replay`: '
              'each window crosses the server once)')


def step_split(learner):
    """(training, sampling, the rest) ms of one learner gradient step on its one core.

    Training is the single-process step alone; sampling is the batch's windows at the rate
    sampling alone reached on the same core; the rest (weight pushes, counters, waits on the
    server, both competing for one core) is what the learner's measured step takes beyond both.
    """
    step = 1e3 / learner['learner']
    training = 1e3 / learner['alone']
    sampling = 1e3 * learner['batch_size'] / learner['windows_per_sec']
    return training, sampling, step - training - sampling


def held_model_row(name, ratio, collector, held, alone, sampling, phases):
    """The model of one workload whose learner holds the replay (module docstring)."""
    per_window = costliest(phases, 'insert') + costliest(phases, 'sample')

    def at(rate):
        env_steps = rate / ratio
        return env_steps / collector, env_steps * per_window / 1e6, env_steps / sampling

    collectors, server_cores, _ = at(held)
    fast = FASTER_LEARNER * alone
    fast_collectors, fast_server_cores, fast_input_cores = at(fast)
    return {'name': name, 'ratio': ratio, 'learner': held, 'collectors': collectors,
            'server_cores': server_cores, 'per_10k': 1e4 * per_window / 1e6,
            'fast': fast, 'fast_collectors': fast_collectors,
            'fast_server_cores': fast_server_cores, 'fast_input_cores': fast_input_cores}


def _model_table(models):
    def count(value):
        return f'{value:.2f}' if value < 1 else f'{value:.1f}' if value < 10 else \
            f'{math.ceil(value):,}'

    return timing.markdown_table(
        ['workload', 'replay ratio', 'learner, gradient steps/s', 'collectors it absorbs',
         'server cores at that rate', 'server cores per 10k env steps/s',
         f'{FASTER_LEARNER}× learner: collectors', 'server cores',
         'learner input cores'],
        [[m['name'], f"{m['ratio']:g}", f"{m['learner']:,.0f}", count(m['collectors']),
          f"{m['server_cores']:.2f}", f"{m['per_10k']:.2f}", count(m['fast_collectors']),
          f"{m['fast_server_cores']:.2f}", count(m['fast_input_cores'])] for m in models],
        'lrrrrrrrr')


def render(capacity, rows, models, opts, held=()):
    command = f'python -m bench.scaling{" --quick" if opts.quick else ""}'
    roles = timing.markdown_table(
        ['workload', 'collector, env steps/s on one core',
         'learner, gradient steps/s on one core', 'gradient steps alone, one process',
         'learner sampling alone, windows/s', 'a learner step: training ms', 'sampling ms',
         'the rest ms'],
        [[row['learner']['name'], f"{row['collector']:,.0f}", f"{row['learner']['learner']:,.0f}",
          f"{row['learner']['alone']:,.0f}", f"{row['learner']['windows_per_sec']:,.0f}",
          *(f'{ms:.2f}' for ms in step_split(row['learner']))] for row in rows], 'lrrrrrrr')
    return '\n'.join([
        '# Scaling: what each role costs, what one server absorbs, and a model', '',
        f'Written by `{command}` (a `make bench` section) on {timing.cpu_model()}, '
        f'{os.cpu_count()} CPUs; do not edit by hand. Every measurement ran with nothing else '
        'on the machine: the measured role pinned to core 0, the replay server to core 1.', '',
        '## Each role on one core', '',
        'The collector is the real collector work (env, the agent\'s collect policy, writes '
        'to the server); the learner is the real learner role against a pre-filled server '
        '(bench/learner_alone.py); "gradient steps alone" is the single-process training '
        'chunk with no sampling wait, the learner\'s compute ceiling. The last three columns '
        'split one learner step on its core: the training step alone, sampling its batch at '
        'the rate sampling alone reached, and the rest (weight pushes, counters, both '
        'competing for one core); a negative rest means sampling overlapped the step.', '',
        roles, '',
        server_capacity.render(capacity),
        '## The model', '',
        _model_table(models), '',
        'How to read it: at the config\'s replay ratio r (gradient steps per env step), a '
        'learner at L gradient steps/s uses L / r env steps/s, that is L / (r × one collector\'s '
        'rate) collectors. The server then inserts L / r windows/s and samples L × batch '
        'windows/s; at the costliest CPU per window measured above (any client count) that '
        f'is the "server cores" column. The {FASTER_LEARNER}× columns assume a learner (a GPU) '
        f'at {FASTER_LEARNER}× the single-process gradient steps alone: it needs that many '
        'more collectors and server cores, and its own input pipeline (Reverb\'s client '
        'receiving, unpacking and batching windows) needs "learner input cores" CPU cores at '
        'the sampling rate one core reached. Where that last column is above 1, sampling, not '
        'the gradient step, is what a faster learner must scale first.', '',
        f'{HELD_TITLE}:', '', _model_table(held), '',
        'The same model with each window inserted and sampled once (learner rate: the '
        '"learner holding the replay" of bench/learner_alone.py); "learner input cores" is '
        'then the learner\'s intake of L / r windows/s at the sampling rate one core reached. '
        'Frame windows stay on the server (no row).', '',
        'Not modelled: network bandwidth between machines (the MB/s column gives the traffic '
        'per server), and several servers (one table per server; see docs/distributed.md).', ''])


def update_distributed_doc(models, held=(), path=DISTRIBUTED_DOC):
    """Replaces the model tables between the markers in docs/distributed.md."""
    with open(path) as f:
        text = f.read()
    begin, end = text.find(BEGIN_MARK), text.find(END_MARK)
    if begin < 0 or end < begin:
        raise timing.BenchError(f'{path} has no {BEGIN_MARK} ... {END_MARK} block')
    block = f'{BEGIN_MARK}\n\n{_model_table(models)}\n\n'
    if held:
        block += f'{HELD_TITLE}:\n\n{_model_table(held)}\n\n'
    timing.write_doc(path, text[:begin] + block + text[end:])


def main(argv=None):
    return timing.standalone_main(section, __doc__, argv)


if __name__ == '__main__':
    import sys

    sys.exit(main())
