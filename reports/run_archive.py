"""A results table's runs, kept in the repository: run directories do not outlive their machine.

A benchmark-scale run takes hours and its directory (checkpoints, replay, event files) stays on
the machine that trained it, so a table regenerated later, on another machine or after the
runs/ folder is gone, would silently drop the seeds it no longer sees. Each results script
therefore keeps one JSON file in docs/data/ with one record per run (the row it shows plus the
eval curve), merges the run directories it finds into it, and builds its table from the merged
records.

A record found in a run directory replaces the archived one of the same key unless the
archived one got further (more env steps): restarting a lost run from scratch must not erase
the finished record of its first attempt until it catches up.
"""

import json
import os

from core import rundir


def load(path):
    """The archived records, [] when the file does not exist yet."""
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return json.load(f)['runs']


def merge(archived, fresh, key):
    """archived updated with fresh records: one record per key(record), in key order."""
    merged = {key(record): record for record in archived}
    for record in fresh:
        old = merged.get(key(record))
        if old is None or record['reached'] >= old['reached']:
            merged[key(record)] = record
    return [merged[k] for k in sorted(merged, key=lambda k: tuple(map(str, k)))]


def update(path, fresh, key, command, runs):
    """The archive at `path` merged with `fresh` (found under `runs`) and saved; its records.

    Nothing at all -- no run directories and no archive -- is refused in one line.
    """
    records = merge(load(path), fresh, key)
    if not records:
        raise SystemExit(f'no run directories (config.gin + tb/) under {runs} and no '
                         f'archived runs in {path}')
    save(path, records, command)
    return records


def save(path, records, command):
    """Writes the records atomically, with the command that regenerates them."""
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    payload = {'generated_by': command, 'runs': [_plain(record) for record in records]}
    rundir.atomic_write_text(path, json.dumps(payload, indent=1) + '\n')


def _plain(record):
    """JSON-ready: curves as [step, value] lists (exact round trip), paths as strings."""
    plain = dict(record)
    plain['curve'] = [[int(step), float(value)] for step, value in record.get('curve') or []]
    plain['run_dir'] = str(record.get('run_dir') or '')
    return plain
