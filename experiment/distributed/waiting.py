"""Bounded waiting: log lines, retry with backoff, a watchdog, and a stop flag.

A distributed run fails in ways a single process never does: a peer is
restarting, the rate limiter holds a call until another role catches up, a
server vanished. None of these may become a silent hang. So every call to
another process goes through `retry` (finite timeout per try, exponential
backoff, one log line per failure naming who waits on whom), and every
blocking section runs under `Watchdog.waiting`, which logs while it lasts
and ends the process if it outlasts `give_up_after_s` -- the last resort
for calls that have no timeout of their own (Reverb's datasets reconnect
forever while a server is down).
"""

import contextlib
import faulthandler
import os
import re
import signal
import sys
import threading
import time

import reverb
import tensorflow as tf

from core.errors import UserError
from core.signals import StopSignal

EXIT_GAVE_UP = 3
# Errors a peer's absence or a rate limiter's hold can raise (Reverb raises
# RuntimeError for gRPC failures and DeadlineExceededError for timeouts).
TRANSIENT = (RuntimeError, ConnectionError, TimeoutError, tf.errors.OpError,
             reverb.errors.ReverbError)


class Stopped(Exception):
    """The role was asked to stop (SIGINT/SIGTERM) while waiting."""


def one_line(error):
    """`Type: message` on one line, without the Python traceback TF embeds in the message of
    an error raised inside `tf.numpy_function` (a Reverb write) or the `{{function_node}}` tag."""
    text = ' '.join(str(error).split())
    text = text.split(' Traceback (most recent call last)')[0]
    text = re.sub(r'\{\{function_node [^}]*\}\}\s*', '', text)
    return f"{type(error).__name__}: {text[:200]}" if text else type(error).__name__


class Role:
    """A role's name, log and stop flag; SIGINT and SIGTERM set the flag (`core.signals`).

    Roles finish their current step and save before exiting, so signals only
    request a stop; a second signal exits at once.
    """

    def __init__(self, name, *, give_up_after_s=600.0, report_every_s=10.0):
        self.name = name
        self.give_up_after_s = give_up_after_s
        self.report_every_s = report_every_s
        self._signals = StopSignal(on_signal=self._said, second_signal_exits=True)
        self.stop = self._signals.event

    def log(self, message):
        print(f"{time.strftime('%H:%M:%S')} [{self.name}] {message}", flush=True)

    def _said(self, name, first):
        self.log(f"{name}: stopping after the current step." if first else
                 f"{name} again: exiting at once.")

    def install_signal_handlers(self):
        self._signals.install()
        # `kill -USR1 <pid>` writes every thread's stack to the role's log: what a role
        # that seems stuck is waiting on.
        faulthandler.register(signal.SIGUSR1, all_threads=True)

    def restore_signal_handlers(self):
        self._signals.restore()

    def sleep(self, seconds):
        """Sleeps unless asked to stop; raises `Stopped` if it was."""
        if self.stop.wait(seconds):
            raise Stopped()


