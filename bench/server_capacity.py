"""What one Reverb replay server absorbs: inserts and samples from 1, 2 and 4 client processes.

The server is the real replay role (`train.py --role=replay`, pinned to core 1) with the
rate limiter opened wide; the clients are processes pinned together to core 0, so the
server has a core to itself. Each client builds the run's own backend, as a collector or
as the learner does, and is measured only between a common start and stop:

- **insert**: a collector's backend writing pre-recorded env steps (the env is stepped
  once, before the clock starts, so the client spends its core on writing, frame
  compression included, not on the env);
- **sample**: the learner's stacked-batch pipeline drained without training (Atari
  frames decoded from LZ4 and stacked, as the learner gets them).

Read from the server between start and stop: windows/s (its own inserted and sampled
counters), MB/s (bytes through the loopback device: the wire, TCP headers included) and
the server process's CPU time per 1,000 windows. Where the server's core is not busy
the whole time, the clients' core is the limit, and the server could take
`1,000 / (CPU ms per 1,000 windows)` windows/s on one core: the capacity column.
"""

import json
import os
import shutil
import subprocess
import tempfile
import time

from bench import learner_alone, timing

WINDOWS = [  # (name, config, transitions pre-filled before sampling)
    ('CartPole-sized windows (DQN CartPole)', 'configs/dqn_cartpole.gin', 20_000),
    ('Atari frame windows, LZ4 (DQN Pong)', 'configs/dqn_atari.gin', 5_000),
]
CLIENTS = (1, 2, 4)
RECORDED_STEPS = 64  # env steps each insert client records, then writes over and over
READY_TIMEOUT_S = 300  # four clients importing TF on one core take about a minute


def _wait_for_file(path, timeout_s=READY_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f'{path} did not appear in {timeout_s} s')
        time.sleep(0.001)


def _measured(sync_dir, index, call, windows_per_call):
    """Signals ready, runs `call` from 'go' until 'stop'; the windows it handled in between."""
    open(os.path.join(sync_dir, f'ready_{index}'), 'w').close()
    _wait_for_file(os.path.join(sync_dir, 'go'))
    stop, windows = os.path.join(sync_dir, 'stop'), 0
    while not os.path.exists(stop):
        call()
        windows += windows_per_call
    return {'windows': windows}


def insert_client(config, bindings, address, sync_dir, index):
    """Child: writes pre-recorded env steps through a collector's backend until told to stop."""
    params, settings = learner_alone._load(config, bindings)
    import numpy as np
    import tensorflow as tf

    from experiment.distributed import common
    from experiment.loop import Collection
    from experiment.replay import Mode

    agent, _, tf_env = common.build_agent(params, seed=index)
    backend = common.remote_backend(Mode.COLLECTOR, params, settings, agent,
                                    num_envs=tf_env.batch_size, address=address, seed=index)
    recorded = []

    def record(*leaves):
        recorded.append([np.array(leaf) for leaf in leaves])

    def recorder(transition):
        tf.numpy_function(record, tf.nest.flatten(transition), Tout=[], stateful=True)

    collection = Collection(tf_env=tf_env, collect_policy=agent.collect_policy,
                            observers=[recorder], env_steps=tf.Variable(0, dtype=tf.int64))
    collection.collect_random(tf.constant(RECORDED_STEPS, tf.int32))
    spec = backend.data_spec
    stacked = [tf.constant(np.stack(leaves)) for leaves in zip(*recorded)]

    @tf.function
    def write_recorded():
        for step in tf.range(len(recorded)):
            backend.add(tf.nest.pack_sequence_as(spec, [leaf[step] for leaf in stacked]))

    write_recorded()  # tracing and the writer's first round trips
    backend.metrics()  # flushes
    result = _measured(sync_dir, index, write_recorded, len(recorded) * tf_env.batch_size)
    backend.metrics()
    return result


