"""A grid sweep: every combination of the listed values, each with every seed.

All trials are planned (and every configuration validated) before the first
one starts. Which trials still need running is decided from their
metrics.json files, so the sweep keeps no state of its own: rerunning it skips
finished trials and resumes the others from their checkpoints.
"""

import functools
import itertools

from core.errors import UserError
from sweeps import executor, naming, results, trial, validate


def configurations(grid):
    """The cartesian product of a spec's grid as ((key, value), ...) tuples, in file order."""
    keys = [key for key, _ in grid]
    return [tuple(zip(keys, values)) for values in itertools.product(*(v for _, v in grid))]


def plan(spec, gin_files, base_bindings, sweep_dir, *, force=False):
    """Validates every configuration and returns the sweep's trials (raises UserError).

    Trial dirs holding runs of another config (the sweep file was edited) are
    refused up front unless `force`, rather than skipped or failed one by one.
    """
    for key, values in spec.grid:
        validate.check_values(gin_files, base_bindings, key, values, spec.path)
    names = naming.short_names(spec.swept_keys)
    trials, seen = [], {}
    for params in configurations(spec.grid):
        label = naming.config_label(params, names)
        if label in seen:
            raise UserError(f"Sweep file {spec.path}: configurations {seen[label]} and {params} "
                            f"share the directory name {label!r}; make the values differ in their "
                            "first 6 significant digits.")
        seen[label] = params
        bindings = tuple(base_bindings) + tuple(naming.bindings_for(params))
        try:
            config = validate.trial_config(gin_files, bindings)
        except UserError as error:
            raise UserError(f"Sweep configuration {label} of {spec.path} is refused: "
                            f"{error}") from None
        trials += [trial.Trial(label=label, params=params, seed=seed,
                               root_dir=trial.trial_dir(sweep_dir, label, seed),
                               bindings=bindings, config=config)
                   for seed in spec.seeds]
    changed = [one.root_dir for one in trials if trial.config_changed(one)]
    if changed and not force:
        raise UserError(f"{len(changed)} trial dir(s) hold runs of another config, e.g. "
                        f"{changed[0]} (see its config.gin): pass --force to resume them with "
                        "this config, or use another sweep name or --root_dir.")
    return trials


def run(trials, launcher, workers):
    """Runs (or skips) every trial on `workers` workers; returns their Outcomes in order."""
    jobs = [functools.partial(launcher.run, one) for one in trials]
    return executor.run_jobs(jobs, workers, launcher)


def collect(trials):
    """Per-configuration results from the trials' own metrics.json files, in grid order."""
    by_label = {}
    for one in trials:
        result = by_label.setdefault(one.label, results.ConfigResult(one.label, one.params))
        result.num_seeds += 1
        metrics = trial.read_metrics(one.root_dir)
        if trial.is_finished(metrics, one.config) and not trial.config_changed(one):
            result.runs.append(results.SeedRun(one.seed, metrics, one.root_dir))
    return list(by_label.values())
