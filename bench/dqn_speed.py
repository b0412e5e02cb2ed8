"""DQN on CartPole, end to end: TF-Agents' own example against our train.py (bench/harness.py).

Same work per env step on both sides (the section's text lists it). Periodic work each
system does by default stays in the timed difference: the example's per-iteration
summaries, logging and checkpoints (every 5k/10k/20k train steps), our summaries (every 1k
env steps) and checkpoints (every 10k env steps, replay included).
"""

import re

from bench import harness, timing

TFA_MODULE = 'tf_agents.agents.dqn.examples.v2.train_eval'
TFA_INITIAL_COLLECT = 1000  # train_eval's default; env steps before iteration 1
TFA_LOG_INTERVAL = 1000  # its default; budgets are multiples so the last log is the last step
OURS_CONFIG = 'configs/dqn_cartpole.gin'
OURS_BINDINGS = harness.NO_EXTRA_WORK + [
    # The example's agent: DQN (not double), 1-step targets, soft target updates
    # (tau 0.05 every 5 steps), fixed epsilon 0.1, Adam 1e-3, no gradient clipping.
    'dqn.make_agent.fc_layer_params=(100,)',
    'dqn.make_agent.double_dqn=False',
    'dqn.make_agent.n_step_update=1',
    'dqn.make_agent.target_update_tau=0.05',
    'dqn.make_agent.target_update_period=5',
    'dqn.make_agent.epsilon_start=0.1',
    'dqn.make_agent.epsilon_end=0.1',
    'dqn.make_agent.learning_rate=1e-3',
    'dqn.make_agent.gradient_clipping=None',
    'run.initial_collect_steps=1000',
    'run.replay_capacity=100000',
    'run.batch_size=64',
    'make_env.num_envs=8',
    'run.collect_steps_per_iteration=32',  # 4 steps of 8 copies ...
    'run.train_steps_per_iteration=32',  # ... then 32 gradient steps: 1:1
    'run.export_final_policy=False',
]
EXIT_LIMIT_S = 5.0  # ours must exit within this long after its last line

# (N1, N2) per system: env steps for ours, train iterations for the example.
FULL_BUDGETS = {'tfa': (1_000, 26_000), 'ours': (5_000, 105_000)}
QUICK_BUDGETS = {'tfa': (1_000, 2_000), 'ours': (2_000, 12_000)}


def tfa_base(module, iterations, root_dir):
    """The start of a TF-Agents example's command (DQN's or SAC's)."""
    if iterations % TFA_LOG_INTERVAL:
        raise ValueError(f'TF-Agents budgets must be multiples of {TFA_LOG_INTERVAL} so that '
                         'its last log line is its last step.')
    return [timing.python(), '-m', module, f'--root_dir={root_dir}']


def tfa_command(iterations, root_dir):
    return tfa_base(TFA_MODULE, iterations, root_dir) + [
        f'--num_iterations={iterations}',  # a flag: a gin binding for it is overridden
        '--gin_param=train_eval.env_name="CartPole-v1"',
        # Eval fires when step % eval_interval == 0; 0 would mean every step
        # (numpy's int64 % 0 is 0), so a huge interval disables it.
        '--gin_param=train_eval.eval_interval=1000000000',
        # The eval before training always runs; 1 episode keeps it short.
        '--gin_param=train_eval.num_eval_episodes=1']


def parse_tfa(result, iterations):
    """(env steps, gradient steps) of a TF-Agents example run (DQN's or SAC's: same log).

    Its global step counts gradient steps, one per iteration after the initial collection.
    """
    match = result.last_match(r'step = (\d+), loss')
    if match is None:
        raise timing.BenchError(f'{result.label}: no "step = N" line (log: {result.log_path})')
    train_steps = int(re.search(r'step = (\d+)', match[1]).group(1))
    if train_steps != iterations:
        raise timing.BenchError(f'{result.label}: last logged step {train_steps}, expected '
                                f'{iterations} (log: {result.log_path})')
    return TFA_INITIAL_COLLECT + iterations, train_steps


def tfa_system(name, build):
    """A TF-Agents example: the reference; it runs from any directory."""
    return harness.System(name, build, parse_tfa, key='tfa', cwd=None, last_line=r'steps/sec',
                          last_line_text='its last log line (`N steps/sec` at the last step)',
                          is_reference=True)


def systems():
    return [tfa_system('TF-Agents example (dqn/examples/v2/train_eval.py)', tfa_command)] + [
        harness.train_system(f"ours, train.py, XLA {'on' if xla else 'off'}", OURS_CONFIG,
                             OURS_BINDINGS + [f'run.use_xla={xla}'], uses_xla=xla,
                             exit_limit_s=EXIT_LIMIT_S)
        for xla in (True, False)]


def section(opts):
    """Runs the comparison; returns its markdown."""
    budgets = QUICK_BUDGETS if opts.quick else FULL_BUDGETS
    return render(harness.measure(systems(), budgets, opts, 'dqn-speed-'), opts)


