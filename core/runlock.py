"""One process per run directory: an OS file lock taken before anything is read or written.

A double submit (the same command started twice on one --root_dir) would
otherwise resume from a checkpoint the first process is still writing, and
the two would write over each other. The lock is `flock` on
`<root_dir>/.run.lock`: the kernel drops it when its process dies, however it
dies, so a lock left by a killed run never blocks the rerun. The holder's PID,
host and start time are written into the file for the refusal message.
"""

import fcntl
import os
import socket
import time

from core.errors import UserError

LOCK_FILE = '.run.lock'


class RunLock:
    """An exclusive lock on one run directory, held until `release()` or process exit."""

    def __init__(self, directory):
        self.path = os.path.join(directory, LOCK_FILE)
        self._file = None

    def acquire(self):
        """Takes the lock or raises a one-line UserError naming the process that holds it."""
        handle = open(self.path, 'a+')
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or 'another process'
            handle.close()
            raise UserError(
                f"{os.path.dirname(self.path)} is in use by {holder}: wait for that run to end "
                "or stop it (it checkpoints on SIGTERM), or pass another --root_dir.") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"PID {os.getpid()} on host {socket.gethostname()} (since "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S')})\n")
        handle.flush()
        self._file = handle
        return self

    def release(self):
        """Drops the lock (closing the file releases it); harmless when not held."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
