"""SAC on Pendulum, end to end: TF-Agents' own SAC example against our train.py.

Same work per env step on both sides: 1 gradient step per env step, batch
256, 256x256 actor and critics, Adam 3e-4 everywhere, tau 0.005 every step,
gamma 0.99, reward scale 1, target entropy -dim(A)/2 (TF-Agents' default),
1,000 initial random steps, replay capacity 100,000, no evaluation inside the
timed difference. The method is dqn_speed's (two budgets per system, rate =
delta env steps / delta wall time, one core); so are the run plumbing and the
exit-latency check, which are reused from there.

The PyTorch peer (bench/pytorch_sac_peer.py, same settings) needs torch,
which requirements.lock does not carry: with `--torch_python` (or
$TORCH_PYTHON) naming a Python that has it, the section runs the peer
pinned the same way and compares against that measurement; without it,
the issue's quoted reference (~100 env steps/s) stands in.
"""

import math
import re
import shutil
import subprocess
import tempfile
import time

from bench import dqn_speed, timing
from bench.dqn_speed import System

TFA_MODULE = 'tf_agents.agents.sac.examples.v2.train_eval'
TFA_INITIAL_COLLECT = 1000
TFA_LOG_INTERVAL = 1000  # its default; budgets are multiples so the last log is the last step
OURS_CONFIG = 'configs/sac_pendulum.gin'
OURS_BINDINGS = [
    # The peer does no best-policy confirmation, end-of-run report or video: same work.
    'run.best_policy_episodes=0', 'run.final_eval_episodes=0', 'run.final_video=False',
    # The example's agent (its defaults, reward scale aside: 0.1 is tuned for MuJoCo).
    'sac.make_agent.actor_fc_layer_params=(256, 256)',
    'sac.make_agent.critic_joint_fc_layer_params=(256, 256)',
    'sac.make_agent.actor_learning_rate=3e-4',
    'sac.make_agent.critic_learning_rate=3e-4',
    'sac.make_agent.alpha_learning_rate=3e-4',
    'sac.make_agent.target_update_tau=0.005',
    'sac.make_agent.target_update_period=1',
    'sac.make_agent.gamma=0.99',
    'sac.make_agent.reward_scale_factor=1.0',
    'sac.make_agent.target_entropy=-0.5',  # SacAgent's default -dim(A)/2 for Pendulum's 1-d A
    'sac.make_agent.initial_log_alpha=0.0',
    'sac.make_agent.gradient_clipping=None',
    'run.initial_collect_steps=1000',
    'run.replay_capacity=100000',
    'run.batch_size=256',
    'run.eval_interval=0',  # no periodic eval (the final one cancels out)
    'run.num_eval_episodes=1',
    'run.export_final_policy=False',
]
# The example's settings that differ from its MuJoCo defaults, bound to the same values.
TFA_BINDINGS = [
    'train_eval.env_name="Pendulum-v1"',
    'train_eval.env_load_fn=@suite_gym.load',
    f'train_eval.initial_collect_steps={TFA_INITIAL_COLLECT}',
    'train_eval.replay_buffer_capacity=100000',
    'train_eval.reward_scale_factor=1.0',
    'train_eval.batch_size=256',
    'train_eval.actor_fc_layers=(256, 256)',
    'train_eval.critic_joint_fc_layers=(256, 256)',
    # Eval fires when step % eval_interval == 0; a huge interval disables it, and the eval
    # before training (which always runs) plays 1 episode.
    'train_eval.eval_interval=1000000000',
    'train_eval.num_eval_episodes=1',
]
# The reference numbers (env steps/s on one core, same settings); not measured here.
REFERENCES = [
    ("TF-Agents' SAC example (reference)", 80),
    ("TF-Agents' SAC Reverb Actor/Learner example (reference)", 45),
    ('a PyTorch SAC (reference)', 100),
    ('prototype on this stack (reference)', 190),
]
PYTORCH_REFERENCE = 100
TARGET_VS_EXAMPLE = 2.2
TARGET_VS_PYTORCH = 1.7

# (N1, N2) per system: env steps for ours, train iterations for the example.
FULL_BUDGETS = {'tfa': (1_000, 5_000), 'ours': (2_000, 14_000)}
QUICK_BUDGETS = {'tfa': (1_000, 2_000), 'ours': (2_000, 5_000)}


def tfa_command(iterations, root_dir):
    if iterations % TFA_LOG_INTERVAL:
        raise ValueError(f'TF-Agents budgets must be multiples of {TFA_LOG_INTERVAL} so that '
                         'its last log line is its last step.')
    # Its main() does not pass num_iterations, so (unlike the DQN example) a binding works.
    bindings = TFA_BINDINGS + [f'train_eval.num_iterations={iterations}']
    return [timing.python(), '-m', TFA_MODULE, f'--root_dir={root_dir}'] + [
        f'--gin_param={binding}' for binding in bindings]


def parse_tfa(result, iterations):
    """(env steps, gradient steps) of an example run; its global step counts gradient steps."""
    dqn_speed.parse_tfa(result, iterations)  # same log format: checks the last step
    return TFA_INITIAL_COLLECT + iterations, iterations


