"""The distributed learner alone against a pre-filled replay server, beside one process's steps.

For each workload the replay role (`train.py --role=replay`, pinned to core 1) is filled
with random-policy transitions, then measured, each pinned to core 0 with nothing else
running:

- **learner**: the real learner role (`train.py --role=learn`), its gradient steps/s from
  the end of its first chunk (tracing and XLA compilation left out) to its budget;
- **gradient steps alone, one process**: the single-process `Training` chunk on the run's
  own in-process backend, filled the same way: what the single-process loop's training
  half does when collection costs nothing;
- **sampling alone**: the learner's own stacked-batch pipeline drained without training,
  in windows/s: Reverb's ceiling for this window size on one client core;
- **learner holding the replay** (`distributed.settings.learner_holds_replay`, vector
  observations only): the same learner against a server whose queue was filled with
  every window the run collects; it takes them in at the run's ratio and samples its own
  memory.

The server's rate limiter gets an error buffer so large that it never blocks the
learner (no collectors run). Every agent, batch and network is the config's own.
"""

import os
import shutil
import subprocess
import tempfile
import time

from bench import harness, inprocess, timing

WORKLOADS = [  # (name, config, extra bindings, transitions to fill, learner gradient steps)
    ('DQN CartPole', 'configs/dqn_cartpole.gin', [], 20_000, 20_000),
    ('SAC Pendulum', 'configs/sac_pendulum.gin', [], 20_000, 3_000),
    ('DQN Pong (LZ4 frames)', 'configs/dqn_atari.gin', [], 5_000, 400),
]
QUICK_SCALE = 0.2
HELD = ['distributed.settings.learner_holds_replay=True']
NO_LIMIT = ['distributed.settings.error_buffer=1e12',
            'distributed.settings.min_size_to_sample=1000',
            'distributed.settings.give_up_after_s=600']


def _bindings(extra, num_env_steps=None):
    bindings = list(extra) + NO_LIMIT
    if num_env_steps is not None:
        bindings.append(f'run.num_env_steps={num_env_steps}')
    return bindings


def _gin_args(config, bindings):
    return [f'--gin_file={config}'] + [f'--gin_bindings={b}' for b in bindings]


def _load(config, bindings):
    from app import cli

    cli.start_up(verbose=False)
    cli.load_gin_config([config], bindings)
    from experiment.distributed import config as distributed_config
    return distributed_config.run_params(), distributed_config.settings()


def _fill(backend, agent, tf_env, transitions):
    """Random-policy steps of the config's env into `backend` until it holds `transitions`."""
    import tensorflow as tf

    from experiment.loop import Collection

    env_steps = tf.Variable(0, dtype=tf.int64)
    collection = Collection(tf_env=tf_env, collect_policy=agent.collect_policy,
                            observers=[backend.add], env_steps=env_steps)
    steps = tf.constant(64, tf.int32)
    while env_steps.numpy() < transitions:
        collection.collect_random(steps)
    return int(env_steps.numpy())


def fill_server(config, bindings, address, transitions):
    """Child: writes `transitions` random-policy steps to the replay server at `address`."""
    params, settings = _load(config, bindings)
    from experiment.distributed import common
    from experiment.replay import Mode

    agent, _, tf_env = common.build_agent(params, seed=0)
    backend = common.remote_backend(Mode.COLLECTOR, params, settings, agent,
                                    num_envs=tf_env.batch_size, address=address, seed=0)
    written = _fill(backend, agent, tf_env, transitions)
    backend.metrics()  # flushes
    backend.close()
    return {'transitions': written}


def gradient_steps_alone(config, bindings, transitions, seconds):
    """Child: the single-process training chunk's gradient steps/s on its in-process backend."""
    params, _ = _load(config, bindings)
    from experiment.distributed import common
    from experiment.loop import Training
    from experiment.replay import Mode, build_replay, num_steps_of

    agent, _, tf_env = common.build_agent(params, seed=0)
    root = tempfile.mkdtemp(prefix='bench-steps-')
    try:
        backend = build_replay(Mode.SINGLE, params, agent, num_envs=tf_env.batch_size, seed=0,
                               root_dir=root).backend
        _fill(backend, agent, tf_env, transitions)
        training = Training(agent=agent, backend=backend, batch_size=params.batch_size,
                            num_steps=num_steps_of(agent),
                            train_steps=params.train_steps_per_iteration,
                            use_xla=params.use_xla, sample_ahead=params.sample_ahead)
        rate = inprocess.rate(training.train, params.train_steps_per_iteration,
                              seconds=seconds, warmup=2)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {'rate': rate, 'xla': training.uses_xla}


