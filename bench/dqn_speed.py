"""DQN on CartPole, end to end: TF-Agents' own example against our train.py.

Same work per env step on both sides: 1 gradient step per env step, batch
64, a Q-network with one hidden layer of 100 units, 1,000 initial random
steps, replay capacity 100,000, no evaluation inside the timed difference.
Each system runs twice (budgets N1 < N2); the rate is
(env steps of run 2 - env steps of run 1) / (wall time of run 2 - run 1),
so start-up, tracing/compilation, the initial collection, the eval that each
system always does (before training in the example, after it in ours) and
process exit cancel out. Periodic work each system does by default stays in:
the example's per-iteration summaries, logging and checkpoints (every 5k/10k/
20k train steps), our summaries (every 1k env steps) and checkpoints (every
10k env steps, replay included).
"""

import dataclasses
import json
import re
import shutil
import tempfile

from bench import timing

TFA_MODULE = 'tf_agents.agents.dqn.examples.v2.train_eval'
TFA_INITIAL_COLLECT = 1000  # train_eval's default; env steps before iteration 1
TFA_LOG_INTERVAL = 1000  # its default; budgets are multiples so the last log is the last step
OURS_CONFIG = 'configs/dqn_cartpole.gin'
OURS_BINDINGS = [
    # The peer does no best-policy confirmation, end-of-run report or video: same work.
    'run.best_policy_episodes=0', 'run.final_eval_episodes=0', 'run.final_video=False',
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
    'run.eval_interval=0',  # no periodic eval (the final one cancels out)
    'run.num_eval_episodes=1',  # keeps that final eval short and alike in both runs
    'run.export_final_policy=False',
]
EXIT_LIMIT_S = 5.0  # ours must exit within this long after its last line

# (N1, N2) per system: env steps for ours, train iterations for the example.
FULL_BUDGETS = {'tfa': (1_000, 26_000), 'ours': (5_000, 105_000)}
QUICK_BUDGETS = {'tfa': (1_000, 2_000), 'ours': (2_000, 12_000)}


@dataclasses.dataclass
class System:
    name: str
    key: str  # which budget pair
    build: object  # (budget, root_dir) -> command without the pinning prefix
    cwd: str
    parse: object  # (RunResult, budget) -> (env steps, gradient steps); checks the run
    last_line: str  # regex of the line the exit latency is measured from
    last_line_text: str
    is_reference: bool = False
    exit_limit_s: float = None


def tfa_command(iterations, root_dir):
    if iterations % TFA_LOG_INTERVAL:
        raise ValueError(f'TF-Agents budgets must be multiples of {TFA_LOG_INTERVAL} so that '
                         'its last log line is its last step.')
    return [timing.python(), '-m', TFA_MODULE, f'--root_dir={root_dir}',
            f'--num_iterations={iterations}',  # a flag: a gin binding for it is overridden
            '--gin_param=train_eval.env_name="CartPole-v1"',
            # Eval fires when step % eval_interval == 0; 0 would mean every step
            # (numpy's int64 % 0 is 0), so a huge interval disables it.
            '--gin_param=train_eval.eval_interval=1000000000',
            # The eval before training always runs; 1 episode keeps it short.
            '--gin_param=train_eval.num_eval_episodes=1']


def parse_tfa(result, iterations):
    match = result.last_match(r'step = (\d+), loss')
    if match is None:
        raise timing.BenchError(f'{result.label}: no "step = N" line (log: {result.log_path})')
    train_steps = int(re.search(r'step = (\d+)', match[1]).group(1))
    if train_steps != iterations:
        raise timing.BenchError(f'{result.label}: last logged step {train_steps}, expected '
                                f'{iterations} (log: {result.log_path})')
    return TFA_INITIAL_COLLECT + iterations, train_steps


def ours_command(use_xla):
    def build(env_steps, root_dir):
        cmd = [timing.python(), 'train.py', f'--gin_file={OURS_CONFIG}', f'--root_dir={root_dir}',
               '--print_metrics', f'--gin_bindings=run.num_env_steps={env_steps}']
        bindings = OURS_BINDINGS + [f'run.use_xla={use_xla}']
        return cmd + [f'--gin_bindings={binding}' for binding in bindings]
    return build


