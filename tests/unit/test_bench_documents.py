"""The benchmark documents' plumbing: section replacement in place, and the scaling model."""

import pytest

from bench import run_all, scaling

DOCUMENT = '\n'.join([
    '# Benchmarks', '', 'header', '',
    run_all.marker('a'), '## A', 'old a', '',
    run_all.marker('b'), '## B', 'old b', '',
    '_Whole run: 3.0 min._', ''])


def test_update_replaces_only_the_named_section_and_keeps_the_rest():
    new = run_all.replace_sections(DOCUMENT, {'a': run_all.marker('a') + '\n## A\nnew a\n'})
    assert 'new a' in new and 'old a' not in new
    assert new.index('new a') < new.index('## B') < new.index('old b') < new.index('_Whole run')
    assert new.startswith('# Benchmarks\n\nheader\n')


def test_update_adds_a_missing_section_before_the_closing_line():
    new = run_all.replace_sections(DOCUMENT, {'c': run_all.marker('c') + '\n## C\nc\n'})
    assert new.index('old b') < new.index('## C') < new.index('_Whole run')
    assert 'old a' in new


def test_update_needs_the_sections_it_names():
    with pytest.raises(SystemExit):
        run_all.parse_args(['--update'])
    with pytest.raises(SystemExit):
        run_all.parse_args(['--update', '--only', 'scaling', '--quick'])


def test_scaling_model_follows_from_the_measured_costs():
    phases = [{'kind': 'insert', 'cpu_ms_per_1000': 20.0},
              {'kind': 'insert', 'cpu_ms_per_1000': 30.0},  # the costliest is used
              {'kind': 'sample', 'cpu_ms_per_1000': 5.0}]
    row = scaling.model_row('w', ratio=0.5, batch_size=64, collector=1_000.0, learner=400.0,
                            alone=500.0, sampling=32_000.0, phases=phases)
    # 400 gradient steps/s at 0.5 per env step: 800 env steps/s, 0.8 collectors of 1,000.
    assert row['collectors'] == pytest.approx(0.8)
    # 800 inserts/s x 30 us + 400 x 64 samples/s x 5 us = 0.024 + 0.128 cores.
    assert row['server_cores'] == pytest.approx(0.152)
    # A learner at 10x the gradient steps alone: 5,000 steps/s, 10,000 env steps/s.
    assert row['fast_collectors'] == pytest.approx(10.0)
    assert row['fast_input_cores'] == pytest.approx(5_000 * 64 / 32_000)
    assert row['per_10k'] == pytest.approx(1e4 * (30 + 0.5 * 64 * 5) / 1e6)


def test_a_learner_holding_the_replay_costs_the_server_one_insert_and_one_sample_per_window():
    phases = [{'kind': 'insert', 'cpu_ms_per_1000': 30.0},
              {'kind': 'sample', 'cpu_ms_per_1000': 10.0}]
    row = scaling.held_model_row('w', ratio=0.5, collector=1_000.0, held=400.0, alone=500.0,
                                 sampling=100_000.0, phases=phases)
    # 400 steps/s at ratio 0.5: 800 env steps/s, 0.8 collectors; 800 x 40 us = 0.032 cores.
    assert row['collectors'] == pytest.approx(0.8)
    assert row['server_cores'] == pytest.approx(0.032)
    assert row['per_10k'] == pytest.approx(0.4)
    # 10x the single-process 500: 10,000 env steps/s, 10 collectors, 0.4 server cores, and
    # an intake of 10,000 windows/s at 100,000 per core.
    assert row['fast_collectors'] == pytest.approx(10.0)
    assert row['fast_server_cores'] == pytest.approx(0.4)
    assert row['fast_input_cores'] == pytest.approx(0.1)


def test_scaling_writes_its_table_between_the_markers_only(tmp_path):
    doc = tmp_path / 'distributed.md'
    doc.write_text(f'before\n\n{scaling.BEGIN_MARK}\n\nold table\n\n{scaling.END_MARK}\n\nafter\n')
    row = scaling.model_row('DQN X', 1.0, 32, 100.0, 50.0, 60.0, 10_000.0,
                            [{'kind': 'insert', 'cpu_ms_per_1000': 10.0},
                             {'kind': 'sample', 'cpu_ms_per_1000': 2.0}])
    held = scaling.held_model_row('DQN Y', 1.0, 100.0, 55.0, 60.0, 10_000.0,
                                  [{'kind': 'insert', 'cpu_ms_per_1000': 10.0},
                                   {'kind': 'sample', 'cpu_ms_per_1000': 2.0}])
    scaling.update_distributed_doc([row], [held], path=str(doc))
    text = doc.read_text()
    assert 'old table' not in text and '| DQN X |' in text
    assert text.index(scaling.HELD_TITLE) < text.index('| DQN Y |') < text.index(scaling.END_MARK)
    assert text.startswith('before\n') and text.endswith(f'{scaling.END_MARK}\n\nafter\n')


