"""Replay buffers side by side: each of our backends against the TF-Agents class it replaces.

Insert and sample rates, sample latency, priority updates and bytes per stored transition of
every system (bench/buffer_adapters.py) on a vector and an image `Trajectory`, each (system,
data kind) in a process of its own (bench/buffer_systems.py), pinned like the other sections;
what each number means is written out in the section's text (`render`). Run alone:

    .venv/bin/python -m bench.run_all --only buffers --quick   # ~3 min, harness check
    .venv/bin/python -m bench.run_all --only buffers            # full size, ~10 min
"""

import math
import statistics
import sys
import time

from bench import buffer_adapters, buffer_systems, timing

# (system key, what it is); the worker module knows how to build each.
SYSTEMS = [
    ('uniform', '`UniformReplay`'),
    ('tfa_uniform', 'TF-Agents `TFUniformReplayBuffer`'),
    ('prioritized', '`PrioritizedReplay`'),
    ('episodic', '`EpisodicReplay`'),
    ('tfa_episodic', 'TF-Agents `EpisodicReplayBuffer`'),
    ('reverb_uniform', '`ReverbUniformReplay`'),
    ('reverb_prioritized', '`ReverbPrioritizedReplay`'),
    ('tfa_reverb_prioritized', 'TF-Agents `ReverbReplayBuffer`, Prioritized table'),
]
LABELS = dict(SYSTEMS)
# Each of our backends against the TF-Agents class a user would pick instead. Prioritized
# replay in TF-Agents means a Reverb table. `ReverbUniformReplay` has no reference of its own:
# TF-Agents' Reverb path with a Uniform table measured the same observer and dataset again
# (only the table's selector differs, as between our two Reverb backends), within noise.
REFERENCE = {
    'uniform': 'tfa_uniform',
    'prioritized': 'tfa_reverb_prioritized',
    'episodic': 'tfa_episodic',
    'reverb_prioritized': 'tfa_reverb_prioritized',
}
KINDS = ('vector', 'image')
KIND_TITLES = {'vector': 'Vector transitions (CartPole-like: float32[4] observation)',
               'image': 'Image transitions (uint8[84, 84, 4] observation)'}
WORKER_TIMEOUT_S = 600
# Insert rates with 32 envs are compared in interleaved repeats (see `insert_pairs`).
INSERT_CHECKED = ('uniform', 'reverb_prioritized')
INSERT_REPEATS = {'full': 3, 'quick': 1}
MEMORY_LIMIT = 1.1  # image bytes per stored transition / observation bytes, in-process backends


def section(opts):
    """Runs every system on both data kinds; returns the section's markdown."""
    started = time.perf_counter()
    results, failures = {}, []
    for system, _ in SYSTEMS:
        for kind in KINDS:
            try:
                results[system, kind] = run_worker(system, kind, opts)
            except timing.BenchError as error:
                failures.append(f'{system}/{kind}: {str(error).splitlines()[0]}')
                print(f'error: {error}', file=sys.stderr, flush=True)
    try:
        results['insert_pairs'] = insert_pairs(opts)
    except timing.BenchError as error:
        failures.append(f'insert pairs: {str(error).splitlines()[0]}')
        print(f'error: {error}', file=sys.stderr, flush=True)
    text = render(results, failures, opts, time.perf_counter() - started)
    if failures:
        print(text, flush=True)  # what did run, since run_all keeps only the error line
        raise timing.BenchError(f'{len(failures)} buffer runs failed: ' + '; '.join(failures))
    return text


def insert_pairs(opts):
    """{(system, kind): [ours / theirs per pair]}: 32-env insert rates, interleaved.

    Why: the 32-env inserts of images are memcpy-bound in every in-process
    buffer (ours and `TFUniformReplayBuffer` both spend ~70% of the time in
    the same scatter and copy kernels), so their true ratio is near 1, while
    the speed of this VM drifts by more than 10% between processes run a few
    minutes apart (the main runs of two systems are that far apart). Each
    pair runs the two systems back to back, in alternating order (ours first
    in even pairs) so a steady drift cancels, and the check takes the median.
    """
    repeats = INSERT_REPEATS['quick' if opts.quick else 'full']
    pairs = {}
    for system in INSERT_CHECKED:
        for kind in KINDS:
            ratios = []
            for index in range(repeats):
                order = [system, REFERENCE[system]][::1 if index % 2 == 0 else -1]
                rates = {name: run_worker(name, kind, opts, insert_only=True)['insert_32']
                         for name in order}
                ratios.append(ratio(rates[system], rates[REFERENCE[system]]))
            pairs[system, kind] = ratios
    return pairs