def ours_command(env_steps, root_dir):
    cmd = [timing.python(), 'train.py', f'--gin_file={OURS_CONFIG}', f'--root_dir={root_dir}',
           '--print_metrics', f'--gin_bindings=run.num_env_steps={env_steps}']
    return cmd + [f'--gin_bindings={binding}' for binding in OURS_BINDINGS]


def systems():
    return [
        System('TF-Agents example (sac/examples/v2/train_eval.py)', 'tfa', tfa_command,
               cwd=None, parse=parse_tfa, last_line=r'steps/sec',
               last_line_text='its last log line (`N steps/sec` at the last step)',
               is_reference=True),
        System('ours, train.py (XLA off, as configs/base/sac.gin)', 'ours', ours_command,
               cwd=timing.REPO_ROOT, parse=dqn_speed.parse_ours(False),
               last_line=r'^final metrics: ',
               last_line_text='`final metrics:` (printed when `run()` returns)',
               exit_limit_s=dqn_speed.EXIT_LIMIT_S),
    ]


PEER_SCRIPT = 'bench/pytorch_sac_peer.py'
PEER_STEPS = {'full': (8_000, 3_000), 'quick': (2_500, 1_500)}  # (steps, timing starts at)
PEER_TIMEOUT_S = 900


def measure_peer(opts):
    """The PyTorch peer's env steps/s, or None without --torch_python.

    The peer times itself between two env-step marks after its random warm-up
    (its start-up cancels as in the two-budget method) and prints one line.
    """
    if not getattr(opts, 'torch_python', None):
        return None
    steps, mark = PEER_STEPS['quick' if opts.quick else 'full']
    cmd = timing.pin_prefix(opts.cpus) + [opts.torch_python, PEER_SCRIPT, f'--steps={steps}',
                                          f'--mark={mark}']
    print(f'  [{time.strftime("%H:%M:%S")}] PyTorch peer: {timing.shorten(cmd)}', flush=True)
    try:
        done = subprocess.run(cmd, cwd=timing.REPO_ROOT, capture_output=True, text=True,
                              timeout=PEER_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise timing.BenchError(f'the PyTorch peer did not run ({error}): check '
                                f'--torch_python={opts.torch_python}.') from None
    found = re.search(r'(\d+) env steps .* in ([\d.]+) s = ([\d.]+) env steps/s', done.stdout)
    if done.returncode != 0 or not found:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ['no output']
        raise timing.BenchError(f'the PyTorch peer failed (exit {done.returncode}): {tail[0]}')
    print(f'  [{time.strftime("%H:%M:%S")}] {done.stdout.strip()}', flush=True)
    return {'steps': int(found.group(1)), 'seconds': float(found.group(2)),
            'rate': float(found.group(3)), 'command': cmd}


def section(opts):
    """Runs the comparison; returns its markdown."""
    budgets = QUICK_BUDGETS if opts.quick else FULL_BUDGETS
    scratch = tempfile.mkdtemp(prefix='sac-speed-', dir=opts.scratch_dir)
    try:
        measured = [(system, *dqn_speed.measure(system, budgets[system.key], opts, scratch))
                    for system in systems()]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    peer = measure_peer(opts)
    return render(measured, budgets, opts, peer)


def render(measured, budgets, opts, peer=None):
    example = next(rate.rate for system, rate, _ in measured if system.is_reference)
    ours = next(rate.rate for system, rate, _ in measured if not system.is_reference)
    pytorch = peer['rate'] if peer else PYTORCH_REFERENCE
    pytorch_label = (f'ratio vs PyTorch peer (measured, {pytorch:,.0f}/s)' if peer
                     else f'ratio vs PyTorch reference ({PYTORCH_REFERENCE}/s, quoted)')
    out = ['## SAC on Pendulum: end-to-end env steps/s', '',
           'SAC on Pendulum-v1, 1 gradient step per env step, batch 256, 256×256 actor and '
           'critics, 1,000 initial random steps, the example\'s agent hyperparameters on both '
           f'sides, no evaluation in the timed difference. Every run '
           f'{timing.describe_pinning(opts.cpus)}; same two-budget method as the DQN section '
           '(**env steps/s = Δ env steps / Δ wall time** of the whole process).', '']
    example_cpu = next(rate.rate_per_cpu_s for system, rate, _ in measured if system.is_reference)
    rows = []
    for system, rate, _ in measured:
        per_cpu = rate.rate_per_cpu_s
        rows.append([system.name, f'{rate.delta_steps:,}', f'{rate.delta_s:.1f}',
                     _number(rate.rate), _ratio(rate.rate, example),
                     _ratio(rate.rate, pytorch),
                     'n/a' if not per_cpu or not example_cpu
                     else f'{per_cpu:,.0f} ({per_cpu / example_cpu:.2f}x)'])
    if peer:
        rows.append([f'PyTorch SAC peer ({PEER_SCRIPT}, torch, 1 thread)', f'{peer["steps"]:,}',
                     f'{peer["seconds"]:.1f}', _number(peer['rate']),
                     _ratio(peer['rate'], example), '1.00x', 'n/a'])
    for name, reference in REFERENCES:
        rows.append([f'_{name}_', '', '', f'~{reference}', '', '', ''])
    out += [timing.markdown_table(
        ['system', 'Δ env steps', 'Δ seconds', 'env steps/s', 'ratio vs TF-Agents example',
         pytorch_label, 'env steps per CPU-second (ratio)'], rows), '',
        'The last column divides by Δ CPU time (user + system) instead of Δ wall time: on a '
        'quiet pinned core the two agree; when other jobs share the core, wall time stretches '
        'and CPU time much less, so that column is the steadier comparison.', '']
    if peer:
        out += ['The PyTorch peer runs in its own interpreter (torch is not in '
                'requirements.lock), pinned the same way, and times itself from env step '
                f'{peer["command"][-1].split("=")[1]} to its last step, after its random '
                'warm-up: in-process timing, where ours and the example are timed by the '
                'two-budget method; both leave start-up out.', '']
    out += _verdicts(example, ours, pytorch, measured_peer=bool(peer))
    out += _exit_latency(measured)
    out += _runs_and_commands(measured, budgets, opts, peer)
    if opts.quick:
        out += ['**Quick mode: budgets shrunk to test the harness; these numbers are noisy and '
                'not a benchmark.**', '']
    return '\n'.join(out)


def _number(rate):
    # A run pair whose larger budget finished sooner (a busy machine) has no wall-clock rate.
    return f'{rate:,.0f}' if math.isfinite(rate) and rate > 0 else 'n/a'


def _ratio(rate, reference):
    ok = all(math.isfinite(x) and x > 0 for x in (rate, reference))
    return f'{rate / reference:.2f}x' if ok else 'n/a'


def _verdicts(example, ours, pytorch, measured_peer):
    def verdict(rate, reference, target):
        ratio = _ratio(rate, reference)
        met = ratio != 'n/a' and rate / reference >= target
        return f"{ratio} ({'met' if met else 'NOT met'})"
    if measured_peer:
        peer_line = (f'- Target ≥ {TARGET_VS_PYTORCH}× the PyTorch SAC peer measured above: '
                     f'{verdict(ours, pytorch, TARGET_VS_PYTORCH)}.')
    else:
        peer_line = (f'- Target ≥ {TARGET_VS_PYTORCH}× the PyTorch SAC reference '
                     f'({PYTORCH_REFERENCE} env steps/s, quoted from another machine; run '
                     'with --torch_python to measure the peer here): '
                     f'{verdict(ours, pytorch, TARGET_VS_PYTORCH)}.')
    return [
        f'- Target ≥ {TARGET_VS_EXAMPLE}× the example on one core: '
        f'{verdict(ours, example, TARGET_VS_EXAMPLE)}.',
        peer_line,
        '- The quoted references were measured on another machine: compare the example '
        'measured here with its reference (~80/s).', '']


def _exit_latency(measured):
    rows, failed = [], False
    for system, rate, _ in measured:
        delays = [run.exit_delay_after(system.last_line) for run in (rate.small, rate.large)]
        verdict = ''
        if system.exit_limit_s is not None:
            ok = all(d is not None and d <= system.exit_limit_s for d in delays)
            verdict, failed = ('PASS' if ok else 'FAIL'), failed or not ok
        rows.append([system.name, system.last_line_text,
                     ', '.join('n/a' if d is None else f'{d:.1f}' for d in delays), verdict])
    out = ['### Process exit latency', '', timing.markdown_table(
        ['system', 'measured from', 'seconds to exit (N1, N2 run)',
         f'≤ {dqn_speed.EXIT_LIMIT_S:.0f} s'], rows, aligns='lllc'), '']
    if failed:
        out += ['**Exit latency requirement FAILED.**', '']
    return out


def _runs_and_commands(measured, budgets, opts, peer):
    rows = []
    for system, rate, grads in measured:
        for run, steps, grad, budget in zip((rate.small, rate.large),
                                            (rate.small_steps, rate.large_steps), grads,
                                            budgets[system.key]):
            rows.append([system.name, f'{budget:,}', f'{steps:,}', f'{grad:,}',
                         f'{run.wall_s:.1f}'])
    out = ['### Runs', '', timing.markdown_table(
        ['system', 'budget', 'env steps', 'gradient steps', 'wall s'], rows), '',
        'Budgets are `num_iterations` for the example (1 env step + 1 gradient step each, after '
        f'{TFA_INITIAL_COLLECT:,} random steps) and `run.num_env_steps` for ours (initial random '
        'steps included).', '', '### Commands', '',
        'N2 runs shown; `ROOT` is a fresh temporary directory per run.', '', '```']
    for system, _, _ in measured:
        cmd = timing.pin_prefix(opts.cpus) + system.build(budgets[system.key][1], 'ROOT')
        out.append(f"# {system.name}{'' if system.cwd else ' (any directory)'}")
        out.append(timing.shorten(cmd))
    if peer:
        out.append('# PyTorch SAC peer (its own venv: pip install torch numpy<2 gymnasium)')
        out.append(timing.shorten(peer['command']))
    return out + ['```', '']
