"""How a run judges its policy: the periodic evaluator and the kept best policy.

The single-process Trainer and the distributed evaluator set these up the same
way from the same config, so "best policy" and "eval return" mean the same in
both modes: evaluation episodes on `seeds.evaluation(seed)`, the policy's own
randomness on `seeds.evaluation_actions(seed)`, and a best-policy candidate
confirmed on the fixed `seeds.CONFIRMATION` episodes.
"""

import gin

from core import seeds
from envs.suite import make_env
from experiment import takeaway
from experiment.best_policy import BestPolicy
from experiment.evaluation import Evaluator, play_episodes


def eval_env(num_envs, seed):
    """`num_envs` copies of the run's env as evaluation makes them (Gin scope 'eval')."""
    with gin.config_scope('eval'):
        return make_env(num_envs=num_envs, seed=seed)


class Judging:
    """A greedy policy's evaluator and (with `best_policy_episodes`) its best-policy keeper."""

    def __init__(self, root_dir, policy, env, *, config, seed, train_step, unit, say):
        """Args:
          root_dir: the run directory (policy_best/ goes there).
          policy: the greedy policy being trained.
          env: the evaluation env (`eval_env(config.num_eval_episodes, ...)`).
          config: the run's `_TrainingConfig` (eval_epsilon, best_policy_episodes).
          seed: the run seed.
          train_step: the gradient-step counter saved with the best policy.
          unit: what the step axis counts ('env steps' or 'train steps').
          say: prints one line.
        """
        self.evaluator = Evaluator(env, policy, config.eval_epsilon,
                                   seeds.evaluation_actions(seed))
        self.best, self._confirm_env = None, None
        if config.best_policy_episodes:
            self._confirm_env = eval_env(config.best_policy_episodes, seeds.CONFIRMATION)
            self.best = BestPolicy(
                root_dir, policy, train_step, unit=unit, say=say,
                confirm=lambda: play_episodes(self._confirm_env, self.evaluator.act,
                                              seed=seeds.CONFIRMATION)[0])

    def final_report(self, root_dir, episodes, say):
        """The end-of-run report: the final (and kept best) policy on `episodes` seeded
        episodes from seeds.REPORT, written to root_dir/evaluation.json; returns it."""
        env = eval_env(episodes, seeds.REPORT)
        try:
            return takeaway.final_report(root_dir, env, self.evaluator.act, self.best, say,
                                         explore=self.evaluator.explore)
        finally:
            env.close()

    def close(self):
        if self._confirm_env is not None:
            self._confirm_env.close()