def run_worker(system, kind, opts, insert_only=False):
    """Runs one measuring process (`buffer_systems.measure`); returns its result."""
    cmd = timing.call_command('bench.buffer_systems.measure', system, kind, opts.quick,
                              insert_only)
    label = f'buffers {system} {kind}' + (' insert-only' if insert_only else '')
    return timing.child_result(label, timing.pin_prefix(opts.cpus) + cmd, opts.log_dir,
                               env={'TF_CPP_MIN_LOG_LEVEL': '2'}, progress=True,
                               timeout_s=WORKER_TIMEOUT_S)


# -- Rendering ----------------------------------------------------------------------------------


def rate(value):
    """A rate as 1.23M / 456k / 789, or n/a."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return 'n/a'
    for scale, suffix in ((1e6, 'M'), (1e3, 'k')):
        if value >= scale:
            return f'{value / scale:.3g}{suffix}'
    return f'{value:.3g}'


def ratio(ours, theirs):
    return None if not ours or not theirs else ours / theirs


def show_ratio(value):
    return 'n/a' if value is None else f'{value:.2f}x'


def headline_sample(data):
    """The headline read path's rate: the first one listed (the learner's or TF-Agents' own)."""
    return next(iter(data['sample'].values()), None) if data else None


def headline_update(data):
    return next(iter(data['update'].values()), None) if data and data['update'] else None


def memory_cell(data):
    if not data or data.get('bytes_per_transition') is None:
        return 'n/a'
    value = data['bytes_per_transition']
    rss = ' (RSS)' if data['memory_method'].startswith('RSS') else ''
    return f'{value:,.0f} ({value / data["obs_bytes"]:.2f}x obs){rss}'