def render(measured, opts):
    reference = next(item.rate for item in measured if item.system.is_reference)
    out = ['## DQN on CartPole: end-to-end env steps/s', '',
           'DQN on CartPole-v1, 1 gradient step per env step, batch 64, Q-network with one '
           'hidden layer of 100 units, 1,000 initial random steps, no evaluation in the timed '
           f'difference. Every run {timing.describe_pinning(opts.cpus)}. Each system ran twice '
           'with different step budgets; **env steps/s = Δ env steps / Δ wall time** of the '
           'whole process, so start-up, tracing/XLA compilation, initial collection, the eval '
           'each system always does once, and exit cancel out.', '']
    rows, noisy = [], False
    for item in measured:
        rate, to_last = item.rate, item.rate.rate_to_last_line
        mark = ' †' if rate.delta_s < rate.small.wall_s else ''
        noisy = noisy or bool(mark)
        rows.append([item.system.name, f'{rate.delta_steps:,}', f'{rate.delta_s:.1f}{mark}',
                     f'{rate.rate:,.0f}', f'{rate.rate / reference.rate:.2f}x',
                     'n/a' if to_last is None or not reference.rate_to_last_line
                     else f'{to_last:,.0f} ({to_last / reference.rate_to_last_line:.2f}x)',
                     f'{rate.fixed_s:.1f}' if rate.fixed_s is not None else 'n/a'])
    out += [timing.markdown_table(
        ['system', 'Δ env steps', 'Δ seconds', 'env steps/s', 'ratio vs TF-Agents example',
         'env steps/s to last line (ratio)', 'fixed seconds per run'], rows), '']
    if noisy:
        out += ['† Δ seconds is shorter than the whole N1 run, so start-up noise can dominate '
                'this rate: use the full budgets on a quiet machine.', '']
    out += ['"env steps/s to last line" times each run to its last output line instead of '
            'its exit (see exit latency below): the same method without the noise of a slow, '
            'variable exit. "Fixed seconds per run" is what the rate leaves unexplained in the '
            'shorter run (its wall time less its env steps at the rate): interpreter and TF '
            'start-up, tracing and XLA compilation, the initial random steps running at '
            'another rate, the one eval, exit. It is what a user waits for before a run '
            'trains at speed.', '']
    xla = {item.system.name: item.rate.rate for item in measured}
    on, off = xla.get('ours, train.py, XLA on'), xla.get('ours, train.py, XLA off')
    if on and off:
        out += [f'XLA buys {on / off:.2f}x end to end ({on:,.0f} vs {off:,.0f} env steps/s; '
                'only our train chunk is compiled, collection never is).', '']

    exits, exits_passed = harness.exit_latency_table(measured, EXIT_LIMIT_S)
    out += ['### Process exit latency', '',
            'Time from the last line a run prints to the moment the process has exited '
            f'(every run above). Requirement: ours exits within {EXIT_LIMIT_S:.0f} s.', '',
            exits, '']
    out += harness.runs_section(
        measured, opts, 'Budgets are `--num_iterations` for the example (1 env step + 1 '
        f'gradient step each, after {TFA_INITIAL_COLLECT:,} random steps) and '
        '`run.num_env_steps` for ours (initial random steps included); env and gradient steps '
        "are read back from each run's output.")
    out += ['Notes on the TF-Agents example:', '',
            '- Run as shipped in tf-agents 0.19.0 with its gym 0.23 suite; it defaults to '
            "CartPole-v0 (200-step episodes), here `env_name='CartPole-v1'` (500 steps) to "
            'match ours.',
            '- `num_iterations` must be given as the `--num_iterations` flag: `main()` passes '
            'it explicitly, so a `train_eval.num_iterations` gin binding is silently ignored.',
            '- It evaluates when `global_step % eval_interval == 0`; with `eval_interval=0` '
            "numpy's `int64 % 0` is 0 (plus a warning), i.e. an eval after *every* step, so "
            'a huge interval is used. Its eval before training always runs (1 episode here).',
            '- Its `global_step` counts gradient steps; env steps = 1,000 initial + 1 per '
            'iteration.',
            '- It is slow to exit, by a varying amount (about 3 to 22 s seen on a busy '
            'machine): after its last step and after the atexit handlers, interpreter '
            'finalization blocks in the destructor of its tf.data iterator '
            '(`as_dataset(num_parallel_calls=3).prefetch(3)`), which waits for the '
            "iterator's background threads. Hence the to-last-line column.", '']
    if opts.quick:
        out += [harness.QUICK_NOTE, '']
    if not exits_passed:
        out += [f'**Exit latency requirement FAILED: a run of ours took over '
                f'{EXIT_LIMIT_S:.0f} s to exit after its last line.**', '']
    return '\n'.join(out)
