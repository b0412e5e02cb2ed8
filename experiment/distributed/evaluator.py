"""The eval role: the latest weights, played greedily every `run.eval_interval` env steps.

The x axis of every distributed summary is the replay table's insert count:
transitions written by all collectors (one window per env step). The
evaluator polls it, and each time it crosses a multiple of
`run.eval_interval` pulls the newest weights and plays `run.num_eval_episodes`
episodes with the greedy policy, exactly as the single-process run does, so
"env steps to reach the target return" means the same in both modes.

It ends after a final evaluation once the collectors are done and the learner
has stopped changing the weights (it reached its budget, or pushed nothing new
for three timeouts), followed by the single-process run's end-of-run report on
the final weights (`run.final_eval_episodes` seeded episodes, evaluation.json);
or, with `run.stop_at_target_return`, at the first evaluation at or above
`run.target_return`.
"""

import time

from core import rundir, seeds, tags
from experiment import takeaway
from experiment.distributed import common, config, tables, tier
from experiment.distributed.waiting import Stopped, Watchdog, retry
from experiment.judging import Judging, eval_env
from experiment.run_state import RunState

_POLL_S = 1.0


class _Eval:
    """The greedy policy, its eval env and the weights' train step."""

    def __init__(self, role, settings, params, *, address, seed, root_dir):
        self.role, self.settings, self.params = role, settings, params
        self.agent, self.train_step, _ = common.build_agent(params, seed=seed)
        # Listed once (TF-Agents walks the policy's modules on every `variables()` call).
        self.policy_variables = tuple(self.agent.policy.variables())
        self.env = eval_env(params.num_eval_episodes, seeds.evaluation(seed))
        # As a single-process run judges its policy (root_dir/policy_best included); the x
        # axis counts transitions inserted, i.e. env steps.
        self.judging = Judging(root_dir, self.agent.policy, self.env, config=params, seed=seed,
                               train_step=self.train_step, unit='env steps', say=role.log)
        self.evaluator, self.best = self.judging.evaluator, self.judging.best
        self.tier = tier.ReplayTier(tier.parse_addresses(address, settings.replay_shards),
                                    timeout_s=settings.timeout_s, settings=settings)
        self.store = tables.WeightStore(self.tier.weights_address, timeout_s=settings.timeout_s)
        self.whom = self.tier.describe()
        self.policy_step = None
        self.report = None  # the end-of-run report's summary, once written

    def inserted(self):
        return retry(self.role,
                     lambda: self.tier.counters()['inserted'],
                     what='reading the replay table', whom=self.whom,
                     timeout_s=self.settings.timeout_s)

    def pull(self):
        """Loads the newest weights; returns their train step (None: nothing pushed yet)."""
        pulled = retry(self.role, self.store.pull, what='pulling weights', whom=self.whom,
                       timeout_s=self.settings.timeout_s)
        if pulled is not None:
            values, self.policy_step = pulled
            tables.assign(self.policy_variables, values)
            self.train_step.assign(self.policy_step)
        return self.policy_step


def main(root_dir, *, address, seed=0, force=False, verbose=True):
    """Evaluates until the run is over (see the module doc); returns the final metrics."""
    params, settings, role, directory = common.start_role('eval', root_dir, force=force,
                                                          seed=seed)
    evaluation = _Eval(role, settings, params, address=address, seed=seed, root_dir=root_dir)
    run_state = RunState()
    summaries = common.RateSummaries(directory)
    watchdog = Watchdog(role)
    role.install_signal_handlers()
    start = time.monotonic()
    try:
        _loop(evaluation, role, settings, params, run_state, summaries, watchdog,
              directory=directory, root_dir=root_dir, start=start, verbose=verbose)
    except Stopped:
        pass
    finally:
        watchdog.close()
        role.restore_signal_handlers()
        summaries.close()
        evaluation.env.close()
        evaluation.judging.close()
    metrics = _metrics(run_state, evaluation, start)
    rundir.write_metrics(directory, metrics)
    return metrics


def _metrics(run_state, evaluation, start):
    return {'final_eval_return': run_state.last_eval_return,
            'best_eval_return': run_state.best_eval_return,
            'best_policy': evaluation.best.best if evaluation.best else None,
            'steps_to_target': run_state.steps_to_target,
            'last_eval_env_step': run_state.last_eval_step,
            'policy_train_step': evaluation.policy_step,
            'final_report': evaluation.report,
            'wall_time_s': time.monotonic() - start}


def _loop(evaluation, role, settings, params, run_state, summaries, watchdog, *, directory,
          root_dir, start, verbose):
    budget = params.num_env_steps
    interval = params.eval_interval or budget  # 0: only the final evaluation
    target, max_steps = params.target_return, config.max_train_steps(params)
    next_eval, last_change = interval, (None, time.monotonic())
    while True:
        with watchdog.waiting('reading the replay table', evaluation.whom):
            inserted = evaluation.inserted()
        finished = inserted >= budget
        if inserted >= next_eval or finished:
            with watchdog.waiting('pulling weights', evaluation.whom):
                step = evaluation.pull()
            if step != last_change[0]:
                last_change = (step, time.monotonic())
            learner_done = step is not None and (
                step >= max_steps or time.monotonic() - last_change[1] > 3 * settings.timeout_s)
            if step is not None and (inserted >= next_eval or (finished and learner_done)):
                average_return = _evaluate(evaluation, run_state, summaries, inserted, target)
                if verbose:
                    role.log(f"env step {inserted:>10,}/{budget:,} | train step {step:,} | "
                             f"eval return {average_return:8.1f} | "
                             f"{time.monotonic() - start:6.0f} s")
                rundir.write_metrics(directory, _metrics(run_state, evaluation, start))
                next_eval = (inserted // interval + 1) * interval
                if params.stop_at_target_return and run_state.steps_to_target is not None:
                    role.log(f"reached the target return {target:g}: stopping")
                    return
                if finished and learner_done:
                    _final_report(evaluation, role, params, root_dir)
                    return
        role.sleep(_POLL_S)


def _final_report(evaluation, role, params, root_dir):
    """The single-process run's end-of-run report on the learner's final weights, written
    where a single-process run writes it: root_dir/evaluation.json, beside policy_best/."""
    if not params.final_eval_episodes:
        return
    role.log(f"final report: {params.final_eval_episodes} seeded episodes")
    report = evaluation.judging.final_report(root_dir, params.final_eval_episodes, role.log)
    evaluation.report = takeaway.report_metrics(report)


def _evaluate(evaluation, run_state, summaries, env_step, target):
    average_return, average_length = evaluation.evaluator()
    run_state.record_eval(env_step, average_return, target)
    if evaluation.best is not None:
        evaluation.best.consider(env_step, average_return)
    summaries.write(env_step, {tags.EVAL_AVERAGE_RETURN: average_return,
                               tags.EVAL_AVERAGE_EPISODE_LENGTH: average_length,
                               'eval/train_step': evaluation.policy_step})
    return average_return

