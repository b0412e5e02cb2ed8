"""The role processes of a distributed run on one machine: start, supervise, stop.

`Cluster` starts each role as its own `train.py --role=...` process (own
session, own log under `<root_dir>/logs/`), restarts a crashed one, and stops
them in order; `run_cluster` runs a whole cluster to its end. The launcher
(`python -m app.launch`) and the tests use it. How a role's process is started
and signalled is its `starter`'s business: `LocalStarter` (a child process of
this one) by default; a Slurm job starts each role as an `srun` step instead
(app/slurm_steps.py), with the same supervision.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

from core import rundir
from core.errors import UserError

# The repository root: every role runs train.py from there.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_RESTARTS = 3
PROGRESS_EVERY_S = 10.0


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(('127.0.0.1', 0))
        return probe.getsockname()[1]


class LocalStarter:
    """Starts a role as a child process of this one and signals it directly."""

    def command(self, name, command):
        """The argv that runs the role `name` whose own command line is `command`."""
        del name
        return command

    def send(self, name, proc, signum):
        """Sends `signum` to the role `name` (its process `proc`, still running)."""
        del name
        proc.send_signal(signum)


class Cluster:
    """The role processes of one run: start, signal, restart, stop -- always bounded."""

    def __init__(self, *, gin_files, gin_bindings=(), root_dir, port=None, seed=0, force=False,
                 bind_all_interfaces=False, env=None, shards=1, shard_addresses=None,
                 starter=None):
        """`port` serves replay shard 0 on localhost; shards 1..K-1 (`shards` = K) get free
        ports. `shard_addresses` (HOST:PORT per shard) replaces both where the roles run on
        other hosts; `starter` starts and signals the role processes (`LocalStarter`)."""
        self.gin_args = [f'--gin_file={f}' for f in gin_files] + \
            [f'--gin_bindings={b}' for b in gin_bindings]
        self.root_dir = root_dir
        self.shards = shards
        if shard_addresses is None:
            shard_addresses = [f'localhost:{port}'] + [f'localhost:{free_port()}'
                                                       for _ in range(shards - 1)]
        elif len(shard_addresses) != shards:
            raise ValueError(f'{len(shard_addresses)} shard addresses for {shards} shards')
        self.shard_addresses = list(shard_addresses)
        self.starter = starter or LocalStarter()
        # What every role gets as --replay_address: every shard, in order.
        self.address = ','.join(self.shard_addresses)
        self.seed = seed
        self.force = force
        self.bind_all_interfaces = bind_all_interfaces
        self.env = dict(os.environ, PYTHONUNBUFFERED='1', **(env or {}))
        self.procs = {}
        self.restarts = {}
        self.exited_at = {}  # {name: time.time()} when the launcher first saw it exit
        self.log_dir = os.path.join(root_dir, 'logs')
        os.makedirs(self.log_dir, exist_ok=True)

    def command(self, role, index=0, bindings=()):
        """The role's command line; `index` is the collector's number or the replay shard's,
        `bindings` Gin bindings for this role only (after the run's)."""
        cmd = [sys.executable, os.path.join(ROOT, 'train.py'), f'--role={role}', *self.gin_args,
               *[f'--gin_bindings={b}' for b in bindings],
               f'--root_dir={self.root_dir}', f'--replay_address={self.address}',
               f'--seed={self.seed}']
        if role == 'collect':
            cmd.append(f'--collector_id={index}')
        if role == 'replay' and index:
            cmd.append(f'--shard={index}')
        if role == 'replay' and self.bind_all_interfaces:
            cmd.append('--bind_all_interfaces')
        if self.force:
            cmd.append('--force')
        return cmd

    def name_of(self, role, index=0):
        from experiment.distributed.common import role_name

        return role_name(role, index, self.shards)

    def replay_names(self):
        return [self.name_of('replay', shard) for shard in range(self.shards)]

    def log_path(self, name):
        return os.path.join(self.log_dir, f'{name}.log')

    def start(self, role, collector_id=0, bindings=()):
        """Starts one role (in its own session, so a terminal's Ctrl-C reaches only us).

        `collector_id` is the collector's number, or for `replay` the shard's; `bindings`
        are Gin bindings for this role only (kept for its restarts)."""
        name = self.name_of(role, collector_id)
        if name in self.procs and self.procs[name][0].poll() is None:
            raise RuntimeError(f'{name} is already running')
        with open(self.log_path(name), 'a') as log:
            log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {name} ===\n")
            log.flush()
            proc = subprocess.Popen(self.starter.command(name, self.command(role, collector_id,
                                                                            bindings)), cwd=ROOT,
                                    env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = (proc, role, collector_id, tuple(bindings))
        self.exited_at.pop(name, None)
        return name

    def restart(self, name):
        _, role, collector_id, bindings = self.procs[name]
        return self.start(role, collector_id, bindings)

    def alive(self, name):
        return name in self.procs and self.procs[name][0].poll() is None

    def returncode(self, name):
        code = self.procs[name][0].poll()
        if code is not None:
            self.exited_at.setdefault(name, time.time())
        return code

    def send_signal(self, name, signum):
        """Sends `signum` to a running role (through its starter); nothing if it has exited."""
        proc = self.procs[name][0]
        if proc.poll() is None:
            self.starter.send(name, proc, signum)

    def kill(self, name, signum=signal.SIGKILL):
        proc = self.procs[name][0]
        self.send_signal(name, signum)
        if signum == signal.SIGKILL:
            _wait_or_kill(proc)

    def stop(self, names, grace_s=60.0):
        """SIGINT to `names` at once; SIGKILL to any still running after `grace_s`."""
        live = [name for name in names if self.alive(name)]
        for name in live:
            self.send_signal(name, signal.SIGINT)
        deadline = time.monotonic() + grace_s
        for name in live:
            proc = self.procs[name][0]
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.send_signal(name, signal.SIGKILL)
                _wait_or_kill(proc)
            self.returncode(name)  # notes when it exited

    def stop_all(self, grace_s=60.0):
        """Workers first (the learner checkpoints), the replay servers last (they checkpoint)."""
        replay = self.replay_names()
        self.stop([name for name in self.procs if name not in replay], grace_s)
        self.stop(replay, grace_s)

    def tail(self, name, lines=15):
        try:
            with open(self.log_path(name)) as log:
                return ''.join(log.readlines()[-lines:])
        except OSError:
            return ''


def _wait_or_kill(proc, timeout_s=30):
    """Waits for a process sent SIGKILL through its starter; kills it here if it lingers
    (a starter may only ask another machine to kill the role)."""
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_s)


def wait_for_server(address, *, timeout_s, deadline_s, alive):
    """Blocks until the server answers (bounded by `deadline_s`); returns its table names."""
    import reverb

    start = time.monotonic()
    while True:
        try:
            return sorted(reverb.Client(address).server_info(max(1, int(timeout_s))))
        except (RuntimeError, ConnectionError, TimeoutError, reverb.errors.ReverbError) as error:
            if not alive():
                raise UserError(f"the replay server at {address} exited during start-up "
                                "(see its log)") from None
            if time.monotonic() - start > deadline_s:
                raise UserError(f"the replay server at {address} did not answer within "
                                f"{deadline_s:.0f} s: {str(error).splitlines()[0][:160]}") from None
            time.sleep(0.5)


def read_metrics(directory):
    try:
        with open(os.path.join(directory, 'metrics.json')) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def run_cluster(cluster, *, collectors, eval_role=True, settings, params, verbose=True):
    """Runs a whole cluster to its end (or Ctrl-C); returns the combined metrics."""
    start = time.monotonic()
    say = (lambda text: print(text, flush=True)) if verbose else (lambda text: None)
    final = 'eval' if eval_role else 'learner'
    interrupted = False
    try:
        replay = [cluster.start('replay', shard) for shard in range(cluster.shards)]
        for name, address in zip(replay, cluster.shard_addresses):
            wait_for_server(address, timeout_s=settings.timeout_s,
                            deadline_s=settings.give_up_after_s,
                            alive=lambda name=name: cluster.alive(name))
        names = [cluster.start('learn')]
        names += [cluster.start('collect', i) for i in range(collectors)]
        if eval_role:
            names.append(cluster.start('eval'))
        where = (f"replay server at {cluster.address}" if cluster.shards == 1 else
                 f"{cluster.shards} replay shards at {cluster.address}")
        say(f"{where}; roles and their logs:")
        for name in [*replay, *names]:
            say(f"  {name:<12} pid {cluster.procs[name][0].pid:<8} {cluster.log_path(name)}")
        _supervise(cluster, final, say, params, start)
    except KeyboardInterrupt:
        interrupted = True
        say("interrupted: stopping every role (the learner and the replay server checkpoint); "
            "Ctrl-C again kills them at once")
    finally:
        _on_second_interrupt(cluster)
        cluster.stop_all()
    metrics = {
        'eval': read_metrics(os.path.join(cluster.root_dir, 'eval')),
        'learner': read_metrics(os.path.join(cluster.root_dir, 'learner')),
        'replay': read_metrics(os.path.join(cluster.root_dir, 'replay')) if cluster.shards == 1
        else [read_metrics(os.path.join(cluster.root_dir, name))
              for name in cluster.replay_names()],
        'collectors': collectors, 'interrupted': interrupted,
        'restarts': dict(cluster.restarts),
        'wall_time_s': time.monotonic() - start,
        'exit_codes': {name: cluster.returncode(name) for name in cluster.procs},
        'exited_at': dict(cluster.exited_at),
    }
    # The whole run's numbers where a single-process run keeps its own: <root_dir>/metrics.json.
    rundir.write_metrics(cluster.root_dir, metrics)
    return metrics


def _on_second_interrupt(cluster):
    """While stopping, Ctrl-C (or SIGTERM) SIGKILLs every role instead of aborting the stop."""
    def kill_all(signum, frame):
        del signum, frame
        for name in cluster.procs:
            if cluster.alive(name):
                cluster.send_signal(name, signal.SIGKILL)

    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            signal.signal(signum, kill_all)
        except ValueError:  # not the main thread (tests): nothing to catch there
            pass


def _supervise(cluster, final, say, params, start):
    """Waits for the final role; restarts crashed roles; prints progress."""
    next_line = time.monotonic() + PROGRESS_EVERY_S
    while True:
        time.sleep(0.5)
        for name in list(cluster.procs):
            code = cluster.returncode(name)
            if code is None or code == 0:
                continue
            count = cluster.restarts.get(name, 0)
            if count >= MAX_RESTARTS:
                raise UserError(f"{name} failed {count + 1} times (exit {code}); last lines of "
                                f"{cluster.log_path(name)}:\n{cluster.tail(name)}")
            cluster.restarts[name] = count + 1
            say(f"{name} exited with status {code}; restarting it ({count + 1}/{MAX_RESTARTS}), "
                f"see {cluster.log_path(name)}")
            cluster.restart(name)
        if cluster.returncode(final) == 0:
            return
        if time.monotonic() >= next_line:
            next_line = time.monotonic() + PROGRESS_EVERY_S
            say(_progress_line(cluster, params, start))


def _progress_line(cluster, params, start):
    import reverb

    from experiment.distributed import common

    evaluation = read_metrics(os.path.join(cluster.root_dir, 'eval')) or {}
    last = evaluation.get('final_eval_return')
    text = 'n/a' if last is None else f"{last:.1f} at env step {evaluation['last_eval_env_step']:,}"
    shards = []
    for address in cluster.shard_addresses:
        try:
            shards.append(common.replay_counters(reverb.Client(address).server_info(2)))
        except (RuntimeError, reverb.errors.ReverbError):
            shards.append(None)
    steps = ('        ?' if None in shards else
             f"{sum(shard['inserted'] for shard in shards):>9,}")
    sizes = ''
    if cluster.shards > 1:  # each shard's windows stored (down: 'down')
        sizes = ' | shards ' + ' / '.join('down' if shard is None else f"{shard['size']:,}"
                                         for shard in shards)
    running = sum(cluster.alive(name) for name in cluster.procs)
    return (f"env step {steps}/{params.num_env_steps:,} | last eval {text}{sizes} | "
            f"{time.monotonic() - start:6.0f} s | {running}/{len(cluster.procs)} roles up")
