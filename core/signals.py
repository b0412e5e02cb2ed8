"""The one stop mechanism of every process: SIGINT and SIGTERM request a stop.

A training process, a distributed role or a sweep trial finishes its current
step, saves and exits when asked to stop. SIGTERM
is what Slurm preemption, Kubernetes, `docker stop` and `timeout` send, so it is
treated exactly like Ctrl-C.

Python runs signal handlers only in the main thread, between bytecodes -- never
while the main thread waits inside TensorFlow or Reverb (a rate-limited write
can last a minute). So the signal number is also written to a wakeup pipe at C
level, and a thread reading it sets the stop flag at once, where a watchdog
thread can see it.
"""

import os
import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_SECOND_SIGNAL = 130


class StopSignal:
    """A stop flag (`requested`, `event`) set by SIGINT or SIGTERM while installed.

    Use as a context manager (or `install()` / `restore()`). Outside the main
    thread signals cannot be caught; the flag then only changes through `set()`.
    """

    def __init__(self, *, on_signal=None, second_signal_exits=False):
        """Creates the flag.

        Args:
          on_signal: optional `callable(signal_name, first)` called from the
            signal-reading thread, e.g. to log "SIGTERM: stopping".
          second_signal_exits: a second signal ends the process at once
            (status 130). Off for training runs: a terminal's Ctrl-C reaches a
            sweep's trials and the sweep forwards one more, and that must not
            cost the trial its checkpoint.
        """
        self._second_signal_exits = second_signal_exits
        self.event = threading.Event()
        self._on_signal = on_signal
        self._previous = {}
        self._previous_wakeup = None
        self._read_fd = None

    @property
    def requested(self):
        return self.event.is_set()

    def set(self):
        self.event.set()

    def wait(self, seconds):
        """Sleeps up to `seconds`; True as soon as a stop is requested."""
        return self.event.wait(seconds)

    def install(self):
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        try:
            self._previous_wakeup = signal.set_wakeup_fd(write_fd)
        except ValueError:  # not the main thread (tests): leave signals alone
            os.close(read_fd)
            os.close(write_fd)
            return self
        for signum in SIGNALS:
            # A Python-level handler must exist for the C handler to write the pipe;
            # the reading thread does the work.
            self._previous[signum] = signal.signal(signum, _deferred_handler)
        self._read_fd = read_fd
        threading.Thread(target=self._read_signals, args=(read_fd,), daemon=True,
                         name='stop-signals').start()
        return self

    def restore(self):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
        if self._previous_wakeup is not None:
            write_fd = signal.set_wakeup_fd(self._previous_wakeup)
            self._previous_wakeup = None
            if write_fd >= 0:
                os.close(write_fd)  # ends the reading thread (its read returns)

    def __enter__(self):
        return self.install()

    def __exit__(self, *exc):
        self.restore()

    def _read_signals(self, read_fd):
        while True:
            try:
                data = os.read(read_fd, 64)
            except OSError:
                return
            if not data:
                os.close(read_fd)
                return
            for signum in data:
                if signum in SIGNALS:
                    self._handle(signum)

    def _handle(self, signum):
        name = signal.Signals(signum).name
        first = not self.event.is_set()
        if self._on_signal is not None:
            self._on_signal(name, first)
        if not first and self._second_signal_exits:
            os._exit(EXIT_SECOND_SIGNAL)
        self.event.set()


def _deferred_handler(signum, frame):
    """Runs (late) in the main thread; `StopSignal._read_signals` has already acted."""
    del signum, frame