def render(results, failures, opts, seconds):
    budget = buffer_systems.QUICK if opts.quick else buffer_systems.FULL
    fills = {kind: f'{count:,}' for kind, count in budget['fill'].items()}
    episode = buffer_adapters.EPISODE_LENGTH
    episodes = math.ceil(buffer_adapters.CAPACITY / episode) + buffer_adapters.NUM_ENVS
    out = ['## Replay buffers: insert, sample, latency, memory', '']
    out += [
        'Every backend and the TF-Agents class it replaces, on a vector and an image '
        '`Trajectory` (step_type, observation, action, policy_info=(), next_step_type, '
        'reward, discount, as DQN\'s `collect_data_spec`), capacity 100,000 transitions. '
        f'Each (system, data) pair runs in its own process, {timing.describe_pinning(opts.cpus)}'
        '; TF sizes its thread pools to those cores and Reverb\'s threads share them.', '',
        '- **Insert** (transitions/s): 1 env (batch of 1 per add) and 32 batched envs (batch '
        'of 32 per add) into an empty buffer, through each backend\'s `add` inside a '
        '`tf.function` loop (as our collect loop calls it), TF-Agents\' `add_batch` the same '
        'way, TF-Agents\' `ReverbAddTrajectoryObserver` from Python (it takes unbatched steps, '
        'so 32 envs get 32 observers, as 32 actors would). Reverb inserts are timed until '
        'the server has them (a final flush).',
        '- **Sample** (2-step windows/s, batch 256): ours through the learner\'s path, K=32 '
        '`sample` calls in one `tf.function`, jit-compiled when the backend declares '
        '`capabilities.xla`; '
        'TF-Agents\' classes through their documented `as_dataset(sample_batch_size=256, '
        'num_steps=2)` iterated eagerly (as their examples build it: `num_parallel_calls=3` '
        'and `prefetch(3)` for `TFUniformReplayBuffer`, `prefetch(50)` for Reverb), and also '
        'K times inside a `tf.function`, as TF-Agents\' Learner reads it (the ratios\' '
        '"theirs in tf.function" column).',
        '- **Latency**: one batch of 256 per call, each call timed on its own (for datasets: '
        'one `next`, which prefetching hides).',
        f'- **Filled** before sampling: vectors to {fills["vector"]} transitions, images to '
        f'{fills["image"]}; Reverb tables to {budget["reverb_fill"]:,} of both (inserting runs '
        'at a few thousand '
        'items/s; their samplers\' cost does not depend on table size). Fast inserts wrap '
        'the ring during the insert measurement, so in-process buffers are often full.',
        '- **Priority updates** (keys/s, 256 keys per call): ours as the train chunk calls '
        'them, K=32 calls in one `tf.function`; TF-Agents\' `update_priorities` called '
        'eagerly, its documented use.',
        '- **Bytes per stored transition**: TF variables\' total bytes / '
        'capacity; for Reverb tables and TF-Agents\' episodic buffer (TensorLists grow as '
        'they fill), the process RSS growth while filling / items filled, marked (RSS): '
        'Reverb\'s `server_info` reports item counts but no bytes. Observations are random '
        'bytes: Reverb compresses chunks, which would shrink real frames but not these.',
        f'- Synthetic episodes of {episode} items per env copy (staggered), the LAST -> FIRST '
        'boundary item included. TF-Agents\' `EpisodicReplayBuffer` counts capacity in '
        f'episodes: it gets ceil(100,000 / {episode}) + 32 = {episodes} (100k transitions '
        'plus one slot per env copy for the episodes being written).', '']

    for kind in KINDS:
        out += [f'### {KIND_TITLES[kind]}', '']
        rows = []
        for system, label in SYSTEMS:
            data = results.get((system, kind))
            if data is None:
                rows.append([label] + ['failed'] * 6)
                continue
            lat = data['latency_ms']
            rows.append([label, rate(data['insert_1']), rate(data['insert_32']),
                         rate(headline_sample(data)),
                         f'{lat["p50"]:.2f} / {lat["p99"]:.2f}',
                         rate(headline_update(data)) if data['update'] else '',
                         memory_cell(data)])
        out += [timing.markdown_table(
            ['system', 'insert, 1 env /s', 'insert, 32 envs /s', 'sample windows/s',
             'latency p50 / p99 ms', 'priority updates keys/s', 'bytes per transition'],
            rows), '']

    out += ['### Ratios: each backend against the TF-Agents class it replaces', '',
            'Rate ratios (>1: ours faster). "theirs in tf.function": against TF-Agents\' '
            'dataset iterated K times inside a `tf.function` instead of eagerly. '
            '`ReverbUniformReplay` has no row: it shares its writer and dataset with '
            '`ReverbPrioritizedReplay` (only the table\'s selector differs), as TF-Agents\' '
            'Uniform and Prioritized tables do, so the prioritized pair compares both.', '']
    rows = []
    for system, reference in REFERENCE.items():
        for kind in KINDS:
            ours, theirs = results.get((system, kind)), results.get((reference, kind))
            if not ours or not theirs:
                rows.append([LABELS[system], LABELS[reference], kind] + ['n/a'] * 5)
                continue
            their_fn = list(theirs['sample'].values())[1:2] or [None]
            rows.append([
                LABELS[system], LABELS[reference], kind,
                show_ratio(ratio(ours['insert_1'], theirs['insert_1'])),
                show_ratio(ratio(ours['insert_32'], theirs['insert_32'])),
                show_ratio(ratio(headline_sample(ours), headline_sample(theirs))),
                show_ratio(ratio(headline_sample(ours), their_fn[0])),
                show_ratio(ratio(headline_update(ours), headline_update(theirs)))
                if ours['update'] else ''])
    out += [timing.markdown_table(
        ['backend', 'vs', 'data', 'insert, 1 env', 'insert, 32 envs', 'sample',
         'sample (theirs in tf.function)', 'priority updates'], rows), '']

    pairs = results.get('insert_pairs', {})
    if pairs:
        out += ['### Insert, 32 envs, in interleaved pairs', '',
                'The acceptance checks on insert rates use these, not the single runs '
                'above: each pair runs our backend and the TF-Agents class back to back in '
                'fresh processes (alternating which goes first), because image inserts are '
                'memcpy-bound in both and this VM\'s speed drifts by more than their '
                'difference between runs minutes apart. Ratio per pair, then the median.', '']
        rows = [[LABELS[system], LABELS[REFERENCE[system]], kind,
                 ', '.join(show_ratio(r) for r in ratios),
                 show_ratio(statistics.median([r for r in ratios if r]) if any(ratios) else None)]
                for (system, kind), ratios in pairs.items()]
        out += [timing.markdown_table(['backend', 'vs', 'data', 'pairs', 'median'], rows), '']

    out += ['### Acceptance', '']
    checks = acceptance(results)
    out += [timing.markdown_table(['check', 'measured', 'required', 'result'],
                                  [[c[0], c[1], c[2], c[3]] for c in checks],
                                  aligns='lrrc'), '']
    failed = [c[0] for c in checks if c[3] == 'FAIL']
    if failed:
        out += [f'**{len(failed)} acceptance check(s) FAILED** (see the table above).', '']

    out += ['### Notes', '',
            '- TF-Agents\' `ReverbReplayBuffer` names its `TFClient` with the fixed '
            "`shared_name='rb_tf_client'`, so a second such buffer in one process silently "
            'reuses the first one\'s client and server; once that server is stopped, '
            '`update_priorities` hangs. Each measured process here builds only one.',
            '- `EpisodicReplay` under XLA computes its valid-start mask once per train chunk '
            'when no `add` intervenes (see buffers/episodic.py), which the K=32 loop shows.',
            f'- Section wall time {seconds / 60:.1f} min; each rate is timed for '
            f'{budget["seconds"]:g} s after a warm-up call.', '']
    if opts.quick:
        out += ['**Quick mode: short timings and small fills to test the harness; these '
                'numbers are noisy and not a benchmark.**', '']
    if failures:
        out += ['**Runs that failed:** ' + '; '.join(failures), '']
    return '\n'.join(out)


