"""Distributed runs learn to the single-process bars (slow: several minutes each): SAC Pendulum
(>= -200 within 20k env steps) with one replay server, and SAC Pendulum and DQN CartPole (>= 475
within 50k) over 2 and 4 replay shards, uniform and prioritized."""

import json
import subprocess
import sys

import pytest

from tests.distributed.conftest import ROOT

pytestmark = [pytest.mark.reverb, pytest.mark.slow, pytest.mark.timeout(3600)]


def _launch_to_target(tmp_path, config, *bindings, bar, budget, collectors=2):
    """Runs the launcher with `collectors` collectors until the target return; checks the bar;
    returns the final metrics."""
    cmd = [sys.executable, '-m', 'app.launch', f'--gin_file={config}',
           f'--collectors={collectors}',
           f'--root_dir={tmp_path / "run"}', '--gin_bindings=run.stop_at_target_return=True',
           *[f'--gin_bindings={binding}' for binding in bindings]]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith('final metrics: '))
    metrics = json.loads(line.split(': ', 1)[1])
    evaluation = metrics['eval']
    assert evaluation['steps_to_target'] is not None, evaluation
    assert evaluation['steps_to_target'] <= budget and evaluation['best_eval_return'] >= bar
    assert set(metrics['exit_codes'].values()) == {0}, metrics['exit_codes']
    return metrics


def test_two_collectors_reach_minus_200_within_the_budget(tmp_path):
    _launch_to_target(tmp_path, 'configs/sac_pendulum_distributed.gin', bar=-200, budget=20_000)


def test_recurrent_dqn_with_one_collector_reaches_the_cartpole_bar(tmp_path):
    """R2D2 on CartPole without velocities, distributed: the collector carries its policy
    state, the learner samples stored sequences from the replay server (docs/recurrent.md)."""
    metrics = _launch_to_target(tmp_path, 'configs/r2d2_cartpole_pomdp.gin',
                                'run.target_return=450.0', bar=450, budget=300_000,
                                collectors=1)
    assert metrics['eval']['best_policy']['confirmed_return'] >= 450


SHARDED = [  # (config, shards, replay backend, bar, env-step budget): every combination
    (config, shards, backend, bar, budget)
    for config, bar, budget in [('configs/sac_pendulum_distributed.gin', -200, 20_000),
                                ('configs/dqn_cartpole.gin', 475, 50_000)]
    for shards in (2, 4)
    for backend in ('@ReverbUniformReplay', '@ReverbPrioritizedReplay')
]


@pytest.mark.parametrize('config, shards, backend, bar, budget', SHARDED,
                         ids=[f'{c.split("/")[1][:-4]}-{k}-shards-{b[7:-6].lower()}'
                              for c, k, b, _, _ in SHARDED])
def test_sharded_replay_reaches_the_single_process_bar(tmp_path, config, shards, backend, bar,
                                                        budget):
    metrics = _launch_to_target(tmp_path, config, f'distributed.settings.replay_shards={shards}',
                                f'run.replay_backend={backend}', bar=bar, budget=budget)
    # Every shard held its share of the run's windows.
    assert len(metrics['replay']) == shards
    inserted = [shard['inserted'] for shard in metrics['replay']]
    assert min(inserted) >= 0.9 * max(inserted), inserted
