"""Roles that give way to the learner: every thread of the process gets the niceness, in a
child process (the test process keeps its own)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHILD = '''
import os, threading
from core import niceness
started = threading.Event(); done = threading.Event()
threading.Thread(target=lambda: (started.set(), done.wait())).start()
started.wait()
niceness.lower_priority(NICENESS)
tasks = {os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir('/proc/self/task')}
later = []
thread = threading.Thread(target=lambda: later.append(os.getpriority(os.PRIO_PROCESS, 0)))
thread.start(); thread.join(); done.set()
print(sorted(tasks), later)
'''


def _niceness_in_child(niceness, start_at=0):
    out = subprocess.run(
        [sys.executable, '-c', f'import os; os.nice({start_at})\n' +
         CHILD.replace('NICENESS', str(niceness))],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.strip()


def test_every_thread_and_every_later_thread_gets_the_niceness():
    assert _niceness_in_child(7) == '[7] [7]'


def test_a_process_already_nicer_keeps_its_niceness_and_zero_changes_nothing():
    assert _niceness_in_child(5, start_at=12) == '[12] [12]'
    assert _niceness_in_child(0) == '[0] [0]'
