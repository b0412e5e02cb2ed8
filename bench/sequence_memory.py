"""Bytes per stored env step: recurrent sequence replay against the feed-forward config's buffer.

    .venv/bin/python -m bench.sequence_memory [--output docs/recurrent_memory.md]

Builds the replay buffer of configs/r2d2_cartpole_pomdp.gin (PrioritizedSequenceReplay: every
env step stored once, plus the start state of each sequence and a sum tree) and of its
feed-forward twin configs/dqn_cartpole_pomdp.gin (PrioritizedReplay of transitions), both at
the configs' capacity and from the agents' own `collect_data_spec`, and counts the bytes of
every variable each holds (rows, sum tree, start states, counters), divided by the capacity.
The uniform counterparts (SequenceReplay against UniformReplay) are measured the same way.
R2D2's reference layout (Acme's SequenceAdder: every sequence its own item of burn-in + trace +
n steps, one every `period` steps, with its start state) is computed from the same row size,
not built: (sequence length x row bytes + state bytes) / period per env step.
Nothing here is timed, so it can run beside other work.
"""

import os

import gin
import tensorflow as tf

from bench import timing

RECURRENT = 'configs/r2d2_cartpole_pomdp.gin'
FEED_FORWARD = 'configs/dqn_cartpole_pomdp.gin'


def _agent_and_run(config):
    """The configured agent and run settings of `config` (Gin parsed as train.py does)."""
    from tf_agents.environments import tf_py_environment

    import app.registry  # noqa: F401  (registers every configurable)
    from envs.suite import make_env
    from experiment.config import RunConfig

    gin.clear_config()
    gin.parse_config_files_and_bindings([config], [])
    run = RunConfig()
    env = tf_py_environment.TFPyEnvironment(make_env())
    agent = run.make_agent(env.time_step_spec(), env.action_spec(),
                           tf.Variable(0, dtype=tf.int64))
    return agent, run, env.batch_size


def _bytes_per_step(backend_class, agent, run, num_envs, **extra):
    backend = backend_class(agent.collect_data_spec, capacity=run.replay_capacity,
                            num_envs=num_envs, batch_size=run.batch_size,
                            num_steps=agent.train_sequence_length or 2, **extra)
    total = sum(int(v.shape.num_elements()) * v.dtype.size for v in backend.variables)
    return total / backend.capacity, backend


def measure():
    from buffers.prioritized import PrioritizedReplay
    from buffers.sequence import PrioritizedSequenceReplay, SequenceReplay
    from buffers.uniform import UniformReplay

    os.chdir(timing.REPO_ROOT)  # the configs include each other by repository paths
    agent, run, num_envs = _agent_and_run(RECURRENT)
    period = agent.sequence_period
    state_bytes = sum(spec.shape.num_elements() * spec.dtype.size
                      for spec in tf.nest.flatten(agent.collect_data_spec.policy_info))
    recurrent = {
        'prioritized': _bytes_per_step(PrioritizedSequenceReplay, agent, run, num_envs,
                                       period=period)[0],
        'uniform': _bytes_per_step(SequenceReplay, agent, run, num_envs, period=period)[0],
    }
    length = agent.train_sequence_length
    ff_agent, ff_run, ff_envs = _agent_and_run(FEED_FORWARD)
    row_bytes = sum(spec.shape.num_elements() * spec.dtype.size
                    for spec in tf.nest.flatten(ff_agent.collect_data_spec))
    feed_forward = {
        'prioritized': _bytes_per_step(PrioritizedReplay, ff_agent, ff_run, ff_envs)[0],
        'uniform': _bytes_per_step(UniformReplay, ff_agent, ff_run, ff_envs)[0],
    }
    gin.clear_config()
    overlapping = (length * row_bytes + state_bytes) / period
    return dict(recurrent=recurrent, feed_forward=feed_forward, overlapping=overlapping,
                period=period, length=length, state_bytes=state_bytes, row_bytes=row_bytes,
                capacity=run.replay_capacity)


def section(opts):
    del opts  # nothing is timed or shrunk
    m = measure()
    lines = [
        '## Recurrent replay: bytes per stored env step', '',
        f'Measured by `python -m bench.sequence_memory` (bench/sequence_memory.py): every '
        f'variable of the buffer, at the configs\' capacity of {m["capacity"]:,} env steps, '
        f'divided by it. Recurrent: `{RECURRENT}` (sequences of {m["length"]} steps, one every '
        f'{m["period"]} steps, a {m["state_bytes"]}-byte LSTM start state each). Feed-forward: '
        f'`{FEED_FORWARD}` ({m["row_bytes"]}-byte rows).', '',
        '| replay | feed-forward config | recurrent config | recurrent / feed-forward |',
        '| --- | ---: | ---: | ---: |']
    for kind, (ff_name, rec_name) in (('prioritized', ('PrioritizedReplay',
                                                        'PrioritizedSequenceReplay')),
                                      ('uniform', ('UniformReplay', 'SequenceReplay'))):
        ff, rec = m['feed_forward'][kind], m['recurrent'][kind]
        lines.append(f'| {kind} | {ff:.1f} B ({ff_name}) | {rec:.1f} B ({rec_name}) | '
                     f'{rec / ff:.2f}× |')
    ratio = m['overlapping'] / m['feed_forward']['uniform']
    lines += ['', f'R2D2\'s overlapping items (each sequence its own {m["length"]}-step item, '
              f'computed from the row size): {m["overlapping"]:.1f} B per env step, '
              f'{ratio:.1f}× the feed-forward uniform buffer.', '']
    return '\n'.join(lines)


def main(argv=None):
    timing.standalone_main(section, __doc__, argv)


if __name__ == '__main__':
    main()
