"""Lowering this process's CPU priority: roles that share cores with a busier one."""

import os


def lower_priority(niceness):
    """Gives every thread of this process at least `niceness` (threads started later inherit
    it from their starter): Linux keeps a niceness per thread, so `os.nice` alone would
    leave the threads imported libraries already started at the old one."""
    if not niceness:
        return
    tasks = '/proc/self/task'
    for tid in os.listdir(tasks) if os.path.isdir(tasks) else ['0']:
        try:
            current = os.getpriority(os.PRIO_PROCESS, int(tid))
            os.setpriority(os.PRIO_PROCESS, int(tid), max(current, niceness))
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
