"""root_dir/policy_best: the greedy policy with the best confirmed evaluation so far.

The rule, chosen so that one lucky evaluation or a tie never flips it:

1. A periodic evaluation (`run.num_eval_episodes` new episodes) that scores
   strictly above the kept policy's confirmed return makes the policy a
   candidate.
2. The candidate is played on the confirmation episodes: `run.best_policy_episodes`
   episodes from one fixed seed, the same episodes for every candidate.
3. It replaces the kept policy only if its confirmed mean is strictly higher.

So every candidate is compared on the same start states, the selection bias
of a 10-episode evaluation is paid for by a larger, fixed sample, and a policy
at the task's ceiling (CartPole's 500) is never replaced by an equal one.

`policy_best/best.json` (written inside the atomic export) holds the env step,
the periodic evaluation return, and the confirmed return; it is the source of
truth on resume, so a policy exported just before a kill is not forgotten.
"""

import json
import os

from core.export import export_policy

BEST_DIR = 'policy_best'
BEST_FILE = 'best.json'


def read_best(root_dir):
    """policy_best/best.json of a run (None if it has no best policy yet)."""
    try:
        with open(os.path.join(root_dir, BEST_DIR, BEST_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class BestPolicy:
    """Keeps policy_best/ up to date from the run's evaluations (see the module doc)."""

    def __init__(self, root_dir, policy, train_step, confirm, *, unit='env steps', say=print):
        """Args:
          root_dir: the run directory.
          policy: the greedy TF-Agents policy being trained.
          train_step: its train-step variable (exported with it).
          confirm: () -> array of returns on the fixed confirmation episodes.
          unit: what the run's step counts.
          say: prints one line when the best policy changes.
        """
        self._root_dir = root_dir
        self._policy = policy
        self._train_step = train_step
        self._confirm = confirm
        self._key = unit.replace(' ', '_')[:-1]  # 'env_step' or 'train_step'
        self._say = say
        self.best = read_best(root_dir)

    @property
    def directory(self):
        return os.path.join(self._root_dir, BEST_DIR)

    def consider(self, step, eval_return):
        """Called after each periodic evaluation; returns True if policy_best/ was replaced."""
        if self.best is not None and not eval_return > self.best['confirmed_return']:
            return False
        returns = self._confirm()
        confirmed = float(sum(returns) / len(returns))
        if self.best is not None and not confirmed > self.best['confirmed_return']:
            return False
        best = {self._key: int(step), 'train_step': int(self._train_step.numpy()),
                'eval_return': float(eval_return), 'confirmed_return': confirmed,
                'confirmation_episodes': len(returns)}
        export_policy(self._policy, self.directory, self._train_step, best, BEST_FILE)
        self.best = best
        self._say(f"New best policy at {self._key.replace('_', ' ')} {step:,}: "
                  f"{confirmed:.1f} on {len(returns)} confirmation episodes "
                  f"(eval {eval_return:.1f}) -> {self.directory}")
        return True
