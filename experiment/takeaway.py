"""What a finished run leaves its user: the end-of-run report, the final video, the summary.

The report plays the final and the best policy on the same seeded episodes
(`evaluation.json`); the video shows the best policy (the final one without a
best); the summary says where all of it is and how to look at it. The Trainer
calls these once, after its close-out, never on an interrupted run.
"""

import json
import os

from core import rundir, seeds
from experiment import eval_report
from experiment.evaluation import play_episodes, saved_actor
from experiment.video import record_video

# The report's episodes: the same for every run and seed (reports of different runs
# compare), never a training, evaluation or confirmation seed.
EVALUATION_FILE = 'evaluation.json'


def final_report(root_dir, env, final_act, best, say, explore=lambda act: act):
    """Plays `final_act` and the kept best policy on `env` from seeds.REPORT -> evaluation.json.

    Args:
      root_dir: the run directory.
      env: batched eval env, one copy per report episode.
      final_act: the final greedy policy as a numpy `act`.
      best: the run's `BestPolicy` (or None).
      say: prints a line.
      explore: wraps an `act` with the run's evaluation epsilon (run.eval_epsilon), so
        the best policy is played as the final one is.

    Returns:
      The report dict (what evaluation.json holds).
    """
    players = {'final': final_act}
    if best is not None and best.best is not None:
        players['best'] = explore(saved_actor(best.directory))
    report = {}
    for name, act in players.items():
        returns, lengths = play_episodes(env, act, seed=seeds.REPORT)
        report[name] = eval_report.summarize(returns, lengths, seed=seeds.REPORT)
        say(eval_report.summary_line(f"{name} policy", report[name]))
    if 'best' in report:
        report['best_minus_final'] = eval_report.paired_difference(
            report['best']['returns'], report['final']['returns'])
        say(eval_report.difference_line('best', 'final', report['best_minus_final']))
        report['best']['policy'] = best.best
    rundir.atomic_write_text(os.path.join(root_dir, EVALUATION_FILE),
                             json.dumps(report, indent=1))
    return report


def final_video(root_dir, step, final_act, best, explore=lambda act: act):
    """One episode of the best policy (else the final one) under videos/; returns its path."""
    if best is not None and best.best is not None:
        act, name = explore(saved_actor(best.directory)), 'best'
    else:
        act, name = final_act, 'final'
    return record_video(act, os.path.join(root_dir, 'videos', f'{name}_at_{step:08d}'),
                        seed=seeds.REPORT)


def report_metrics(report):
    """The report without its per-episode lists, for metrics.json."""
    return {name: {key: value for key, value in part.items()
                   if key not in ('returns', 'lengths')}
            for name, part in report.items()}


def summary_lines(root_dir, step, unit, *, report, best, video_path):
    """Where everything a user takes away is, and how to look at it."""
    lines = [f"Done at {unit[:-1]} {step:,}: {root_dir}"]
    final = (report or {}).get('final')
    if final and os.path.isdir(os.path.join(root_dir, 'policy')):
        lines.append(f"  final policy  {os.path.join(root_dir, 'policy')}  "
                     f"{final['mean']:.1f} ± {final['std']:.1f} on {final['episodes']} "
                     "report episodes")
    if best is not None and best.best is not None:
        text = ''
        if report and 'best' in report:
            part = report['best']
            text = (f"{part['mean']:.1f} ± {part['std']:.1f} on {part['episodes']} report "
                    "episodes, ")
        key = unit.replace(' ', '_')[:-1]
        lines.append(f"  best policy   {best.directory}  {text}from "
                     f"{unit[:-1]} {best.best[key]:,}")
    if report:
        lines.append(f"  report        {os.path.join(root_dir, EVALUATION_FILE)}")
    lines.append(f"  metrics       {os.path.join(root_dir, 'metrics.json')}")
    if video_path:
        lines.append(f"  video         {video_path}")
    lines.append(f"  TensorBoard   tensorboard --logdir {os.path.join(root_dir, 'tb')}")
    return lines
