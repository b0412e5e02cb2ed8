"""Learning curves: eval return vs env steps, mean +- std band per configuration.

Read from each trial's event files (the summary step is the env-step count),
so the plot shows what TensorBoard shows. Seeds are aligned on their eval
steps; a step only some seeds reached averages those seeds.
"""

import csv
import glob
import io
import os
import tempfile

import numpy as np

from core import rundir, tags

PNG_NAME = 'curves.png'
CSV_NAME = 'curves.csv'


def read_scalar(run_dir, tag=tags.EVAL_AVERAGE_RETURN):
    """[(step, value), ...] of one tag from run_dir/tb, sorted by step.

    A step written twice (a resumed run repeats the events after its last
    checkpoint) keeps the later value.
    """
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.util import tensor_util

    by_step = {}
    for path in sorted(glob.glob(os.path.join(run_dir, 'tb', 'events.out.tfevents.*'))):
        for event in event_file_loader.EventFileLoader(path).Load():
            for value in event.summary.value:
                if value.tag != tag:
                    continue
                if value.HasField('tensor'):
                    by_step[event.step] = float(tensor_util.make_ndarray(value.tensor))
                else:
                    by_step[event.step] = float(value.simple_value)
    return sorted(by_step.items())


def aggregate(curves):
    """Mean, std and count over seeds at every step any seed has.

    Args:
      curves: one [(step, value), ...] list per seed.

    Returns:
      (steps, mean, std, count) as numpy arrays.
    """
    steps = sorted({step for curve in curves for step, _ in curve})
    lookups = [dict(curve) for curve in curves]
    mean, std, count = [], [], []
    for step in steps:
        values = [lookup[step] for lookup in lookups if step in lookup]
        mean.append(np.mean(values))
        std.append(np.std(values))
        count.append(len(values))
    return np.array(steps), np.array(mean), np.array(std), np.array(count)


def collect(config_results):
    """{label: (steps, mean, std, count)} for configurations with local event files."""
    aggregated = {}
    for result in config_results:
        curves = [read_scalar(run.root_dir) for run in result.runs
                  if os.path.isdir(os.path.join(run.root_dir, 'tb'))]
        curves = [curve for curve in curves if curve]
        if curves:
            aggregated[result.label] = aggregate(curves)
    return aggregated


def write(sweep_dir, title, config_results):
    """Writes curves.csv and curves.png under the sweep dir; returns the PNG path or None."""
    aggregated = collect(config_results)
    rundir.atomic_write_text(os.path.join(sweep_dir, CSV_NAME), _csv_text(aggregated))
    if not aggregated:
        return None
    path = os.path.join(sweep_dir, PNG_NAME)
    plot(aggregated, title, path)
    return path


def _csv_text(aggregated):
    out = io.StringIO()
    writer = csv.writer(out, lineterminator='\n')
    writer.writerow(['config', 'env_steps', 'eval_return_mean', 'eval_return_std', 'seeds'])
    for label, (steps, mean, std, count) in aggregated.items():
        for row in zip(steps, mean, std, count):
            writer.writerow([label, int(row[0]), float(row[1]), float(row[2]), int(row[3])])
    return out.getvalue()


def plot(aggregated, title, path, references=None):
    """Mean ± std curves per label, plus horizontal reference lines {label: value}; atomic."""
    import matplotlib

    matplotlib.use('Agg')  # no display on servers and CI
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5))
    for label, (steps, mean, std, _) in aggregated.items():
        (line,) = axes.plot(steps, mean, marker='.', label=label)
        axes.fill_between(steps, mean - std, mean + std, color=line.get_color(), alpha=0.2)
    for index, (label, value) in enumerate((references or {}).items()):
        axes.axhline(value, linestyle=('--', ':', '-.')[index % 3], color='gray', label=label)
    axes.set_xlabel('env steps')
    axes.set_ylabel(f'{tags.EVAL_AVERAGE_RETURN} (mean ± std over seeds)')
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(fontsize='small')
    figure.tight_layout()
    fd, tmp_path = tempfile.mkstemp(dir=os.path.dirname(path), prefix='.tmp-', suffix='.png')
    os.close(fd)
    try:
        figure.savefig(tmp_path, dpi=100)
        os.replace(tmp_path, path)
    finally:
        plt.close(figure)
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
