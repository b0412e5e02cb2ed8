"""The two-budget method every end-to-end section measures with, and its shared tables.

A system runs twice, with step budgets N1 < N2, each run a whole training process timed from
start to exit (bench/timing.py), and its rate is

    env steps/s = (env steps of run 2 - env steps of run 1)
                  / (wall time of run 2 - wall time of run 1),

so everything that does not scale with the budget -- interpreter and TF start-up, tracing and
XLA compilation, initial random collection, the one eval each system always does, the final
checkpoint and process exit -- cancels. Only what happens per step (collection, training,
summaries, periodic checkpoints) is left. Env and gradient steps are read back from each run's
output, never assumed from the budget. The same runs also give the process exit latency: the
time from the last line a run prints to its exit, read from its time-stamped output.
"""

import dataclasses
import json
import shutil
import tempfile

from bench import timing

FINAL_METRICS = r'^final metrics: '  # train.py --print_metrics' last line
# What no timed run of ours does (the TF-Agents examples and peers do none of it either): the
# best-policy confirmation, the end-of-run report and video, and periodic evals (the one final
# eval, kept to 1 episode, is alike in both runs and cancels out).
NO_EXTRA_WORK = ['run.best_policy_episodes=0', 'run.final_eval_episodes=0',
                 'run.final_video=False', 'run.eval_interval=0', 'run.num_eval_episodes=1']
# The distributed roles' periodic checkpoints, off in timed runs as one process's are
# (`run.checkpoint_interval`): a replay server's checkpoint holds its tables while it is
# written (0.3 s for 20k Pong transitions), and whether one lands inside a timed window
# would be chance. Every role still writes its final checkpoint, as one process does.
NO_PERIODIC_CHECKPOINTS = ['distributed.settings.learner_checkpoint_interval=1000000000',
                           'distributed.settings.server_checkpoint_interval_s=1e9']
QUICK_NOTE = ('**Quick mode: budgets shrunk to test the harness; these numbers are noisy and not '
              'a benchmark.**')


@dataclasses.dataclass
class TwoBudgetRate:
    """env steps/s from two runs that differ only in their step budget."""
    small: timing.RunResult
    large: timing.RunResult
    small_steps: int
    large_steps: int
    last_line: str = None  # regex of each run's last line, for the rate that excludes exit

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
    def fixed_s(self):
        """Seconds of a run that its budget does not explain (start-up, tracing and XLA
        compilation, the initial collection's difference, the final eval, exit): the small
        run's wall time less its env steps at the rate."""
        return self.small.wall_s - self.small_steps / self.rate if self.rate > 0 else None

    @property
    def rate_to_last_line(self):
        """Like rate, each run timed to its last `last_line` line instead of its exit."""
        ends = [run.last_match(self.last_line) if self.last_line else None
                for run in (self.small, self.large)]
        delta = None if None in ends else ends[1][0] - ends[0][0]
        return None if not delta or delta <= 0 else self.delta_steps / delta

    @property
    def rate_per_cpu_s(self):
        """Like rate, over CPU time: less sensitive to other jobs sharing the core."""
        if self.small.cpu_s is None or self.large.cpu_s is None:
            return None
        delta = self.large.cpu_s - self.small.cpu_s
        return self.delta_steps / delta if delta > 0 else None


@dataclasses.dataclass
class System:
    """One measured program: how to launch it at a budget and read its steps back."""
    name: str
    build: object  # (budget, root_dir) -> command without the pinning prefix
    parse: object  # (RunResult, budget) -> (env steps, gradient steps); checks the run
    key: str = 'ours'  # which budget pair, when budgets differ per kind of system
    cwd: str = timing.REPO_ROOT  # None: a scratch directory (the program runs anywhere)
    last_line: str = FINAL_METRICS  # regex of the line the exit latency is measured from
    last_line_text: str = '`final metrics:` (printed when `run()` returns)'
    is_reference: bool = False
    exit_limit_s: float = None
    cpus: str = None  # None: the --cpus option

    def command(self, budget, root_dir, opts):
        return timing.pin_prefix(self.cpus or opts.cpus) + self.build(budget, root_dir)


@dataclasses.dataclass
class Measured:
    system: System
    rate: TwoBudgetRate
    budgets: tuple
    grads: tuple  # gradient steps of the N1 and N2 runs


