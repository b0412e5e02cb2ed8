"""One console line at a time: env step, last eval return, speed, ETA.

The speed is training speed: the first chunk of each process (tracing and XLA
compilation) and the time spent in evaluation, videos and checkpoints
(`paused`) are left out of it, so the ETA is not inflated by one-off work.
"""

import contextlib
import datetime
import time

_MIN_SECONDS_BETWEEN_LINES = 10.0


class Progress:
    """Prints progress lines; at most one every 10 s unless an eval just ran."""

    def __init__(self, total_steps, *, start_step=0, enabled=True, unit='env steps'):
        self._total = total_steps
        self._unit = unit
        self._enabled = enabled
        self._start = time.perf_counter()
        self._lap_start = self._start
        self._last_line = self._start
        self._last_step = start_step
        self._last_time = self._start
        self._paused_since = None

    def elapsed(self):
        return time.perf_counter() - self._start

    def lap(self):
        """Seconds since the previous lap (or the start): for accumulating wall time."""
        now = time.perf_counter()
        seconds, self._lap_start = now - self._lap_start, now
        return seconds

    def restart_rate(self, step):
        """Measures speed from here on (after the first, compiling chunk)."""
        self._last_step, self._last_time = step, time.perf_counter()

    @contextlib.contextmanager
    def paused(self):
        """Time inside is not training time: it counts toward neither speed nor ETA."""
        start = self._paused_since = time.perf_counter()
        try:
            yield
        finally:
            self._paused_since = None
            self._last_time += time.perf_counter() - start

    def maybe_line(self, step, eval_return):
        if (step > self._last_step
                and time.perf_counter() - self._last_line >= _MIN_SECONDS_BETWEEN_LINES):
            self.line(step, eval_return)

    def line(self, step, eval_return):
        now = self._paused_since or time.perf_counter()
        rate = (step - self._last_step) / max(now - self._last_time, 1e-9)
        self._last_step, self._last_time, self._last_line = step, now, now
        if not self._enabled:
            return
        eval_text = '   n/a' if eval_return is None else f'{eval_return:8.1f}'
        eta, rate_text = '--:--:--', '     --'
        if rate > 0:
            eta = str(datetime.timedelta(seconds=int((self._total - step) / rate)))
            rate_text = f'{rate:7,.0f}'
        print(f'step {step:>10,}/{self._total:,} | eval return {eval_text} | '
              f'{rate_text} {self._unit}/s | ETA {eta}', flush=True)