def sampling_alone(config, bindings, address, seconds):
    """Child: windows/s of the learner's stacked-batch pipeline, drained without training."""
    params, settings = _load(config, bindings)
    from experiment.distributed import common
    from experiment.loop import Training
    from experiment.replay import Mode, num_steps_of

    agent, _, tf_env = common.build_agent(params, seed=0)
    backend = common.remote_backend(Mode.LEARNER, params, settings, agent,
                                    num_envs=tf_env.batch_size, address=address, seed=0)
    steps = settings.learner_steps_per_call
    training = Training(agent=agent, backend=backend, batch_size=params.batch_size,
                        num_steps=num_steps_of(agent), train_steps=steps, use_xla=False)
    batches = iter(training.stacked_dataset(
        backend.as_dataset(params.batch_size, num_steps_of(agent))))
    windows = steps * params.batch_size
    return {'windows_per_sec': inprocess.rate(batches.get_next, windows, seconds=seconds,
                                              warmup=2)}


def _start_server(config, bindings, root, port, log_dir):
    cmd = timing.pin_prefix('1') + [
        timing.python(), 'train.py', '--role=replay', f'--root_dir={root}',
        f'--replay_address=localhost:{port}', '--bind_all_interfaces',
        *_gin_args(config, bindings)]
    log = open(os.path.join(log_dir, f'replay_{port}.log'), 'w')
    return subprocess.Popen(cmd, cwd=timing.REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True), log


def stop(proc, log):
    """SIGINT (a role saves and exits), SIGKILL after 60 s; closes its log."""
    proc.send_signal(2)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


def _wait_for(address, server, timeout_s=120):
    import reverb

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise timing.BenchError(f'the replay server at {address} exited during start-up')
        try:
            reverb.Client(address).server_info(1)
            return
        except Exception:  # noqa: BLE001  (not up yet)
            time.sleep(0.5)
    raise timing.BenchError(f'the replay server at {address} did not answer in {timeout_s} s')


def measure_workload(name, config, extra, transitions, gradient_steps, opts):
    """{learner, alone, windows_per_sec, ...} for one workload (see the module docstring)."""
    from experiment.distributed.cluster import free_port

    if opts.quick:
        transitions = max(2_000, int(transitions * QUICK_SCALE))
        gradient_steps = max(64, int(gradient_steps * QUICK_SCALE))
    seconds = 5 if opts.quick else 20
    params, _ = _load(config, _bindings(extra))
    # The learner's budget is the single-process run's: its replay ratio times the steps
    # collected after the initial random ones.
    num_env_steps = params.initial_collect_steps + int(gradient_steps / params.replay_ratio)
    bindings = _bindings(extra, num_env_steps) + harness.NO_PERIODIC_CHECKPOINTS
    root = tempfile.mkdtemp(prefix='bench-learner-')
    port = free_port()
    address = f'localhost:{port}'
    server, log = _start_server(config, bindings, root, port, opts.log_dir)
    try:
        _wait_for(address, server)
        label = name.split(' (')[0].lower().replace(' ', '_')
        timing.child_result(f'{label} fill', timing.call_command(
            'bench.learner_alone.fill_server', config, bindings, address, transitions),
            opts.log_dir)
        sampled = timing.child_result(f'{label} sampling alone', timing.pin_prefix('0') +
                                      timing.call_command('bench.learner_alone.sampling_alone',
                                                          config, bindings, address, seconds),
                                      opts.log_dir)
        learner = _run_learner(f'{label} learner', config, bindings, root, address, opts)
        alone = timing.child_result(f'{label} gradient steps alone', timing.pin_prefix('0') +
                                    timing.call_command('bench.learner_alone.gradient_steps_alone',
                                                        config, bindings, transitions, seconds),
                                    opts.log_dir)
    finally:
        stop(server, log)
        shutil.rmtree(root, ignore_errors=True)
    held = None
    if params.frame_stack == 1:  # frames stay on the server (experiment/replay.py)
        held = _held_learner(label, config, bindings + HELD, num_env_steps, opts)
    return {'name': name, 'learner': learner['train_steps_per_sec'], 'held': held,
            'learner_steps': learner['train_steps'], 'alone': alone['rate'],
            'xla': alone['xla'], 'windows_per_sec': sampled['windows_per_sec'],
            'batch_size': params.batch_size}