def test_scaling_refuses_a_document_without_its_markers(tmp_path):
    doc = tmp_path / 'distributed.md'
    doc.write_text('no markers\n')
    with pytest.raises(Exception, match='scaling-model'):
        scaling.update_distributed_doc([], path=str(doc))
    assert doc.read_text() == 'no markers\n'


def test_a_learner_step_splits_into_training_sampling_and_the_rest():
    # 100 steps/s = 10 ms; training alone at 200/s = 5 ms; 64 windows at 32,000/s = 2 ms.
    training, sampling, rest = scaling.step_split(
        {'learner': 100.0, 'alone': 200.0, 'batch_size': 64, 'windows_per_sec': 32_000.0})
    assert (training, sampling) == pytest.approx((5.0, 2.0))
    assert rest == pytest.approx(3.0)


def _measured(system, small_s, large_s, steps=(1_000, 4_000), grads=(500, 2_000)):
    from bench import harness, timing

    def run(wall_s):
        return timing.RunResult('x', ['cmd'], wall_s, 0, [], '/dev/null')
    rate = harness.TwoBudgetRate(run(small_s), run(large_s), *steps)
    return harness.Measured(system, rate, (1_000, 4_000), grads)


def test_the_end_to_end_section_reports_medians_ranges_and_the_bar_against_the_best():
    from bench import distributed, timing

    opts = timing.parse_options(timing.options_parser('x'), [])
    workload = distributed.WORKLOADS[0]
    systems = distributed.systems(workload)
    # 3,000 env steps more in the large run; seconds more per run give each system's rates.
    # The leaders (overlap, and the held learner on 2 threads) ran three times, the rest once.
    extra_s = {0: (30,), 1: (20, 20, 21), 2: (22,), 3: (15, 16, 17), 4: (19, 19, 19)}
    assert [s.name.split(': ')[1] for s in systems[2:]] == [
        'distributed, 1 collector', 'distributed, 1 collector, learner holds the replay',
        'distributed, 1 collector, learner holds the replay, learner_tf_threads=2']
    per_system = [[_measured(system, 10, 10 + s) for s in extra_s[i]]
                  for i, system in enumerate(systems)]
    text = distributed.render([(workload, per_system)], opts)
    row = next(line for line in text.splitlines() if '| distributed, 1 collector |' in line)
    # One run: 3,000/22 = 136 against the better one process, overlap's median 3,000/20 = 150.
    assert '| 1 | 136 |' in row and '0.91×' in row and 'FAIL (≥ 0.95×)' in row
    row = next(line for line in text.splitlines() if 'learner holds the replay |' in line)
    # Three runs, 176-200 (median 188): 1.25x, and every resampled ratio clears the bar.
    assert '| 3 | 188 | 176–200 (±6%) |' in row and '1.25×' in row and 'PASS (≥ 0.95×)' in row
    row = next(line for line in text.splitlines() if 'learner_tf_threads=2 |' in line)
    # 158 against overlap's runs of 143-150 (median 150): 1.05x, resampled 1.05-1.11x.
    assert '| 158 |' in row and '1.05×' in row and '1.05–1.11×' in row
    assert 'PASS (≥ 0.95×)' in row
    assert text.count('# SAC Pendulum: one process\n') == 1  # each command shown once
    assert 'distributed.settings.learner_holds_replay=True' in text  # the held systems' commands


def test_a_ratio_whose_interval_reaches_below_the_bar_passes_on_its_median_only():
    from bench import distributed

    assert distributed.ratio_interval([100, 101], [100, 100, 100]) is None  # too few runs
    low, high = distributed.ratio_interval([96, 100, 104, 92, 108], [100, 100, 100])
    assert 0.92 <= low < 0.96 < 1.04 < high <= 1.08
    assert distributed.verdict(1.0, (low, high), 0.95).startswith('median only')
    assert distributed.verdict(1.0, (0.96, 1.04), 0.95) == 'PASS (≥ 0.95×)'
    assert distributed.verdict(0.9, None, 0.95) == 'FAIL (≥ 0.95×)'


def test_an_interval_prints_rounded_outwards_so_it_never_seems_to_touch_a_bar_it_misses():
    from bench import distributed

    assert distributed.interval_text((0.947, 1.081)) == '0.94–1.09×'
    assert distributed.interval_text((0.57, 1.15)) == '0.57–1.15×'  # exact ends stay


