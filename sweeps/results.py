"""The sweep's table: mean +- std over seeds of each configuration's final metrics.

The numbers come from each trial's own metrics.json (for searches, from the
copy stored with the Optuna trial, so every machine sharing a study can print
the whole table). std is numpy's population std (ddof=0): with 2-3 seeds it is
a description of the spread, not an estimate of it.
"""

import csv
import dataclasses
import io
import os

import numpy as np

from core import rundir

CSV_NAME = 'results.csv'
MARKDOWN_NAME = 'results.md'
# (metrics.json key, markdown header, number format)
COLUMNS = (
    ('final_eval_return', 'final eval return', '{:.2f}'),
    ('best_eval_return', 'best eval return', '{:.2f}'),
    ('steps_to_target', 'env steps to target', '{:,.0f}'),
    ('wall_time_s', 'wall time (s)', '{:.1f}'),
)


@dataclasses.dataclass
class SeedRun:
    """One finished trial: its seed, metrics.json contents and root_dir."""

    seed: int
    metrics: dict
    root_dir: str


@dataclasses.dataclass
class ConfigResult:
    """A configuration and its finished seeds."""

    label: str
    params: tuple  # ((binding key, value), ...)
    runs: list = dataclasses.field(default_factory=list)
    num_seeds: int = 0  # seeds planned


def summarize(result):
    """One table row: {column: value}, None where there is nothing to show."""
    row = {'config': result.label, 'seeds_done': len(result.runs),
           'seeds_planned': result.num_seeds}
    for key, _, _ in COLUMNS:
        values = [run.metrics.get(key) for run in result.runs]
        values = [float(value) for value in values if value is not None]
        row[f'{key}_mean'] = float(np.mean(values)) if values else None
        row[f'{key}_std'] = float(np.std(values)) if values else None
    row['steps_to_target_reached'] = sum(
        run.metrics.get('steps_to_target') is not None for run in result.runs)
    return row


def csv_text(config_results, param_names):
    """The CSV table: one row per configuration, a column per swept binding; blank = none."""
    rows = [summarize(result) for result in config_results]
    stat_columns = [f'{key}_{stat}' for key, _, _ in COLUMNS for stat in ('mean', 'std')]
    fields = (['config'] + list(param_names.values()) + ['seeds_done', 'seeds_planned']
              + stat_columns + ['steps_to_target_reached'])
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator='\n')
    writer.writeheader()
    for result, row in zip(config_results, rows):
        params = {param_names[key]: _csv_value(value) for key, value in result.params}
        writer.writerow({**{k: _csv_value(v) for k, v in row.items()}, **params})
    return out.getvalue()


def markdown_text(config_results):
    """The markdown table printed at the end of a sweep."""
    header = ['config', 'seeds'] + [title for _, title, _ in COLUMNS]
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    for result in config_results:
        row = summarize(result)
        seeds = str(row['seeds_done'])
        if row['seeds_done'] != row['seeds_planned']:
            seeds += f"/{row['seeds_planned']}"
        cells = [result.label, seeds] + [_cell(row, key, fmt) for key, _, fmt in COLUMNS]
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines) + '\n'


def write(sweep_dir, config_results, param_names):
    """Writes results.csv and results.md under the sweep dir; returns the markdown."""
    markdown = markdown_text(config_results)
    rundir.atomic_write_text(os.path.join(sweep_dir, CSV_NAME),
                             csv_text(config_results, param_names))
    rundir.atomic_write_text(os.path.join(sweep_dir, MARKDOWN_NAME), markdown)
    return markdown


def _cell(row, key, fmt):
    mean, std = row[f'{key}_mean'], row[f'{key}_std']
    if mean is None:
        return ''
    text = f'{fmt.format(mean)} ± {fmt.format(std)}'
    if key == 'steps_to_target':
        text += f" ({row['steps_to_target_reached']}/{row['seeds_done']})"
    return text


def _csv_value(value):
    if value is None:
        return ''
    if isinstance(value, (list, tuple)):
        return ' '.join(map(str, value))
    return value