def _held_learner(label, config, bindings, num_env_steps, opts):
    """Gradient steps/s of a learner holding the replay, its queue pre-filled with all the
    run's windows (`num_env_steps`: the learner takes no more)."""
    from experiment.distributed.cluster import free_port

    root = tempfile.mkdtemp(prefix='bench-held-')
    port = free_port()
    address = f'localhost:{port}'
    server, log = _start_server(config, bindings, root, port, opts.log_dir)
    try:
        _wait_for(address, server)
        timing.child_result(f'{label} fill queue', timing.call_command(
            'bench.learner_alone.fill_server', config, bindings, address, num_env_steps),
            opts.log_dir)
        return _run_learner(f'{label} learner holding the replay', config, bindings, root,
                            address, opts)['train_steps_per_sec']
    finally:
        stop(server, log)
        shutil.rmtree(root, ignore_errors=True)


def _run_learner(what, config, bindings, root, address, opts):
    """The real learner role on core 0 against the server at `address`; its final metrics."""
    timing.timed_run(what, timing.pin_prefix('0') + [
        timing.python(), 'train.py', '--role=learn', f'--root_dir={root}',
        f'--replay_address={address}', *_gin_args(config, bindings)], log_dir=opts.log_dir)
    return _read_json(os.path.join(root, 'learner', 'metrics.json'))


def _read_json(path):
    import json

    try:
        with open(path) as f:
            return json.load(f)
    except OSError as error:
        raise timing.BenchError(f'no learner metrics at {path}: {error}') from None


_MEASURED = {}  # (workload name, quick) -> its measurement, shared with bench/scaling.py


def measured(name, opts):
    """`measure_workload` of the workload `name`, once per process (make bench's sections
    learner_alone and scaling both report it)."""
    key = (name, opts.quick)
    if key not in _MEASURED:
        workload = next(w for w in WORKLOADS if w[0] == name)
        _MEASURED[key] = measure_workload(*workload, opts)
    return _MEASURED[key]


def section(opts):
    rows = [measured(workload[0], opts) for workload in WORKLOADS]
    return render(rows, opts)


def render(rows, opts):
    def held(row):
        if row.get('held') is None:
            return ['n/a (frames)', '']
        return [f"{row['held']:,.0f}", f"{row['held'] / row['alone']:.2f}×"]

    table = timing.markdown_table(
        ['workload', 'learner, gradient steps/s', 'one process, gradient steps alone',
         'ratio', 'learner holding the replay', 'its ratio', 'sampling alone, windows/s',
         'its ceiling, gradient steps/s'],
        [[row['name'], f"{row['learner']:,.0f}",
          f"{row['alone']:,.0f}{' (XLA)' if row['xla'] else ''}",
          f"{row['learner'] / row['alone']:.2f}×", *held(row), f"{row['windows_per_sec']:,.0f}",
          f"{row['windows_per_sec'] / row['batch_size']:,.0f}"] for row in rows])
    return '\n'.join([
        '## The distributed learner alone against a pre-filled replay server', '',
        f'Written by `python -m bench.learner_alone{" --quick" if opts.quick else ""}` '
        f'(a `make bench` section) on {timing.cpu_model()}; do not edit by hand. '
        'The learner and each measuring child pinned to core 0, the replay server to core 1; '
        'no collectors run, and no role takes a periodic checkpoint. Bar: learner ≥ 0.9× one '
        'process\'s gradient steps alone for SAC Pendulum and DQN Pong.', '',
        table, '',
        'The ceiling column is the sampling rate divided by the batch size: the most gradient '
        'steps/s Reverb could feed this learner however fast its steps were. "Learner holding '
        'the replay" (`distributed.settings.learner_holds_replay`) takes each window from the '
        'server once, at the run\'s ratio, and samples its batches from its own memory, so '
        'that ceiling does not apply to it; frame windows stay on the server.', ''])


def main(argv=None):
    return timing.standalone_main(section, __doc__, argv)


if __name__ == '__main__':
    import sys

    sys.exit(main())