def measure(systems, budgets, opts, prefix):
    """Runs every system at both of its budgets, in order; returns [Measured].

    `budgets`: one (N1, N2) pair, or a dict of pairs by `System.key`.
    """
    scratch = tempfile.mkdtemp(prefix=prefix)
    measured = []
    try:
        for system in systems:
            pair = budgets[system.key] if isinstance(budgets, dict) else budgets
            runs, steps = [], []
            for budget in pair:
                root_dir = tempfile.mkdtemp(prefix='run-', dir=scratch)
                result = timing.timed_run(f'{system.name} N={budget:,}',
                                          system.command(budget, root_dir, opts),
                                          cwd=system.cwd or scratch, log_dir=opts.log_dir)
                steps.append(system.parse(result, budget))  # (env steps, gradient steps)
                shutil.rmtree(root_dir, ignore_errors=True)
                runs.append(result)
            rate = TwoBudgetRate(*runs, steps[0][0], steps[1][0], system.last_line)
            measured.append(Measured(system, rate, tuple(pair), (steps[0][1], steps[1][1])))
        return measured
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# -- Our train.py -------------------------------------------------------------------------------


def final_metrics(result):
    """The JSON of a run's `final metrics:` line (train.py or app.launch with --print_metrics)."""
    match = result.last_match(FINAL_METRICS)
    if match is None:
        raise timing.BenchError(f'{result.label}: no "final metrics:" line '
                                f'(log: {result.log_path})')
    return json.loads(match[1].split(':', 1)[1])


def train_system(name, config, bindings, *, uses_xla=None, **fields):
    """One variant of our train.py on `config` with Gin `bindings`; budgets count env steps
    (initial random steps included).

    Its runs are refused if they did other work: stopped early, compiled otherwise than asked
    (`uses_xla` None: not checked), or left a binding unused.
    """
    def build(env_steps, root_dir):
        cmd = [timing.python(), 'train.py', f'--gin_file={config}', f'--root_dir={root_dir}',
               '--print_metrics', f'--gin_bindings=run.num_env_steps={env_steps}']
        return cmd + [f'--gin_bindings={binding}' for binding in bindings]

    def parse(result, budget):
        metrics = final_metrics(result)
        problems = []
        if metrics['env_steps'] < budget or metrics['interrupted']:
            problems.append(f"stopped at {metrics['env_steps']} env steps")
        if uses_xla is not None and bool(metrics['uses_xla']) != uses_xla:
            problems.append(f"uses_xla={metrics['uses_xla']}, asked for {uses_xla}")
        if metrics['unused_bindings']:
            problems.append(f"unused bindings {metrics['unused_bindings']}")
        if problems:
            raise timing.BenchError(f'{result.label}: ' + '; '.join(problems))
        return metrics['env_steps'], metrics['train_steps']
    return System(name, build, parse, **fields)


# -- Tables every end-to-end section shows ------------------------------------------------------


def exit_latency_table(measured, limit_s):
    """(markdown table, every limited system passed) of each run's seconds to exit."""
    rows, passed = [], True
    for item in measured:
        system, rate = item.system, item.rate
        delays = [run.exit_delay_after(system.last_line) for run in (rate.small, rate.large)]
        verdict = ''
        if system.exit_limit_s is not None:
            ok = all(d is not None and d <= system.exit_limit_s for d in delays)
            verdict, passed = ('PASS' if ok else 'FAIL'), passed and ok
        rows.append([system.name, system.last_line_text,
                     ', '.join('n/a' if d is None else f'{d:.1f}' for d in delays), verdict])
    return timing.markdown_table(
        ['system', 'measured from', 'seconds to exit (N1, N2 run)', f'≤ {limit_s:.0f} s'],
        rows, aligns='lllc'), passed


def runs_section(measured, opts, note, extra_commands=(), commands_of=None):
    """### Runs (every run's budget, steps and wall time, then `note`) and ### Commands (the N2
    command of every system in `commands_of`, default `measured`, then `extra_commands`
    lines), as markdown lines."""
    rows = []
    for item in measured:
        rate = item.rate
        for run, steps, grad, budget in zip((rate.small, rate.large),
                                            (rate.small_steps, rate.large_steps), item.grads,
                                            item.budgets):
            rows.append([item.system.name, f'{budget:,}', f'{steps:,}', f'{grad:,}',
                         f'{run.wall_s:.1f}'])
    out = ['### Runs', '', timing.markdown_table(
        ['system', 'budget', 'env steps', 'gradient steps', 'wall s'], rows), '', note, '',
        '### Commands', '', 'N2 runs shown; `ROOT` is a fresh temporary directory per run.',
        '', '```']
    for item in measured if commands_of is None else commands_of:
        out.append(f"# {item.system.name}{'' if item.system.cwd else ' (any directory)'}")
        out.append(timing.shorten(item.system.command(item.budgets[1], 'ROOT', opts)))
    return out + list(extra_commands) + ['```', '']
