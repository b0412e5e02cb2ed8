"""Shared benchmark plumbing: timed subprocesses, the two-budget rate, tables.

Every measured run is a separate process, timed from `Popen` to the moment
`wait` returns, with each line of its stdout and stderr time-stamped as it
arrives, so the same run also gives the delay between a chosen last line
and the process exit. Its CPU time (user + system) is kept too: on a busy
machine wall time stretches with the other jobs, CPU time much less.
"""

import dataclasses
import os
import re
import resource
import shlex
import subprocess
import sys
import threading
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_TIMEOUT_S = 1800  # one run longer than this is a hang, not a measurement


class BenchError(RuntimeError):
    """A measured run failed; the message says which and shows its log tail."""


@dataclasses.dataclass
class RunResult:
    """One finished subprocess: its command, wall time and stamped output."""
    label: str
    cmd: list
    wall_s: float
    returncode: int
    lines: list  # (seconds since start, 'out' | 'err', text)
    log_path: str
    cpu_s: float = None  # user + system CPU seconds of the process

    def last_match(self, pattern):
        """(time, text) of the last output line matching `pattern`, or None."""
        regex = re.compile(pattern)
        for stamp, _, text in reversed(self.lines):
            if regex.search(text):
                return stamp, text
        return None

    def exit_delay_after(self, pattern):
        """Seconds from the last line matching `pattern` to the process exit."""
        match = self.last_match(pattern)
        return None if match is None else self.wall_s - match[0]

    def tail(self, count=25):
        return '\n'.join(text for _, _, text in self.lines[-count:])


def pin_prefix(cpus):
    """The command prefix that pins a run to `cpus` ('all' pins nothing)."""
    return [] if cpus == 'all' else ['taskset', '-c', cpus]


def describe_pinning(cpus):
    if cpus == 'all':
        return f'not pinned (all {os.cpu_count()} CPUs of this machine)'
    count = _cpu_list_size(cpus)
    cores = 'ONE core' if count == 1 else f'{count} cores'
    return f'pinned to {cores} with `taskset -c {cpus}` (reference numbers are per core)'


def _cpu_list_size(cpus):
    total = 0
    for part in cpus.split(','):
        low, _, high = part.partition('-')
        total += int(high or low) - int(low) + 1
    return total


def timed_run(label, cmd, *, cwd, log_dir, env=None, echo=True):
    """Runs `cmd` to completion; returns a RunResult (raises BenchError if it fails)."""
    run_env = dict(os.environ, PYTHONUNBUFFERED='1', **(env or {}))
    log_path = os.path.join(log_dir, re.sub(r'[^A-Za-z0-9_.-]+', '_', label) + '.log')
    if echo:
        print(f'  [{time.strftime("%H:%M:%S")}] {label}: {shlex.join(cmd)}', flush=True)
    lines = []
    lock = threading.Lock()
    cpu_before = _children_cpu_s()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=run_env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors='replace', bufsize=1)

    def read(stream, name):
        for text in stream:
            stamp = time.perf_counter() - start
            with lock:
                lines.append((stamp, name, text.rstrip('\n')))

    readers = [threading.Thread(target=read, args=(proc.stdout, 'out'), daemon=True),
               threading.Thread(target=read, args=(proc.stderr, 'err'), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        returncode = proc.wait(timeout=RUN_TIMEOUT_S)
        wall_s = time.perf_counter() - start
        cpu_s = _children_cpu_s() - cpu_before  # runs are one at a time: this child only
    except BaseException:  # timeout or Ctrl-C: never leave the child running
        _stop(proc)
        raise
    for reader in readers:
        reader.join(timeout=10)  # a grandchild holding the pipes must not hang us
    lines.sort(key=lambda line: line[0])
    with open(log_path, 'w') as log:
        log.write(f'$ {shlex.join(cmd)}\n')
        for stamp, name, text in lines:
            log.write(f'{stamp:9.3f} {name} {text}\n')
        log.write(f'{wall_s:9.3f} exit {returncode}\n')
    result = RunResult(label, list(cmd), wall_s, returncode, lines, log_path, cpu_s)
    if returncode != 0:
        raise BenchError(f'{label} exited with status {returncode} after {wall_s:.1f} s '
                         f'(log: {log_path}); last lines:\n{result.tail()}')
    if echo:
        print(f'  [{time.strftime("%H:%M:%S")}] {label}: done in {wall_s:.1f} s', flush=True)
    return result


def _children_cpu_s():
    """CPU seconds of every child this process has waited for so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _stop(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclasses.dataclass
class TwoBudgetRate:
    """env steps/s from two runs that differ only in their step budget."""
    small: RunResult
    large: RunResult
    small_steps: int
    large_steps: int
    last_line: str = None  # regex of each run's last line, for the rate that excludes exit

    @property
    def delta_s_to_last_line(self):
        """Like delta_s, but each run timed to its last `last_line` line, not to its exit."""
        ends = [run.last_match(self.last_line) if self.last_line else None
                for run in (self.small, self.large)]
        return None if None in ends else ends[1][0] - ends[0][0]

    @property
    def rate_to_last_line(self):
        delta = self.delta_s_to_last_line
        return None if not delta or delta <= 0 else self.delta_steps / delta

    @property
    def delta_steps(self):
        return self.large_steps - self.small_steps

    @property
    def delta_s(self):
        return self.large.wall_s - self.small.wall_s

    @property
    def rate(self):
        return self.delta_steps / self.delta_s if self.delta_s > 0 else float('nan')

    @property
    def rate_per_cpu_s(self):
        """Like rate, over CPU time: less sensitive to other jobs sharing the core."""
        if self.small.cpu_s is None or self.large.cpu_s is None:
            return None
        delta = self.large.cpu_s - self.small.cpu_s
        return self.delta_steps / delta if delta > 0 else None


def markdown_table(headers, rows, aligns=None):
    """A GitHub markdown table of preformatted cells.

    `aligns` has one letter per column, l/r/c; default: first column left,
    the rest (numbers) right.
    """
    aligns = aligns or 'l' + 'r' * (len(headers) - 1)
    rules = [{'l': ':---', 'r': '---:', 'c': ':---:'}[a] for a in aligns]
    out = ['| ' + ' | '.join(headers) + ' |', '| ' + ' | '.join(rules) + ' |']
    out += ['| ' + ' | '.join(str(cell) for cell in row) + ' |' for row in rows]
    return '\n'.join(out)


def cpu_model():
    """The CPU's model name, for a bench's header: ratios between peers move with the host."""
    try:
        with open('/proc/cpuinfo') as info:
            for line in info:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return 'unknown CPU'


def python():
    """The interpreter running the benchmark (the project's .venv under make)."""
    return sys.executable


def shorten(cmd):
    """A command with the repo root and interpreter path shortened for docs."""
    text = shlex.join(cmd)
    return text.replace(python(), os.path.relpath(python(), REPO_ROOT)) \
               .replace(REPO_ROOT + os.sep, '')
