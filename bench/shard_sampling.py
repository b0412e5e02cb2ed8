"""Sampling one buffer from K replay shards: what the learner's pipeline gets from 1, 2, 4.

Each shard is the real replay role (`train.py --role=replay --shard=i`, all pinned to core
1), filled with its share of the same windows; one learner pipeline (pinned to core 0)
drains stacked batches without training, through `ShardedReplay` (buffers/reverb/shards.py)
for K > 1 and the one-server backend for K = 1, as the learner builds them. Read between a
common start and stop: the windows the pipeline received per second, and the shards' CPU
per 1,000 windows sampled (all servers together). On this 2-core machine every shard shares
one core, so this measures what mixing costs the learner, not what more server cores give;
docs/scaling.md says when a server core is the limit.
"""

import os
import shutil
import subprocess
import tempfile
import time

from bench import learner_alone, server_capacity, timing

CONFIG = 'configs/dqn_cartpole.gin'  # CartPole-sized windows: the server-bound case
NAME = 'CartPole-sized windows (DQN CartPole)'
SHARDS = (1, 2, 4)
TRANSITIONS = 20_000  # the whole buffer, split over the shards


def _start_shards(count, bindings, root, log_dir):
    from experiment.distributed.cluster import free_port

    ports = [free_port() for _ in range(count)]
    addresses = ','.join(f'localhost:{port}' for port in ports)
    servers = []
    for shard, port in enumerate(ports):
        cmd = timing.pin_prefix('1') + [
            timing.python(), 'train.py', '--role=replay', f'--root_dir={root}',
            f'--replay_address={addresses}', f'--shard={shard}', '--bind_all_interfaces',
            *learner_alone._gin_args(CONFIG, bindings)]
        log = open(os.path.join(log_dir, f'shard_{count}_{shard}.log'), 'w')
        servers.append((subprocess.Popen(cmd, cwd=timing.REPO_ROOT, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True),
                        log))
    return addresses, servers


def measure_shards(count, opts):
    """{shards, windows_per_sec, cpu_ms_per_1000} for one learner pipeline over `count` shards."""
    bindings = learner_alone._bindings([f'distributed.settings.replay_shards={count}'])
    root = tempfile.mkdtemp(prefix='bench-shards-')
    addresses, servers = _start_shards(count, bindings, root, opts.log_dir)
    try:
        for address, (server, _) in zip(addresses.split(','), servers):
            learner_alone._wait_for(address, server)
            timing.child_result(f'shard {address} fill', timing.call_command(
                'bench.learner_alone.fill_server', CONFIG, bindings, address,
                TRANSITIONS // count), opts.log_dir)
        print(f'  [{time.strftime("%H:%M:%S")}] sampling from {count} shard(s)', flush=True)
        phase = server_capacity.measure_phase(
            'sample', 1, CONFIG, bindings, addresses, [server.pid for server, _ in servers],
            4 if opts.quick else 15, opts.log_dir)
    finally:
        for server, log in servers:
            learner_alone.stop(server, log)
        shutil.rmtree(root, ignore_errors=True)
    return {'shards': count, **phase}


def section(opts):
    results = [measure_shards(count, opts) for count in (SHARDS[:2] if opts.quick else SHARDS)]
    one = results[0]['windows_per_sec']
    rows = [[str(r['shards']), f"{r['windows_per_sec']:,.0f}",
             f"{r['windows_per_sec'] / one:.2f}x", f"{r['cpu_ms_per_1000']:,.1f}",
             f"{r['busy']:.0%}"] for r in results]
    return '\n'.join([
        '## Sampling one buffer from K replay shards', '',
        f'{NAME}, {TRANSITIONS:,} windows split evenly over K shards (replay roles, all pinned '
        'to core 1); one learner pipeline pinned to core 0 drains stacked batches without '
        'training (`ShardedReplay` for K > 1: one stream per shard, mixed by sampling mass; '
        'the one-server backend for K = 1). Windows/s is what the shards served (their '
        'sampled counters); "vs 1" compares with one server. With every shard on one core, '
        'this is the cost of mixing on the learner\'s side, not the gain of more server '
        'cores; see [scaling](scaling.md) for when one server core is the limit.', '',
        timing.markdown_table(['shards', 'windows/s', 'vs 1', 'server CPU ms per 1,000 windows',
                               'server core busy'], rows, 'lrrrr'), ''])
