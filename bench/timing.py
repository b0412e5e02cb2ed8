"""Benchmark plumbing every section shares: timed subprocesses, options, tables, documents.

Every measured run is a separate process, timed from `Popen` to the moment
`wait` returns, with each line of its stdout and stderr time-stamped as it
arrives, so the same run also gives the delay between a chosen last line
and the process exit. Its CPU time (user + system) is kept too: on a busy
machine wall time stretches with the other jobs, CPU time much less. A fresh
process per measurement also means no buffer, server or thread of one system
outlives it into the next one's numbers.
"""

import argparse
import dataclasses
import json
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from core.rundir import atomic_write_text

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_TIMEOUT_S = 1800  # one run longer than this is a hang, not a measurement
RESULT = 'RESULT '  # the stdout line a measuring child reports its JSON result on


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


def cpu_set(cpus):
    """The CPUs of a `taskset -c` list such as '0' or '0-1,3'."""
    found = set()
    for part in cpus.split(','):
        low, _, high = part.partition('-')
        found.update(range(int(low), int(high or low) + 1))
    return found


def describe_pinning(cpus):
    if cpus == 'all':
        return f'not pinned (all {os.cpu_count()} CPUs of this machine)'
    count = len(cpu_set(cpus))
    cores = 'ONE core' if count == 1 else f'{count} cores'
    return f'pinned to {cores} with `taskset -c {cpus}` (reference numbers are per core)'