def retry(role, call, *, what, whom, timeout_s, first_delay_s=0.5, max_delay_s=8.0,
          transient=TRANSIENT):
    """Calls `call()` until it succeeds, backing off; gives up after `role.give_up_after_s`.

    Args:
      role: the `Role` (log, stop flag, give-up deadline).
      call: a callable whose own waits are bounded by `timeout_s`.
      what: what the call does, for the log ("pulling weights").
      whom: whom it waits on ("the replay server at localhost:8000").
      timeout_s: the bound of one try, shown in the log.
      first_delay_s: the first backoff; doubled after each failure.
      max_delay_s: the largest backoff.
      transient: exception types worth retrying.

    Returns:
      What `call()` returned.

    Raises:
      Stopped: the role was asked to stop while retrying (a stopping role
        still makes one try, so that it can save or push on its way out).
      UserError: still failing after `give_up_after_s`.
    """
    start = time.monotonic()
    delay = first_delay_s
    failures = 0
    while True:
        try:
            result = call()
        except transient as error:
            failures += 1
            waited = time.monotonic() - start
            if waited >= role.give_up_after_s:
                raise UserError(
                    f"{role.name} gave up {what} after {waited:.0f} s ({failures} tries of "
                    f"{timeout_s:g} s) waiting on {whom}: {one_line(error)}. Is it running and "
                    "reachable?") from None
            role.log(f"waiting on {whom}: {what} failed ({one_line(error)}); retry {failures} "
                     f"in {delay:.1f} s (waited {waited:.0f} s, giving up after "
                     f"{role.give_up_after_s:.0f} s)")
            role.sleep(delay)
            delay = min(2 * delay, max_delay_s)
            continue
        if failures:
            role.log(f"{what}: reconnected to {whom} after {failures} failed tries "
                     f"({time.monotonic() - start:.1f} s)")
        return result


class Watchdog:
    """Logs blocking sections that last, and ends the process if one never ends.

    `waiting(what, whom, probe)` marks a section; a daemon thread logs
    "still <what> after N s, waiting on <whom> (<probe()>)" every
    `report_every_s` while it lasts, and exits the process with status
    `EXIT_GAVE_UP` once it has lasted `give_up_after_s`.
    """

    def __init__(self, role, *, exit_when_stopped_after_s=None):
        """Starts the watching thread.

        Args:
          role: the `Role` whose sections are watched.
          exit_when_stopped_after_s: for roles with nothing to save (collectors):
            when a stop is requested, or the section's `finished()` says the run
            is over, while a section blocks this long, exit at once (status 0)
            instead of waiting for the blocked call.
        """
        self._role = role
        self._exit_when_stopped_after_s = exit_when_stopped_after_s
        self._lock = threading.Lock()
        self._section = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name=f'{role.name}-watchdog')
        self._thread.start()

    @contextlib.contextmanager
    def waiting(self, what, whom, probe=None, finished=None):
        with self._lock:
            self._section = (what, whom, probe, finished, time.monotonic())
        try:
            yield
        finally:
            with self._lock:
                self._section = None

    def close(self):
        self._done.set()

    def _watch(self):
        role = self._role
        last_report = {}
        while not self._done.wait(1.0):
            with self._lock:
                section = self._section
            if section is None:
                continue
            what, whom, probe, finished, started = section
            lasted = time.monotonic() - started
            if self._exit_when_stopped_after_s is not None and \
                    lasted >= self._exit_when_stopped_after_s:
                reason = 'a stop was requested' if role.stop.is_set() else _ask(finished)
                if reason:
                    role.log(f"{reason} while {what} (blocked {lasted:.0f} s): exiting now, "
                             "nothing to save")
                    sys.stdout.flush()
                    os._exit(0)
            if lasted >= role.give_up_after_s:
                role.log(f"giving up: {what} has waited {lasted:.0f} s on {whom} "
                         f"(distributed.settings.give_up_after_s={role.give_up_after_s:g}); "
                         "exiting. Restart this role once its peers are back.")
                sys.stdout.flush()
                os._exit(EXIT_GAVE_UP)
            if lasted >= role.report_every_s and \
                    time.monotonic() - last_report.get(started, 0) >= role.report_every_s:
                last_report = {started: time.monotonic()}
                detail = ''
                if probe is not None:
                    try:
                        detail = f" ({probe()})"
                    except Exception as error:  # noqa: BLE001  (a probe must never kill us)
                        detail = f" (probe failed: {one_line(error)})"
                role.log(f"still {what} after {lasted:.0f} s, waiting on {whom}{detail}")


def _ask(finished):
    """`finished()`'s reason to stop, or None (also when it fails: never stop on a guess)."""
    if finished is None:
        return None
    try:
        return finished()
    except Exception:  # noqa: BLE001
        return None