def parse_ours(use_xla):
    def parse(result, budget):
        match = result.last_match(r'^final metrics: ')
        if match is None:
            raise timing.BenchError(f'{result.label}: no "final metrics:" line '
                                    f'(log: {result.log_path})')
        metrics = json.loads(match[1].split(':', 1)[1])
        problems = []
        if metrics['env_steps'] < budget or metrics['interrupted']:
            problems.append(f"stopped at {metrics['env_steps']} env steps")
        if bool(metrics['uses_xla']) != use_xla:
            problems.append(f"uses_xla={metrics['uses_xla']}, asked for {use_xla}")
        if metrics['unused_bindings']:
            problems.append(f"unused bindings {metrics['unused_bindings']}")
        if problems:
            raise timing.BenchError(f'{result.label}: ' + '; '.join(problems))
        return metrics['env_steps'], metrics['train_steps']
    return parse


def train_system(name, config, bindings, *, uses_xla):
    """One variant of our train.py: `config` with Gin `bindings`; budgets count env steps."""
    def build(env_steps, root_dir):
        cmd = [timing.python(), 'train.py', f'--gin_file={config}', f'--root_dir={root_dir}',
               '--print_metrics', f'--gin_bindings=run.num_env_steps={env_steps}']
        return cmd + [f'--gin_bindings={binding}' for binding in bindings]
    return System(name, 'ours', build, cwd=timing.REPO_ROOT, parse=parse_ours(uses_xla),
                  last_line=r'^final metrics: ', last_line_text='`final metrics:`')


def systems():
    ours_last = r'^final metrics: '
    return [
        System('TF-Agents example (dqn/examples/v2/train_eval.py)', 'tfa', tfa_command,
               cwd=None, parse=parse_tfa, last_line=r'steps/sec',
               last_line_text='its last log line (`N steps/sec` at the last step)',
               is_reference=True),
        System('ours, train.py, XLA on', 'ours', ours_command(True), cwd=timing.REPO_ROOT,
               parse=parse_ours(True), last_line=ours_last,
               last_line_text='`final metrics:` (printed when `run()` returns)',
               exit_limit_s=EXIT_LIMIT_S),
        System('ours, train.py, XLA off', 'ours', ours_command(False), cwd=timing.REPO_ROOT,
               parse=parse_ours(False), last_line=ours_last,
               last_line_text='`final metrics:` (printed when `run()` returns)',
               exit_limit_s=EXIT_LIMIT_S),
    ]


def measure(system, budgets, opts, scratch):
    """Runs `system` at both budgets; returns (TwoBudgetRate, gradient steps pair)."""
    runs, steps, grads = [], [], []
    for budget in budgets:
        label = f'{system.name} N={budget:,}'
        root_dir = tempfile.mkdtemp(prefix='run-', dir=scratch)
        cmd = timing.pin_prefix(opts.cpus) + system.build(budget, root_dir)
        result = timing.timed_run(label, cmd, cwd=system.cwd or scratch, log_dir=opts.log_dir)
        env_steps, grad_steps = system.parse(result, budget)
        shutil.rmtree(root_dir, ignore_errors=True)
        runs.append(result)
        steps.append(env_steps)
        grads.append(grad_steps)
    return timing.TwoBudgetRate(runs[0], runs[1], steps[0], steps[1], system.last_line), grads


def section(opts):
    """Runs the comparison; returns its markdown."""
    budgets = QUICK_BUDGETS if opts.quick else FULL_BUDGETS
    scratch = tempfile.mkdtemp(prefix='dqn-speed-', dir=opts.scratch_dir)
    try:
        measured = [(system, *measure(system, budgets[system.key], opts, scratch))
                    for system in systems()]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    reference = next(rate.rate for system, rate, _ in measured if system.is_reference)
    return render(measured, reference, budgets, opts)