def timed_run(label, cmd, *, log_dir, cwd=REPO_ROOT, env=None, progress=False,
              timeout_s=RUN_TIMEOUT_S):
    """Runs `cmd` to completion; returns a RunResult (raises BenchError if it fails).

    `progress`: echo the child's own progress lines (`  [hh:mm:ss] ...`) to stderr as they
    come; everything else it prints (TF and Reverb log plenty) is only in the log file.
    """
    run_env = dict(os.environ, PYTHONUNBUFFERED='1', **(env or {}))
    log_path = os.path.join(log_dir, re.sub(r'[^A-Za-z0-9_.-]+', '_', label) + '.log')
    print(f'  [{time.strftime("%H:%M:%S")}] {label}: {shorten(cmd)}', flush=True)
    lines = []
    lock = threading.Lock()
    cpu_before = _children_cpu_s()
    start = time.perf_counter()
    try:
        proc = subprocess.Popen(cmd, cwd=cwd, env=run_env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                errors='replace', bufsize=1)
    except OSError as error:
        raise BenchError(f'{label}: could not start {cmd[0]} ({error})') from None

    def read(stream, name):
        for text in stream:
            stamp = time.perf_counter() - start
            with lock:
                lines.append((stamp, name, text.rstrip('\n')))
            if progress and text.startswith('  ['):
                print(text, end='', file=sys.stderr, flush=True)

    readers = [threading.Thread(target=read, args=(proc.stdout, 'out'), daemon=True),
               threading.Thread(target=read, args=(proc.stderr, 'err'), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        returncode = proc.wait(timeout=timeout_s)
    except BaseException as error:  # a hang or Ctrl-C: never leave the child running
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if isinstance(error, subprocess.TimeoutExpired):
            raise BenchError(f'{label} did not finish in {timeout_s} s; last lines:\n'
                             + '\n'.join(text for _, _, text in lines[-25:])) from None
        raise
    wall_s = time.perf_counter() - start
    cpu_s = _children_cpu_s() - cpu_before  # runs are one at a time: this child only
    for reader in readers:
        reader.join(timeout=10)  # a grandchild holding the pipes must not hang us
    lines.sort(key=lambda line: line[0])
    with open(log_path, 'w') as log:
        log.write(f'$ {shlex.join(cmd)}\n')
        log.writelines(f'{stamp:9.3f} {name} {text}\n' for stamp, name, text in lines)
        log.write(f'{wall_s:9.3f} exit {returncode}\n')
    result = RunResult(label, list(cmd), wall_s, returncode, lines, log_path, cpu_s)
    if returncode != 0:
        raise BenchError(f'{label} exited with status {returncode} after {wall_s:.1f} s '
                         f'(log: {log_path}); last lines:\n{result.tail()}')
    print(f'  [{time.strftime("%H:%M:%S")}] {label}: done in {wall_s:.1f} s', flush=True)
    return result


def _children_cpu_s():
    """CPU seconds of every child this process has waited for so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def call_command(function, *args):
    """A command running `function(*args)` (dotted name, JSON-able args) in a fresh interpreter.

    It prints the JSON of the return value on a RESULT line, then leaves without interpreter
    finalization: tf.data iterators and Reverb clients can block that for seconds (see the DQN
    section's notes), and the measurement is done.
    """
    module, name = function.rsplit('.', 1)
    code = (f'import json, os, sys; from {module} import {name}; '
            f'print({RESULT!r} + json.dumps({name}(*json.loads(sys.argv[1]))), flush=True); '
            'sys.stderr.flush(); os._exit(0)')
    return [python(), '-c', code, json.dumps(args)]


def child_result(label, cmd, log_dir, **kwargs):
    """Runs a measuring child (timed_run's keywords) and returns its RESULT line's JSON."""
    result = timed_run(label, cmd, log_dir=log_dir, **kwargs)
    found = result.last_match('^' + RESULT)
    if found is None:
        raise BenchError(f'{label}: no {RESULT.strip()} line (log: {result.log_path})')
    return json.loads(found[1][len(RESULT):])


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


# -- Options and documents: one set for `make bench` and every standalone section -----------


def options_parser(description, output_help='Markdown file to write.'):
    """The options every section reads; bench/run_all.py adds --only."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument('--quick', action='store_true',
                        help='Shrink budgets to test the harness (numbers are not a benchmark).')
    parser.add_argument('--cpus', default='0',
                        help="CPU list for `taskset -c` (default 0: one core), or 'all'.")
    parser.add_argument('--output', default=None, help=output_help)
    parser.add_argument('--torch_python', default=os.environ.get('TORCH_PYTHON'),
                        help='A Python with torch and gymnasium (e.g. a venv of its own; '
                             'default $TORCH_PYTHON): the SAC section then measures the '
                             'PyTorch peer (bench/pytorch_sac_peer.py) instead of quoting it.')
    parser.add_argument('--sb3_python', default=os.environ.get('SB3_PYTHON'),
                        help='A Python with stable-baselines3, torch and ale-py (default '
                             '$SB3_PYTHON): the Atari section then measures SB3\'s DQN '
                             '(bench/sb3_atari_peer.py).')
    parser.add_argument('--log_dir', default=None,
                        help='Keep every run\'s time-stamped log here (default: a temp dir, '
                             'deleted unless a run fails).')
    return parser


def parse_options(parser, argv):
    opts = parser.parse_args(argv)
    if opts.cpus != 'all':
        try:
            wanted = cpu_set(opts.cpus)
        except ValueError:
            parser.error(f"--cpus={opts.cpus!r}: give a list like 0 or 0-1, or 'all'.")
        if not wanted <= os.sched_getaffinity(0):
            parser.error(f'--cpus={opts.cpus}: this process may only use CPUs '
                         f'{sorted(os.sched_getaffinity(0))}.')
    opts.keep_logs = opts.log_dir is not None
    opts.log_dir = opts.log_dir or tempfile.mkdtemp(prefix='bench-logs-')
    os.makedirs(opts.log_dir, exist_ok=True)
    return opts


def close_logs(opts, failed):
    """Removes a temporary log dir, unless a run failed: then its logs are the evidence."""
    if failed:
        print(f'Run logs kept in {opts.log_dir}', file=sys.stderr, flush=True)
    elif not opts.keep_logs:
        shutil.rmtree(opts.log_dir, ignore_errors=True)


def write_doc(path, text):
    """Writes `path` whole or not at all (temp file, then rename)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write_text(path, text)


def standalone_main(section, description, argv=None, add_arguments=None):
    """`python -m bench.<section>`: runs one section, prints it, writes it to --output.

    `add_arguments(parser)` adds the section's own options.
    """
    parser = options_parser(description.strip().splitlines()[0])
    if add_arguments:
        add_arguments(parser)
    opts = parse_options(parser, sys.argv[1:] if argv is None else argv)
    try:
        text = section(opts)
    except BenchError as error:
        close_logs(opts, failed=True)
        sys.exit(f'error: {error}')
    close_logs(opts, failed=False)
    print(text)
    if opts.output:
        write_doc(opts.output, text)
