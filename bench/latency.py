"""Network latency between machines: the learner and a collector behind an added delay.

Roles on different machines talk to the replay server across a network; this measures
what a round trip of 1 and 5 ms costs them. The kernel's `netem` qdisc would delay the
loopback device, but this machine's kernel has none, so the delay is added in user space:
a TCP proxy (`delay_proxy`, pinned with the server to core 1) forwards every byte in both
directions after half the added round-trip time, in order, without limiting bandwidth.

For each workload the replay role is filled once (as in bench/learner_alone.py), then,
for each added delay (0 ms through the same proxy, so the proxy's own cost cancels):

- **learner**: the real learner role, pinned to core 0, reading and pushing weights
  through the proxy: its gradient steps/s after its first chunk, `ROUNDS` runs per delay
  (the delays taking turns), the median and the range of them;
- **learner holding the replay** (`distributed.settings.learner_holds_replay`): the same
  learner taking each window once from a second server's queue, filled anew (directly,
  not through the proxy) with every window of its run before each of its runs;
- **collector inserts**: random-policy env steps written through the proxy by the
  collector's own backend, pinned to core 0: env steps/s including the env.

In-flight samples (the learner's dataset requests ahead) and asynchronous writes (the
collector flushes every `flush_every` windows) should hide a few ms; a learner holding the
replay crosses the network only for each new window and its weight pushes.
"""

import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
import time

from bench import learner_alone, timing

WORKLOADS = [  # (name, config, transitions to fill, learner gradient steps)
    ('DQN CartPole', 'configs/dqn_cartpole.gin', 20_000, 12_000),
    ('SAC Pendulum', 'configs/sac_pendulum.gin', 20_000, 4_000),
]
DELAYS_MS = (0, 1, 5)
ROUNDS = 3  # learner runs per delay, the delays taking turns; the median counts
QUICK_SCALE = 0.2


