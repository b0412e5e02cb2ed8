"""Runs jobs on N worker threads; each job waits on a trial subprocess.

Threads are enough because the work happens in the trial processes. The main
thread only waits, so it stays free to take Ctrl-C / SIGTERM: those ask every
running trial to checkpoint and exit (train.py handles SIGINT that way) and
stop new trials from starting; rerunning the sweep resumes them.
"""

import concurrent.futures

from core.signals import StopSignal

_POLL_SECONDS = 0.5


def run_jobs(jobs, workers, launcher):
    """Calls each job on one of `workers` threads; returns their results in order.

    Jobs not yet started when a stop is requested are not called (their result
    is None). The first exception a job raised is re-raised once all are done.
    """
    def guarded(job):
        return None if launcher.stop_requested else job()

    with _stop_on_signals(launcher), concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, workers), thread_name_prefix='sweep-worker') as pool:
        futures = [pool.submit(guarded, job) for job in jobs]
        while not all(future.done() for future in futures):
            concurrent.futures.wait(futures, timeout=_POLL_SECONDS)
    return [future.result() for future in futures]


def _stop_on_signals(launcher):
    """Routes SIGINT and SIGTERM to launcher.interrupt() while the sweep runs (`core.signals`)."""
    def handle(name, first):
        if first:
            print(f'\nStopping ({name}): running trials checkpoint and exit; rerun the same '
                  'command to resume.', flush=True)
        launcher.interrupt()

    return StopSignal(on_signal=handle)
