"""Every role and the launcher exit within 5 s of the run reaching its budget, at two budgets.

DQN CartPole as the launcher runs it (1 collector, no evaluator), at 10k and 60k env
steps: the 60k run once idled 36 s in its learner before exiting (issue #32). The
run reaches its budget when both the learner (its gradient-step budget) and the
collector (the table's `run.num_env_steps`) are done; each writes that moment into
its final metrics, the launcher writes when it saw each role exit, and this test
times the launcher's own exit. The 60k run once more with the learner holding the replay
(`distributed.settings.learner_holds_replay`), which must not wait for windows the run
never collects. Slow: three whole runs, about four minutes.
"""

import json
import os
import subprocess
import sys
import time

import pytest

from tests.distributed.conftest import ROOT

pytestmark = [pytest.mark.reverb, pytest.mark.slow, pytest.mark.timeout(900)]
BINDINGS = ['run.eval_interval=0', 'run.final_eval_episodes=0', 'run.best_policy_episodes=0',
            'run.final_video=False']
LIMIT_S = 5.0


def _final_metrics(text):
    lines = [line for line in text.splitlines() if line.startswith('final metrics: ')]
    assert lines, f'no "final metrics:" line in:\n{text[-3000:]}'
    return json.loads(lines[-1].split(':', 1)[1])


@pytest.mark.parametrize('env_steps, held', [(10_000, False), (60_000, False), (60_000, True)],
                         ids=['10k', '60k', '60k-learner-holds-replay'])
def test_every_role_and_the_launcher_exit_promptly_at_the_budget(tmp_path, env_steps, held):
    root = tmp_path / 'run'
    cmd = [sys.executable, '-m', 'app.launch', '--gin_file=configs/dqn_cartpole.gin',
           '--collectors=1', '--no_eval', '--quiet', f'--root_dir={root}',
           f'--gin_bindings=run.num_env_steps={env_steps}',
           f'--gin_bindings=distributed.settings.learner_holds_replay={held}',
           *[f'--gin_bindings={binding}' for binding in BINDINGS]]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    launcher_exited = time.time()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = _final_metrics(done.stdout)
    assert set(metrics['exit_codes'].values()) == {0}
    with open(os.path.join(root, 'collector_0', 'metrics.json')) as metrics_file:
        collector = json.load(metrics_file)
    learner = metrics['learner']
    assert learner['budget_reached_at'] and collector['finished_at'], (learner, collector)
    # The whole gradient-step budget, (env steps - 1,000 initial) x replay ratio 0.5: a learner
    # holding the replay must not stop short for want of windows.
    assert learner['train_steps'] >= (env_steps - 1_000) // 2, learner
    budget_reached = max(learner['budget_reached_at'], collector['finished_at'])
    after = {name: round(at - budget_reached, 1) for name, at in metrics['exited_at'].items()}
    after['launcher'] = round(launcher_exited - budget_reached, 1)
    with open(os.path.join(root, 'logs', 'learner.log')) as log:
        learner_log = ''.join(log.readlines()[-6:])
    late = {name: seconds for name, seconds in after.items() if seconds > LIMIT_S}
    assert not late, (f'exited more than {LIMIT_S:g} s after the run reached its budget: '
                      f'{late} (all: {after}); the learner log ends:\n{learner_log}')