def acceptance(results):
    """[(check, measured, required, PASS/FAIL/n/a)] for the issue's acceptance ratios."""
    checks = []

    def check(name, value, minimum, fmt=show_ratio, required=None):
        verdict = 'n/a' if value is None else ('PASS' if value >= minimum else 'FAIL')
        checks.append((name, fmt(value), required or f'≥ {minimum:g}x', verdict))

    def vs_reference(headline, system, kind):
        return ratio(headline(results.get((system, kind))),
                     headline(results.get((REFERENCE[system], kind))))

    def insert_ratio(system, kind):
        ratios = [r for r in results.get('insert_pairs', {}).get((system, kind), []) if r]
        return statistics.median(ratios) if ratios else None

    check('`uniform` sample vs `TFUniformReplayBuffer.as_dataset`, vectors',
          vs_reference(headline_sample, 'uniform', 'vector'), 1.5)
    check('`uniform` sample vs `TFUniformReplayBuffer.as_dataset`, images',
          vs_reference(headline_sample, 'uniform', 'image'), 1.0)
    for kind in KINDS:
        check(f'`uniform` insert, 32 envs, vs `TFUniformReplayBuffer.add_batch`, {kind}s '
              '(median of pairs)', insert_ratio('uniform', kind), 1.0)
    check('`prioritized` sample vs TF-Agents Reverb prioritized `as_dataset`, vectors',
          vs_reference(headline_sample, 'prioritized', 'vector'), 25)
    check('`prioritized` sample, vectors, absolute',
          headline_sample(results.get(('prioritized', 'vector'))), 5e5,
          fmt=lambda v: 'n/a' if v is None else f'{rate(v)}/s', required='≥ 500k/s')
    check('`prioritized` 256-key priority updates vs `ReverbReplayBuffer.update_priorities`',
          vs_reference(headline_update, 'prioritized', 'vector'), 20)
    for kind in KINDS:
        check(f'`reverb_prioritized` sample vs `ReverbReplayBuffer.as_dataset`, {kind}s',
              vs_reference(headline_sample, 'reverb_prioritized', kind), 2)
    for kind in KINDS:
        check(f'`reverb_prioritized` insert, 32 envs, vs `ReverbAddTrajectoryObserver`, {kind}s '
              '(median of pairs)', insert_ratio('reverb_prioritized', kind), 2)
    for kind in KINDS:
        check(f'`episodic` sample vs `EpisodicReplayBuffer.as_dataset`, {kind}s',
              vs_reference(headline_sample, 'episodic', kind), 5)
    for system in ('uniform', 'prioritized', 'episodic'):
        data = results.get((system, 'image'))
        value = (data['bytes_per_transition'] / data['obs_bytes']
                 if data and data.get('bytes_per_transition') else None)
        verdict = 'n/a' if value is None else ('PASS' if value <= MEMORY_LIMIT else 'FAIL')
        checks.append((f'`{system}` image bytes per stored transition / observation bytes',
                       'n/a' if value is None else f'{value:.3f}x', f'≤ {MEMORY_LIMIT:g}x',
                       verdict))
    return checks