def test_only_the_first_rounds_leaders_run_again_in_alternating_order(monkeypatch):
    from bench import distributed, harness, timing

    opts = timing.parse_options(timing.options_parser('x'), [])
    workload = distributed.PONG[0]
    seconds = {'one process': 40, 'one process, overlap_collection': 30,
               'distributed, 1 collector': 35, 'distributed, 1 collector, learner_tf_threads=2': 31,
               'distributed, 1 collector, learner_tf_threads=2, other_roles_niceness=19': 33}
    calls = []

    def fake_measure(systems, budgets, opts, prefix):
        calls.append([s.name.split(': ')[1] for s in systems])
        return [_measured(s, 10, 10 + seconds[s.name.split(': ')[1]]) for s in systems]
    monkeypatch.setattr(harness, 'measure', fake_measure)
    per_system = distributed.measure(workload, opts)
    assert calls[0] == list(seconds)
    leaders = ['one process, overlap_collection', 'distributed, 1 collector, learner_tf_threads=2']
    # Rounds 2, 3, ...: the distributed leader first, then the one process first, and so on.
    assert workload.rounds >= 3
    assert calls[1:] == [leaders[::-1] if index % 2 else leaders
                         for index in range(1, workload.rounds)]
    assert [len(runs) for runs in per_system] == [1, workload.rounds, 1, workload.rounds, 1]


def test_the_pong_section_has_its_own_title_and_its_distributed_systems():
    from bench import distributed, timing

    opts = timing.parse_options(timing.options_parser('x'), [])
    workload = distributed.PONG[0]
    systems = distributed.systems(workload)
    assert [s.name for s in systems] == ['DQN Pong: one process',
                                         'DQN Pong: one process, overlap_collection',
                                         'DQN Pong: distributed, 1 collector',
                                         'DQN Pong: distributed, 1 collector, '
                                         'learner_tf_threads=2',
                                         'DQN Pong: distributed, 1 collector, '
                                         'learner_tf_threads=2, other_roles_niceness=19']
    per_system = [[_measured(system, 10, 10 + s) for s in seconds]
                  for system, seconds in zip(systems, ((40,), (30, 34, 32), (31, 33, 32), (50,),
                                                       (45,)))]
    text = distributed.render([(workload, per_system)], opts,
                              title='## Distributed: DQN Pong')
    assert text.startswith('## Distributed: DQN Pong\n') and '90% interval' in text
    row = next(line for line in text.splitlines() if '| distributed, 1 collector |' in line)
    # Median 3,000/32 = 94 against overlap's 3,000/32 = 94: 1.00x, at the 0.95x bar, but
    # resampling the three runs of each reaches 0.94x.
    assert '| 94 |' in row and '1.00×' in row and 'median only (≥ 0.95×' in row
    row = next(line for line in text.splitlines() if 'learner_tf_threads=2 |' in line)
    assert '| 60 |' in row and '0.64×' in row and 'FAIL (≥ 0.95×)' in row
    assert 'distributed.settings.learner_tf_threads=2' in text  # its command
    row = next(line for line in text.splitlines() if 'other_roles_niceness=19 |' in line)
    assert '| 67 |' in row and '0.71×' in row and 'FAIL (≥ 0.95×)' in row
    assert 'distributed.settings.other_roles_niceness=19' in text


def test_the_latency_section_takes_the_median_of_the_learners_rounds():
    from bench import latency, timing

    opts = timing.parse_options(timing.options_parser('x'), [])
    results = {0: {'learner': [100, 80, 120], 'held': [200, 210, 190], 'collector': 4000},
               1: {'learner': [90, 95, 200], 'held': [205, 200, 195], 'collector': 3000},
               5: {'learner': [99, 60, 90], 'held': [150, 170, 160], 'collector': 1000}}
    text = latency.render([('SAC Pendulum', results)], opts)
    median_row, range_row, held_row, held_range, collector_row = [
        line for line in text.splitlines() if line.startswith('| SAC Pendulum')]
    assert '| 100 | 95 | 90 | 0.90× |' in median_row
    assert '| 80–120 | 90–200 | 60–99 |' in range_row
    assert '| learner holding the replay, gradient steps/s (median) | 200 | 200 | 160 | 0.80× |' \
        in held_row
    assert '| 190–210 | 195–205 | 150–170 |' in held_range
    assert '| 4,000 | 3,000 | 1,000 | 0.25× |' in collector_row


def test_the_learner_alone_section_shows_the_learner_holding_the_replay_where_it_can():
    from bench import learner_alone, timing

    opts = timing.parse_options(timing.options_parser('x'), [])
    rows = [{'name': 'SAC Pendulum', 'learner': 120.0, 'held': 200.0, 'alone': 210.0,
             'xla': False, 'windows_per_sec': 102_400.0, 'batch_size': 256},
            {'name': 'DQN Pong (LZ4 frames)', 'learner': 42.0, 'held': None, 'alone': 38.0,
             'xla': False, 'windows_per_sec': 16_000.0, 'batch_size': 32}]
    text = learner_alone.render(rows, opts)
    row = next(line for line in text.splitlines() if line.startswith('| SAC Pendulum'))
    assert '| 120 | 210 | 0.57× | 200 | 0.95× | 102,400 | 400 |' in row
    row = next(line for line in text.splitlines() if line.startswith('| DQN Pong'))
    assert '| n/a (frames) |  |' in row