def sample_client(config, bindings, address, sync_dir, index):
    """Child: drains the learner's stacked-batch pipeline until told to stop."""
    params, settings = learner_alone._load(config, bindings)
    from experiment.distributed import common
    from experiment.loop import Training
    from experiment.replay import Mode, num_steps_of

    agent, _, tf_env = common.build_agent(params, seed=index)
    shards = [common.remote_backend(Mode.LEARNER, params, settings, agent,
                                    num_envs=tf_env.batch_size, address=shard, seed=index)
              for shard in address.split(',')]
    if len(shards) == 1:
        backend = shards[0]
    else:  # replay shards (bench/shard_sampling.py): mixed as the learner mixes them
        from buffers.reverb.shards import ShardedReplay
        backend = ShardedReplay(shards, seed=index)
    steps = settings.learner_steps_per_call
    training = Training(agent=agent, backend=backend, batch_size=params.batch_size,
                        num_steps=num_steps_of(agent), train_steps=steps, use_xla=False)
    batches = iter(training.stacked_dataset(
        backend.as_dataset(params.batch_size, num_steps_of(agent))))
    for _ in range(2):
        batches.get_next()
    return _measured(sync_dir, index, batches.get_next, steps * params.batch_size)


def _server_cpu_s(pid):
    """User + system CPU seconds of process `pid` and all its threads so far."""
    with open(f'/proc/{pid}/stat') as stat:
        fields = stat.read().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def _loopback_bytes():
    with open('/proc/net/dev') as dev:
        for line in dev:
            name, _, counts = line.partition(':')
            if name.strip() == 'lo':
                return int(counts.split()[0])
    raise timing.BenchError('no loopback device in /proc/net/dev')


def _server_counters(address):
    """The replay table's counters, summed over every server of a comma-separated list."""
    import reverb

    from experiment.distributed.common import replay_counters
    shards = [replay_counters(reverb.Client(one).server_info(10))
              for one in address.split(',')]
    return {name: sum(shard[name] for shard in shards)
            for name in ('size', 'inserted', 'sampled')}


def _reading(address, pids):
    """Counters of the server(s) at `address`, and the CPU time of the process(es) `pids`."""
    pids = pids if isinstance(pids, (list, tuple)) else [pids]
    return {'time': time.monotonic(), 'cpu_s': sum(_server_cpu_s(pid) for pid in pids),
            'lo': _loopback_bytes(), **_server_counters(address)}


def measure_phase(kind, clients, config, bindings, address, server_pid, seconds, log_dir):
    """Runs `clients` clients of `kind` ('insert' or 'sample') together; the server's numbers.

    `address` may list several servers (replay shards) and `server_pid` be their pids.
    """
    sync_dir = tempfile.mkdtemp(prefix='bench-capacity-')
    procs = []
    try:
        for index in range(clients):
            log_path = os.path.join(log_dir, f'{kind}_{clients}_clients_{index}.log')
            with open(log_path, 'w') as log:
                cmd = timing.pin_prefix('0') + timing.call_command(
                    f'bench.server_capacity.{kind}_client', config, bindings, address,
                    sync_dir, index)
                procs.append((subprocess.Popen(cmd, cwd=timing.REPO_ROOT, stdout=log,
                                               stderr=subprocess.STDOUT), log_path))
        deadline = time.monotonic() + READY_TIMEOUT_S
        while len([n for n in os.listdir(sync_dir) if n.startswith('ready_')]) < clients:
            failed = [path for proc, path in procs if proc.poll() is not None]
            if failed or time.monotonic() > deadline:
                raise timing.BenchError(f'{kind} client did not get ready (log: '
                                        f'{(failed or [procs[0][1]])[0]})')
            time.sleep(0.05)
        before = _reading(address, server_pid)
        open(os.path.join(sync_dir, 'go'), 'w').close()
        time.sleep(seconds)
        after = _reading(address, server_pid)
        open(os.path.join(sync_dir, 'stop'), 'w').close()
        client_windows = 0
        for proc, log_path in procs:
            if proc.wait(timeout=120) != 0:
                raise timing.BenchError(f'{kind} client failed (log: {log_path})')
            with open(log_path) as log:
                found = [line for line in log if line.startswith(timing.RESULT)]
            if not found:
                raise timing.BenchError(f'{kind} client printed no result (log: {log_path})')
            client_windows += json.loads(found[-1][len(timing.RESULT):])['windows']
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(sync_dir, ignore_errors=True)
    elapsed = after['time'] - before['time']
    counter = 'inserted' if kind == 'insert' else 'sampled'
    windows = after[counter] - before[counter]
    cpu_s = after['cpu_s'] - before['cpu_s']
    return {'kind': kind, 'clients': clients, 'windows_per_sec': windows / elapsed,
            'mb_per_sec': (after['lo'] - before['lo']) / elapsed / 1e6,
            'cpu_ms_per_1000': 1e6 * cpu_s / max(windows, 1), 'busy': cpu_s / elapsed,
            'client_windows': client_windows}


