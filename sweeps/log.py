"""The sweep's event log: one JSON object per line in `<sweep dir>/sweep.log`.

It records when each trial started, finished, was skipped or failed, so a
person (or a test) can see what a rerun actually ran. Lines are appended with
one write each, so several workers and sweep processes can share the file.
"""

import json
import os
import threading
import time

FILE_NAME = 'sweep.log'


class EventLog:
    """Appends events to a sweep's log file."""

    def __init__(self, sweep_dir):
        self.path = os.path.join(sweep_dir, FILE_NAME)
        self._lock = threading.Lock()

    def write(self, event, **fields):
        record = {'time': round(time.time(), 3), 'pid': os.getpid(), 'event': event, **fields}
        line = json.dumps(record, sort_keys=True) + '\n'
        with self._lock:
            with open(self.path, 'a') as f:
                f.write(line)


def read(sweep_dir):
    """All events of a sweep, oldest first (an empty list before the first)."""
    path = os.path.join(sweep_dir, FILE_NAME)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
