"""The measuring side of the replay-buffer benchmark: one system and data kind per process.

`bench/buffers.py` runs this module once per (system, data kind), pinned like
every other benchmark run, and reads one JSON line back:

    taskset -c 0 .venv/bin/python -m bench.buffer_systems --system uniform --kind image [--quick]

Why a process each: image buffers hold ~2.8 GB, Reverb servers and tf.data
iterators keep threads, Reverb tables' memory is read from the process RSS,
and TF-Agents' `ReverbReplayBuffer` must be built only once per process (see
`TfaReverbSystem._dataset`), so every run starts from a clean interpreter.
What each number means is written out in the section's text, `buffers.render`.
"""

import argparse
import gc
import json
import math
import os
import sys
import time

import numpy as np

from bench import inprocess
from bench.buffer_adapters import CAPACITY, KINDS, NUM_ENVS, SYSTEMS, Stream, build

# Transitions in each buffer before sampling. Reverb tables get fewer: they take
# items at a few thousand per second, and their samplers' cost does not grow
# with the table's size.
FULL = {'seconds': 1.0, 'latency_s': 1.0, 'latency_calls': (100, 500),
        'fill': {'vector': 100_000, 'image': 50_000}, 'reverb_fill': 20_000}
QUICK = {'seconds': 0.25, 'latency_s': 0.25, 'latency_calls': (20, 100),
         'fill': {'vector': 5_000, 'image': 2_000}, 'reverb_fill': 2_000}


def log(message):
    print(f'  [{time.strftime("%H:%M:%S")}] {message}', file=sys.stderr, flush=True)


def measure_insert(system, seconds):
    """Transitions/s of `system.insert`, in calls sized to ~1/5 of `seconds`.

    Returns (transitions per second, steps written so far).
    """
    system.insert(0, 4)  # traces
    [calibration] = inprocess.timed_calls(lambda: system.insert(4, 16), calls=1, warmup=0)
    chunk = max(1, int(seconds / 5 / max(calibration / 16, 1e-7)))
    written = [20]

    def insert():
        system.insert(written[0], chunk)
        written[0] += chunk
    times = inprocess.timed_calls(insert, seconds=seconds, min_calls=1, warmup=0)
    return chunk * len(times) * system.stream.num_envs / sum(times), written[0]


def measure_insert_only(name, kind, budget):
    """Only the 32-env insert rate: one of the interleaved repeats `bench/buffers.py` pairs."""
    system = build(name, kind, NUM_ENVS)
    rate, _ = measure_insert(system, budget['seconds'])
    log(f'{name}/{kind}: insert, {NUM_ENVS} envs: {rate:,.0f} transitions/s')
    system.close()
    return {'obs_bytes': Stream(kind, 1).obs_bytes, 'insert_32': rate}


def measure_kind(name, kind, budget):
    """Every measurement of system `name` on data `kind`; returns a JSON-able dict."""
    seconds = budget['seconds']
    result = {'obs_bytes': Stream(kind, 1).obs_bytes}

    system = build(name, kind, 1)
    result['insert_1'], _ = measure_insert(system, seconds)
    log(f'{name}/{kind}: insert, 1 env: {result["insert_1"]:,.0f} transitions/s')
    system.close()
    del system
    gc.collect()

    rss_before = inprocess.rss_bytes()
    system = build(name, kind, NUM_ENVS)
    if hasattr(system, 'capacity_episodes'):
        result['capacity_episodes'] = system.capacity_episodes
    result['insert_32'], written = measure_insert(system, seconds)
    log(f'{name}/{kind}: insert, {NUM_ENVS} envs: {result["insert_32"]:,.0f} transitions/s')
    target = min(budget['reverb_fill'] if 'reverb' in name else budget['fill'][kind], CAPACITY)
    start = time.perf_counter()
    steps = math.ceil(target / NUM_ENVS)
    chunk = 256
    while written < steps:
        system.insert(written, min(chunk, steps - written))
        written = min(written + chunk, steps)
    result['fill_s'] = time.perf_counter() - start
    result['filled'] = min(written * NUM_ENVS, CAPACITY)
    memory, how = system.memory(result['filled'], inprocess.rss_bytes() - rss_before)
    result['bytes_per_transition'], result['memory_method'] = memory, how
    log(f'{name}/{kind}: filled to {result["filled"]:,} transitions in {result["fill_s"]:.1f} s')

    result['sample'] = {}
    for label, call, units in system.read_paths():
        result['sample'][label] = inprocess.rate(call, units, seconds=seconds)
        log(f'{name}/{kind}: {label}: {result["sample"][label]:,.0f} windows/s')
    low, high = budget['latency_calls']
    times = 1e3 * np.array(inprocess.timed_calls(system.sample_once, calls=high, warmup=3,
                                                 seconds=budget['latency_s'], min_calls=low))
    p50, p99, count = float(np.percentile(times, 50)), float(np.percentile(times, 99)), len(times)
    result['latency_ms'] = {'p50': p50, 'p99': p99, 'calls': count}
    log(f'{name}/{kind}: latency p50 {p50:.2f} ms, p99 {p99:.2f} ms ({count} calls)')
    result['update'] = {}
    for label, call, units in system.update_paths():
        result['update'][label] = inprocess.rate(call, units, seconds=seconds)
        log(f'{name}/{kind}: {label}: {result["update"][label]:,.0f} keys/s')
    system.close()
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--system', required=True, choices=SYSTEMS)
    parser.add_argument('--kind', action='append', choices=KINDS,
                        help='Data kind (repeatable; default: all).')
    parser.add_argument('--quick', action='store_true', help='Shrink fills and timings.')
    parser.add_argument('--insert_only', action='store_true',
                        help=f'Measure only the insert rate with {NUM_ENVS} envs.')
    opts = parser.parse_args(argv)
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
    budget = QUICK if opts.quick else FULL
    started = time.perf_counter()
    results = {'system': opts.system, 'affinity': sorted(os.sched_getaffinity(0)), 'kinds': {}}
    for kind in opts.kind or KINDS:
        measure = measure_insert_only if opts.insert_only else measure_kind
        results['kinds'][kind] = measure(opts.system, kind, budget)
    results['wall_s'] = time.perf_counter() - started
    print('RESULT ' + json.dumps(results), flush=True)
    sys.stderr.flush()
    # Skip interpreter finalization: tf.data iterators and Reverb clients can
    # block it for seconds (see the DQN section's notes); everything is printed.
    os._exit(0)


if __name__ == '__main__':
    main()
