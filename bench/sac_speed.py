"""SAC on Pendulum, end to end: TF-Agents' own SAC example against our train.py.

Same work per env step on both sides (the example's agent, bound on ours: OURS_BINDINGS),
measured like DQN (bench/harness.py, bench/dqn_speed.py). The PyTorch peer
(bench/pytorch_sac_peer.py) needs torch, which requirements.lock does not carry: with
`--torch_python` (or $TORCH_PYTHON) the section measures it pinned the same way; without it,
the issue's quoted reference (~100 env steps/s) stands in.
"""

import math
import re
import time

from bench import dqn_speed, harness, timing

TFA_MODULE = 'tf_agents.agents.sac.examples.v2.train_eval'
TFA_INITIAL_COLLECT = dqn_speed.TFA_INITIAL_COLLECT  # as parse_tfa counts env steps
OURS_CONFIG = 'configs/sac_pendulum.gin'
OURS_BINDINGS = harness.NO_EXTRA_WORK + [
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
PYTORCH_REFERENCE = 100
REFERENCES = [("TF-Agents' SAC example (reference)", 80),
              ('a PyTorch SAC (reference)', PYTORCH_REFERENCE)]
TARGET_VS_EXAMPLE = 2.2
TARGET_VS_PYTORCH = 1.7

# (N1, N2) per system: env steps for ours, train iterations for the example.
FULL_BUDGETS = {'tfa': (1_000, 5_000), 'ours': (2_000, 14_000)}
QUICK_BUDGETS = {'tfa': (1_000, 2_000), 'ours': (2_000, 5_000)}


def tfa_command(iterations, root_dir):
    # Its main() does not pass num_iterations, so (unlike the DQN example) a binding works.
    bindings = TFA_BINDINGS + [f'train_eval.num_iterations={iterations}']
    return dqn_speed.tfa_base(TFA_MODULE, iterations, root_dir) + [
        f'--gin_param={binding}' for binding in bindings]


def systems():
    return [dqn_speed.tfa_system('TF-Agents example (sac/examples/v2/train_eval.py)',
                                 tfa_command),
            harness.train_system('ours, train.py (XLA off, as configs/base/sac.gin)',
                                 OURS_CONFIG, OURS_BINDINGS, uses_xla=False,
                                 exit_limit_s=dqn_speed.EXIT_LIMIT_S)]


PEER_SCRIPT = 'bench/pytorch_sac_peer.py'
PEER_STEPS = {'full': (8_000, 3_000), 'quick': (2_500, 1_500)}  # (steps, timing starts at)
PEER_TIMEOUT_S = 900
PEER_RATE = r'(\d+) env steps .* in ([\d.]+) s = ([\d.]+) env steps/s'


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
    run = timing.timed_run('PyTorch peer', cmd, log_dir=opts.log_dir, timeout_s=PEER_TIMEOUT_S)
    line = run.last_match(PEER_RATE)
    if not line:
        raise timing.BenchError(f'the PyTorch peer printed no rate (log: {run.log_path})')
    print(f'  [{time.strftime("%H:%M:%S")}] {line[1]}', flush=True)
    found = re.search(PEER_RATE, line[1])
    return {'steps': int(found.group(1)), 'seconds': float(found.group(2)),
            'rate': float(found.group(3)), 'command': cmd}


def section(opts):
    """Runs the comparison; returns its markdown."""
    budgets = QUICK_BUDGETS if opts.quick else FULL_BUDGETS
    measured = harness.measure(systems(), budgets, opts, 'sac-speed-')
    return render(measured, opts, measure_peer(opts))


def render(measured, opts, peer=None):
    example = next(item.rate for item in measured if item.system.is_reference)
    ours = next(item.rate.rate for item in measured if not item.system.is_reference)
    pytorch = peer['rate'] if peer else PYTORCH_REFERENCE
    pytorch_label = (f'ratio vs PyTorch peer (measured, {pytorch:,.0f}/s)' if peer
                     else f'ratio vs PyTorch reference ({PYTORCH_REFERENCE}/s, quoted)')
    out = ['## SAC on Pendulum: end-to-end env steps/s', '',
           'SAC on Pendulum-v1, 1 gradient step per env step, batch 256, 256×256 actor and '
           'critics, 1,000 initial random steps, the example\'s agent hyperparameters on both '
           f'sides, no evaluation in the timed difference. Every run '
           f'{timing.describe_pinning(opts.cpus)}; same two-budget method as the DQN section '
           '(**env steps/s = Δ env steps / Δ wall time** of the whole process).', '']
    rows = []
    for item in measured:
        rate, per_cpu = item.rate, item.rate.rate_per_cpu_s
        rows.append([item.system.name, f'{rate.delta_steps:,}', f'{rate.delta_s:.1f}',
                     _number(rate.rate), _ratio(rate.rate, example.rate),
                     _ratio(rate.rate, pytorch),
                     'n/a' if not per_cpu or not example.rate_per_cpu_s
                     else f'{per_cpu:,.0f} ({per_cpu / example.rate_per_cpu_s:.2f}x)'])
    if peer:
        rows.append([f'PyTorch SAC peer ({PEER_SCRIPT}, torch, 1 thread)', f'{peer["steps"]:,}',
                     f'{peer["seconds"]:.1f}', _number(peer['rate']),
                     _ratio(peer['rate'], example.rate), '1.00x', 'n/a'])
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
    def verdict(rate, reference, target):
        ratio = _ratio(rate, reference)
        met = ratio != 'n/a' and rate / reference >= target
        return f"{ratio} ({'met' if met else 'NOT met'})"
    peer_text = ('the PyTorch SAC peer measured above' if peer else
                 f'the PyTorch SAC reference ({PYTORCH_REFERENCE} env steps/s, quoted from '
                 'another machine; run with --torch_python to measure the peer here)')
    out += [f'- Target ≥ {TARGET_VS_EXAMPLE}× the example on one core: '
            f'{verdict(ours, example.rate, TARGET_VS_EXAMPLE)}.',
            f'- Target ≥ {TARGET_VS_PYTORCH}× {peer_text}: '
            f'{verdict(ours, pytorch, TARGET_VS_PYTORCH)}.',
            '- The quoted references were measured on another machine: compare the example '
            'measured here with its reference (~80/s).', '']
    exits, exits_passed = harness.exit_latency_table(measured, dqn_speed.EXIT_LIMIT_S)
    out += ['### Process exit latency', '', exits, '']
    if not exits_passed:
        out += ['**Exit latency requirement FAILED.**', '']
    peer_lines = ['# PyTorch SAC peer (its own venv: pip install torch numpy<2 gymnasium)',
                  timing.shorten(peer['command'])] if peer else []
    out += harness.runs_section(
        measured, opts, 'Budgets are `num_iterations` for the example (1 env step + 1 gradient '
        f'step each, after {TFA_INITIAL_COLLECT:,} random steps) and `run.num_env_steps` for '
        'ours (initial random steps included).', peer_lines)
    if opts.quick:
        out += [harness.QUICK_NOTE, '']
    return '\n'.join(out)


def _number(rate):
    # A run pair whose larger budget finished sooner (a busy machine) has no wall-clock rate.
    return f'{rate:,.0f}' if math.isfinite(rate) and rate > 0 else 'n/a'


def _ratio(rate, reference):
    ok = all(math.isfinite(x) and x > 0 for x in (rate, reference))
    return f'{rate / reference:.2f}x' if ok else 'n/a'