def delay_proxy(listen_port, target_port, delay_ms):
    """Child: forwards localhost:listen_port <-> localhost:target_port, each way delay_ms / 2."""
    one_way = delay_ms / 2000.0

    async def pump(reader, writer):
        queue = asyncio.Queue()

        async def deliver():
            while True:
                due, data = await queue.get()
                if data is None:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
            writer.close()

        sender = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                queue.put_nowait((time.monotonic() + one_way, data))
        except ConnectionError:
            pass
        queue.put_nowait((0.0, None))
        await sender

    async def handle(client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection('localhost',
                                                                         target_port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(pump(client_reader, server_writer),
                             pump(server_reader, client_writer), return_exceptions=True)

    async def serve():
        server = await asyncio.start_server(handle, 'localhost', listen_port)
        print('listening', flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


def collector_rate(config, bindings, address, transitions):
    """Child: env steps/s of random-policy collection written (and confirmed) via `address`."""
    params, settings = learner_alone._load(config, bindings)
    import tensorflow as tf

    from experiment.distributed import common
    from experiment.loop import Collection
    from experiment.replay import Mode

    agent, _, tf_env = common.build_agent(params, seed=1)
    backend = common.remote_backend(Mode.COLLECTOR, params, settings, agent,
                                    num_envs=tf_env.batch_size, address=address, seed=1)
    env_steps = tf.Variable(0, dtype=tf.int64)
    collection = Collection(tf_env=tf_env, collect_policy=agent.collect_policy,
                            observers=[backend.add], env_steps=env_steps)
    chunk = tf.constant(64, tf.int32)
    collection.collect_random(chunk)  # tracing and the writer's first round trips
    backend.metrics()
    begin, start = int(env_steps.numpy()), time.perf_counter()
    while env_steps.numpy() - begin < transitions:
        collection.collect_random(chunk)
    backend.metrics()  # flushes: every window confirmed by the server
    return {'rate': (int(env_steps.numpy()) - begin) / (time.perf_counter() - start)}


def _start_proxy(target_port, delay_ms, log_dir):
    from experiment.distributed.cluster import free_port

    port = free_port()
    cmd = timing.pin_prefix('1') + timing.call_command('bench.latency.delay_proxy', port,
                                                        target_port, delay_ms)
    log = open(os.path.join(log_dir, f'proxy_{port}.log'), 'w')
    proc = subprocess.Popen(cmd, cwd=timing.REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    return proc, log, port


def _learner_rate(what, config, bindings, root, address, opts):
    """The real learner role on core 0 against `address`: its gradient steps/s."""
    return learner_alone._run_learner(what, config, bindings, root, address, opts)[
        'train_steps_per_sec']


def _fill(what, config, bindings, port, transitions, opts):
    timing.child_result(what, timing.call_command(
        'bench.learner_alone.fill_server', config, bindings, f'localhost:{port}', transitions),
        opts.log_dir)


def measure_workload(name, config, transitions, gradient_steps, opts):
    """{delay_ms: {learner, held, collector}} for one workload."""
    from experiment.distributed.cluster import free_port

    if opts.quick:
        transitions = max(2_000, int(transitions * QUICK_SCALE))
        gradient_steps = max(64, int(gradient_steps * QUICK_SCALE))
    params, _ = learner_alone._load(config, learner_alone._bindings([]))
    num_env_steps = params.initial_collect_steps + int(gradient_steps / params.replay_ratio)
    bindings = learner_alone._bindings([], num_env_steps)
    held_bindings = bindings + learner_alone.HELD
    root = tempfile.mkdtemp(prefix='bench-latency-')
    port, held_port = free_port(), free_port()
    server, server_log = learner_alone._start_server(config, bindings, root, port, opts.log_dir)
    held_server, held_log = learner_alone._start_server(
        config, held_bindings, os.path.join(root, 'held'), held_port, opts.log_dir)
    label = name.lower().replace(' ', '_')
    results = {}
    try:
        learner_alone._wait_for(f'localhost:{port}', server)
        learner_alone._wait_for(f'localhost:{held_port}', held_server)
        _fill(f'{label} fill', config, bindings, port, transitions, opts)
        learners = {delay: [] for delay in DELAYS_MS}
        held = {delay: [] for delay in DELAYS_MS}
        # Rounds over the delays in turn: a drift of the machine touches every delay alike.
        for round_ in range(1 if opts.quick else ROUNDS):
            for delay in DELAYS_MS:
                proxy, proxy_log, proxy_port = _start_proxy(port, delay, opts.log_dir)
                held_proxy, held_proxy_log, held_proxy_port = _start_proxy(
                    held_port, delay, opts.log_dir)
                address = f'localhost:{proxy_port}'
                try:
                    learner_alone._wait_for(address, proxy)
                    learner_alone._wait_for(f'localhost:{held_proxy_port}', held_proxy)
                    if round_ == 0:  # the collector's rate is steady: once per delay
                        results[delay] = {'collector': timing.child_result(
                            f'{label} collector {delay} ms', timing.pin_prefix('0') +
                            timing.call_command('bench.latency.collector_rate', config,
                                                bindings, address, transitions // 2),
                            opts.log_dir)['rate']}
                    learners[delay].append(_learner_rate(
                        f'{label} learner {delay} ms #{round_}', config, bindings,
                        os.path.join(root, f'delay_{delay}_{round_}'), address, opts))
                    # The queue is taken once: every window of the held learner's run anew.
                    _fill(f'{label} fill queue {delay} ms #{round_}', config, held_bindings,
                          held_port, num_env_steps, opts)
                    held[delay].append(_learner_rate(
                        f'{label} learner holding the replay {delay} ms #{round_}', config,
                        held_bindings, os.path.join(root, f'held_{delay}_{round_}'),
                        f'localhost:{held_proxy_port}', opts))
                finally:
                    learner_alone.stop(proxy, proxy_log)
                    learner_alone.stop(held_proxy, held_proxy_log)
        for delay in DELAYS_MS:
            results[delay].update(learner=learners[delay], held=held[delay])
    finally:
        learner_alone.stop(server, server_log)
        learner_alone.stop(held_server, held_log)
        shutil.rmtree(root, ignore_errors=True)
    return name, results


def section(opts):
    rows = [measure_workload(*workload, opts) for workload in WORKLOADS]
    return render(rows, opts)


def render(rows, opts):
    headers = ['workload', 'measured'] + [f'+{d} ms round trip' for d in DELAYS_MS] + \
        [f'ratio at {DELAYS_MS[-1]} ms']
    table = []
    for name, results in rows:
        for key, who in (('learner', 'learner'), ('held', 'learner holding the replay')):
            runs = [results[d][key] for d in DELAYS_MS]
            medians = [statistics.median(values) for values in runs]
            table.append([name, f'{who}, gradient steps/s (median)'] +
                         [f'{m:,.0f}' for m in medians] + [f'{medians[-1] / medians[0]:.2f}×'])
            table.append([name, f'{who}, range of its runs'] +
                         [f'{min(values):,.0f}–{max(values):,.0f}' for values in runs] + [''])
        values = [results[d]['collector'] for d in DELAYS_MS]
        table.append([name, 'collector, env steps/s written'] + [f'{v:,.0f}' for v in values]
                     + [f'{values[-1] / values[0]:.2f}×'])
    return '\n'.join([
        '## Latency between machines: the learner and a collector behind an added delay', '',
        f'Written by `python -m bench.latency{" --quick" if opts.quick else ""}` (a `make '
        f'bench` section) on {timing.cpu_model()}; do not edit by hand. The kernel here has no '
        '`netem`, so a user-space TCP proxy adds the round trip (half each way); the 0 ms '
        'column goes through the same proxy. Learner and collector pinned to core 0, servers and '
        'proxies to core 1; the learner holding the replay '
        '(`distributed.settings.learner_holds_replay`) takes each window once from its own '
        'server\'s queue, filled before each of its runs. Each learner ran '
        f'{1 if opts.quick else ROUNDS} time(s) per delay, the '
        'delays taking turns; its ratio is of the medians. Bar: the learner keeps ≥ 0.9× its '
        '0 ms rate at 5 ms.', '',
        timing.markdown_table(headers, table, 'll' + 'r' * (len(headers) - 2)), ''])


def main(argv=None):
    return timing.standalone_main(section, __doc__, argv)


if __name__ == '__main__':
    import sys

    sys.exit(main())