def render(measured, reference, budgets, opts):
    out = ['## DQN on CartPole: end-to-end env steps/s', '']
    out.append(
        'DQN on CartPole-v1, 1 gradient step per env step, batch 64, Q-network with one '
        'hidden layer of 100 units, 1,000 initial random steps, no evaluation in the timed '
        f'difference. Every run {timing.describe_pinning(opts.cpus)}. Each system ran twice '
        'with different step budgets; **env steps/s = Δ env steps / Δ wall time** of the '
        'whole process, so start-up, tracing/XLA compilation, initial collection, the eval '
        'each system always does once, and exit cancel out.')
    out.append('')
    reference_to_last = next(rate.rate_to_last_line for system, rate, _ in measured
                             if system.is_reference)
    rows, noisy = [], False
    for system, rate, _ in measured:
        to_last = rate.rate_to_last_line
        mark = ' †' if rate.delta_s < rate.small.wall_s else ''
        noisy = noisy or bool(mark)
        rows.append([system.name, f'{rate.delta_steps:,}', f'{rate.delta_s:.1f}{mark}',
                     f'{rate.rate:,.0f}', f'{rate.rate / reference:.2f}x',
                     'n/a' if to_last is None or not reference_to_last
                     else f'{to_last:,.0f} ({to_last / reference_to_last:.2f}x)'])
    out += [timing.markdown_table(
        ['system', 'Δ env steps', 'Δ seconds', 'env steps/s', 'ratio vs TF-Agents example',
         'env steps/s to last line (ratio)'], rows), '']
    if noisy:
        out += ['† Δ seconds is shorter than the whole N1 run, so start-up noise can dominate '
                'this rate: use the full budgets on a quiet machine.', '']
    out += ['The last column times each run to its last output line instead of its exit '
            '(see exit latency below): the same method without the noise of a slow, '
            'variable exit.', '']
    xla = {system.name: rate.rate for system, rate, _ in measured}
    on, off = xla.get('ours, train.py, XLA on'), xla.get('ours, train.py, XLA off')
    if on and off:
        out += [f'XLA buys {on / off:.2f}x end to end ({on:,.0f} vs {off:,.0f} env steps/s; '
                'only our train chunk is compiled, collection never is).', '']

    out += ['### Process exit latency', '',
            'Time from the last line a run prints to the moment the process has exited '
            f'(every run above). Requirement: ours exits within {EXIT_LIMIT_S:.0f} s.', '']
    rows = []
    verdicts = []
    for system, rate, _ in measured:
        delays = [run.exit_delay_after(system.last_line) for run in (rate.small, rate.large)]
        shown = ', '.join('n/a' if d is None else f'{d:.1f}' for d in delays)
        verdict = ''
        if system.exit_limit_s is not None:
            ok = all(d is not None and d <= system.exit_limit_s for d in delays)
            verdict = 'PASS' if ok else 'FAIL'
            verdicts.append(ok)
        rows.append([system.name, system.last_line_text, shown, verdict])
    out += [timing.markdown_table(
        ['system', 'measured from', 'seconds to exit (N1, N2 run)', f'≤ {EXIT_LIMIT_S:.0f} s'],
        rows, aligns='lllc'), '']

    out += ['### Runs', '']
    rows = []
    for system, rate, grads in measured:
        for run, steps, grad, budget in zip((rate.small, rate.large),
                                            (rate.small_steps, rate.large_steps), grads,
                                            budgets[system.key]):
            rows.append([system.name, f'{budget:,}', f'{steps:,}', f'{grad:,}',
                         f'{run.wall_s:.1f}'])
    out += [timing.markdown_table(
        ['system', 'budget', 'env steps', 'gradient steps', 'wall s'], rows), '',
        'Budgets are `--num_iterations` for the example (1 env step + 1 gradient step each, '
        f'after {TFA_INITIAL_COLLECT:,} random steps) and `run.num_env_steps` for ours '
        '(initial random steps included); env and gradient steps are read back from each '
        "run's output.", '']

    out += ['### Commands', '', 'N2 runs shown; `ROOT` is a fresh temporary directory per run.',
            '', '```']
    for system, rate, _ in measured:
        cmd = timing.pin_prefix(opts.cpus) + system.build(budgets[system.key][1], 'ROOT')
        where = '' if system.cwd else '(any directory) '
        out.append(f'# {system.name} {where}'.rstrip())
        out.append(timing.shorten(cmd))
    out += ['```', '']

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
        out += ['**Quick mode: budgets shrunk to test the harness; these numbers are noisy and '
                'not a benchmark.**', '']
    if verdicts and not all(verdicts):
        out += [f'**Exit latency requirement FAILED: a run of ours took over '
                f'{EXIT_LIMIT_S:.0f} s to exit after its last line.**', '']
    return '\n'.join(out)
