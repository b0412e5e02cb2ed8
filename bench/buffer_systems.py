"""The measuring side of the replay-buffer benchmark: one system and data kind per process.

`bench/buffers.py` runs `measure` once per (system, data kind) in a fresh interpreter
(`timing.call_command`), pinned like every other benchmark run, and reads its JSON back. Alone:

    taskset -c 0 .venv/bin/python -c \
        "from bench.buffer_systems import measure; print(measure('uniform', 'image'))"

Why a process each: image buffers hold ~2.8 GB, Reverb servers and tf.data
iterators keep threads, Reverb tables' memory is read from the process RSS,
and TF-Agents' `ReverbReplayBuffer` must be built only once per process (see
`TfaReverbSystem._dataset`), so every run starts from a clean interpreter.
What each number means is written out in the section's text, `buffers.render`.
"""

import gc
import math
import sys
import time

import numpy as np

from bench import inprocess
from bench.buffer_adapters import CAPACITY, NUM_ENVS, Stream, build

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


def measure(name, kind, quick=False, insert_only=False):
    """Every measurement of system `name` on data `kind`; returns a JSON-able dict.

    `insert_only`: only the 32-env insert rate, one of the interleaved repeats
    `bench/buffers.py` pairs.
    """
    budget = QUICK if quick else FULL
    seconds = budget['seconds']
    result = {'obs_bytes': Stream(kind, 1).obs_bytes}

    if not insert_only:
        system = build(name, kind, 1)
        result['insert_1'], _ = measure_insert(system, seconds)
        log(f'{name}/{kind}: insert, 1 env: {result["insert_1"]:,.0f} transitions/s')
        system.close()
        del system
        gc.collect()

    rss_before = inprocess.rss_bytes()
    system = build(name, kind, NUM_ENVS)
    result['insert_32'], written = measure_insert(system, seconds)
    log(f'{name}/{kind}: insert, {NUM_ENVS} envs: {result["insert_32"]:,.0f} transitions/s')
    if insert_only:
        system.close()
        return result
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