def measure_windows(name, config, transitions, opts):
    """Every phase for one window kind, against one fresh server."""
    from experiment.distributed.cluster import free_port

    seconds = 4 if opts.quick else 15
    clients = CLIENTS[:2] if opts.quick else CLIENTS
    bindings = learner_alone._bindings([])
    root = tempfile.mkdtemp(prefix='bench-capacity-')
    port = free_port()
    address = f'localhost:{port}'
    server, log = learner_alone._start_server(config, bindings, root, port, opts.log_dir)
    phases = []
    try:
        learner_alone._wait_for(address, server)
        for count in clients:
            print(f'  [{time.strftime("%H:%M:%S")}] {name}: insert, {count} clients',
                  flush=True)
            phases.append(measure_phase('insert', count, config, bindings, address, server.pid,
                                        seconds, opts.log_dir))
        inserted = _server_counters(address)['size']
        if inserted < transitions:  # the insert phases left too little to sample from
            timing.child_result(f'{name} fill', timing.call_command(
                'bench.learner_alone.fill_server', config, bindings, address,
                transitions - inserted), opts.log_dir)
        for count in clients:
            print(f'  [{time.strftime("%H:%M:%S")}] {name}: sample, {count} clients',
                  flush=True)
            phases.append(measure_phase('sample', count, config, bindings, address, server.pid,
                                        seconds, opts.log_dir))
    finally:
        learner_alone.stop(server, log)
        shutil.rmtree(root, ignore_errors=True)
    return {'name': name, 'phases': phases}


def measure(opts):
    return [measure_windows(*windows, opts) for windows in WINDOWS]


def capacity(phase):
    """Windows/s the server could take on one whole core at this phase's CPU cost."""
    return 1e6 / phase['cpu_ms_per_1000']


def render(results):
    rows = []
    for result in results:
        for phase in result['phases']:
            rows.append([result['name'], phase['kind'], str(phase['clients']),
                         f"{phase['windows_per_sec']:,.0f}", f"{phase['mb_per_sec']:,.1f}",
                         f"{phase['cpu_ms_per_1000']:,.1f}", f"{phase['busy']:.0%}",
                         f"{capacity(phase):,.0f}"])
    return '\n'.join([
        '## What one Reverb replay server absorbs', '',
        'The server (the replay role) pinned to '
        'core 1, every client process to core 0; the rate limiter open wide. Windows/s and '
        'CPU are the server\'s own counters; MB/s is the loopback device\'s bytes (the wire). '
        '"Server core busy" below 100% means the clients\' one core was the limit; the last '
        'column is then what the server would take on a whole core at the CPU cost measured.',
        '',
        timing.markdown_table(
            ['windows', 'clients do', 'client processes', 'windows/s', 'MB/s',
             'server CPU ms per 1,000 windows', 'server core busy',
             'one server core could take, windows/s'], rows, 'lllrrrrr'),
        ''])
