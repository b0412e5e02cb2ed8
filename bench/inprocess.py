"""Measuring inside one process: timed loops of a call, and the memory of a process.

Where a whole training process is too coarse (a buffer's sample call, a codec, one gradient
step), the measuring child times the call itself in a loop: after warm-up calls, so tracing,
XLA compilation and opening streams stay out, for a fixed number of calls or until a time budget
is spent. Memory is read from /proc: what the process really holds, allocator and TF overheads
included, not what a data structure claims.
"""

import os
import time


def timed_calls(call, *, calls=None, seconds=None, min_calls=3, warmup=1):
    """The seconds each timed `call()` took, after `warmup` untimed calls.

    Stops after `calls` calls, or once `seconds` have passed and at least `min_calls` were
    timed, whichever comes first. A call that loops over many items itself (calls=1,
    warmup=0) gives per-item costs of a few microseconds without a clock read per item.
    """
    for _ in range(warmup):
        call()
    times, start = [], time.perf_counter()
    while True:
        begin = time.perf_counter()
        call()
        end = time.perf_counter()
        times.append(end - begin)
        if calls is not None and len(times) >= calls:
            return times
        if seconds is not None and end - start >= seconds and len(times) >= min_calls:
            return times


def rate(call, units, **kwargs):
    """`units` per call over the timed calls of `call` (timed_calls' keywords), per second."""
    times = timed_calls(call, **kwargs)
    return units * len(times) / sum(times)


def rss_bytes(pid='self'):
    """Resident memory of a process now (Linux)."""
    with open(f'/proc/{pid}/statm') as statm:
        return int(statm.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def peak_rss_bytes(pid):
    """The most resident memory a process has had (VmHWM), or None once it is gone."""
    try:
        with open(f'/proc/{pid}/status') as status:
            for line in status:
                if line.startswith('VmHWM:'):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
