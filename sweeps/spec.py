"""The sweep file: a YAML spec of seeds and either a grid or an Optuna search.

  name: dqn_lr                  # directory name under --root_dir
  seeds: [0, 1]                 # or num_seeds: 2 (seeds 0..N-1); default [0]
  workers: 2                    # optional default for --workers
  bindings:                     # optional fixed bindings for every trial
    run.num_env_steps: 10000    # (a mapping, or a list of 'key = value' strings)
  grid:                         # cartesian product of the listed values
    dqn.make_agent.learning_rate: [1.0e-3, 5.0e-4]

or, instead of grid:

  search:
    sampler: tpe                # or random
    num_trials: 8               # configurations, each run with every seed
    metric: best_eval_return    # a metrics.json key, averaged over seeds
    direction: maximize
    storage: sqlite:///runs/study.db   # optional; default: study.db in the sweep dir
    heartbeat_s: 10             # optional; a trial silent for 3x this is retried
    max_retries: 3              # optional; retries of a killed trial's configuration
    sampler_seed: 0             # optional; only with one worker (equal seeds propose
                                # equal values in every worker)
    params:
      dqn.make_agent.learning_rate: {type: float, low: 1.0e-4, high: 3.0e-3, log: true}
      dqn.make_agent.target_update_period: {type: int, low: 100, high: 1000, step: 100}
      dqn.make_agent.td_loss: {type: categorical, choices: [huber, mse]}

Everything is checked here, so a typo'd key fails in one line naming the file
instead of half-way through a sweep.
"""

import dataclasses
import os
import re

import yaml

from core.errors import UserError
from sweeps import naming

SWEEP_KEYS = {'name', 'seeds', 'num_seeds', 'workers', 'bindings', 'grid', 'search'}
SEARCH_KEYS = {'sampler', 'num_trials', 'metric', 'direction', 'storage', 'params',
               'heartbeat_s', 'sampler_seed', 'max_retries'}
PARAM_KEYS = {'float': {'type', 'low', 'high', 'log', 'step'},
              'int': {'type', 'low', 'high', 'log', 'step'},
              'categorical': {'type', 'choices'}}
SAMPLERS = ('random', 'tpe')
METRICS = ('best_eval_return', 'final_eval_return', 'steps_to_target', 'wall_time_s')
DIRECTIONS = ('maximize', 'minimize')
_NAME = re.compile(r'^[A-Za-z0-9][A-Za-z0-9._-]*$')
_REQUIRED = object()


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads `1e-3` as a string; learning rates are written that way, so
    this loader also reads exponent-only numbers as floats."""


_Loader.add_implicit_resolver(
    'tag:yaml.org,2002:float',
    re.compile(r'^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$'),
    list('-+0123456789'))


@dataclasses.dataclass(frozen=True)
class Param:
    """One searched parameter: a Gin binding key and its Optuna distribution."""

    key: str
    type: str
    low: float = None
    high: float = None
    log: bool = False
    step: float = None
    choices: tuple = ()

    def representative_values(self):
        """Values that validation parses: both ends of a range, or every choice."""
        return list(self.choices) if self.type == 'categorical' else [self.low, self.high]


@dataclasses.dataclass(frozen=True)
class Search:
    """An Optuna search: how many configurations, how to sample, what to optimise."""

    sampler: str
    num_trials: int
    params: tuple
    metric: str = 'best_eval_return'
    direction: str = 'maximize'
    storage: str = None
    heartbeat_s: int = 10
    sampler_seed: int = None
    max_retries: int = 3


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """A parsed sweep file. Exactly one of `grid` and `search` is set."""

    path: str
    name: str
    seeds: tuple
    bindings: tuple = ()
    grid: tuple = None  # ((key, (value, ...)), ...) in file order
    search: Search = None
    workers: int = None

    @property
    def swept_keys(self):
        if self.grid is not None:
            return [key for key, _ in self.grid]
        return [param.key for param in self.search.params]


def load(path):
    """Reads and checks a sweep file; raises UserError naming the file on any problem."""
    if not os.path.isfile(path):
        raise UserError(f"Sweep file not found: {path}. Check the path (sweeps are in "
                        "configs/sweeps/).")
    try:
        with open(path) as f:
            data = yaml.load(f, Loader=_Loader)
    except yaml.YAMLError as error:
        where = getattr(error, 'problem_mark', None)
        line = f" at line {where.line + 1}" if where else ''
        raise UserError(f"Sweep file {path} is not valid YAML{line}: fix its syntax.") from None
    return parse(data, path)


def parse(data, path='<sweep>'):
    """Builds a SweepSpec from the loaded YAML mapping."""
    if not isinstance(data, dict):
        raise UserError(f"Sweep file {path} must be a YAML mapping with a name, seeds and "
                        "either grid or search.")
    _check_keys(data, SWEEP_KEYS, path, 'top level')
    has_grid, has_search = 'grid' in data, 'search' in data
    if has_grid == has_search:
        which = 'both' if has_grid else 'neither'
        raise UserError(f"Sweep file {path} has {which} of 'grid' and 'search': give exactly one.")
    return SweepSpec(
        path=path,
        name=_name(data, path),
        seeds=_seeds(data, path),
        bindings=_bindings(data.get('bindings'), path),
        grid=_grid(data['grid'], path) if has_grid else None,
        search=_search(data['search'], path) if has_search else None,
        workers=_positive_int(data, 'workers', path, default=None))


def _check_keys(mapping, allowed, path, where):
    unknown = sorted(set(mapping) - set(allowed))
    if unknown:
        raise UserError(f"Sweep file {path}: unknown key(s) {', '.join(map(str, unknown))} at "
                        f"{where}; allowed: {', '.join(sorted(allowed))}.")


def _name(data, path):
    name = data.get('name')
    if not isinstance(name, str) or not _NAME.match(name):
        raise UserError(f"Sweep file {path} needs a 'name' made of letters, digits, '.', '_' "
                        f"or '-' (it names the sweep's directory), got {name!r}.")
    return name


def _seeds(data, path):
    if 'seeds' in data and 'num_seeds' in data:
        raise UserError(f"Sweep file {path} has both 'seeds' and 'num_seeds': give one.")
    if 'num_seeds' in data:
        return tuple(range(_positive_int(data, 'num_seeds', path)))
    seeds = data.get('seeds', [0])
    if (not isinstance(seeds, list) or not seeds or len(set(seeds)) != len(seeds)
            or not all(_is_int(seed) and seed >= 0 for seed in seeds)):
        raise UserError(f"Sweep file {path}: 'seeds' must be a list of distinct non-negative "
                        f"integers, got {seeds!r}.")
    return tuple(seeds)


def _bindings(raw, path):
    """Fixed bindings as Gin binding strings, in file order."""
    if raw is None:
        return ()
    if isinstance(raw, dict):
        return tuple(f'{key} = {naming.gin_literal(value, key)}' for key, value in raw.items())
    if isinstance(raw, list) and all(isinstance(item, str) for item in raw):
        return tuple(raw)
    raise UserError(f"Sweep file {path}: 'bindings' must be a mapping of binding to value or a "
                    "list of 'key = value' strings.")


def _grid(raw, path):
    if not isinstance(raw, dict) or not raw:
        raise UserError(f"Sweep file {path}: 'grid' must map each binding to a list of values.")
    grid = []
    for key, values in raw.items():
        _check_binding_key(key, path)
        if not isinstance(values, list) or not values:
            raise UserError(f"Sweep file {path}: grid entry {key} must be a non-empty list of "
                            f"values, got {values!r}.")
        grid.append((key, tuple(values)))
    return tuple(grid)


def _search(raw, path):
    if not isinstance(raw, dict):
        raise UserError(f"Sweep file {path}: 'search' must be a mapping with sampler, "
                        "num_trials and params.")
    _check_keys(raw, SEARCH_KEYS, path, 'search')
    sampler = _choice(raw, 'sampler', SAMPLERS, path, default='tpe')
    params = raw.get('params')
    if not isinstance(params, dict) or not params:
        raise UserError(f"Sweep file {path}: search.params must map each binding to a "
                        "distribution such as {type: float, low: 1.0e-4, high: 1.0e-2, log: true}.")
    return Search(
        sampler=sampler,
        num_trials=_positive_int(raw, 'num_trials', path),
        params=tuple(_param(key, value, path) for key, value in params.items()),
        metric=_choice(raw, 'metric', METRICS, path, default='best_eval_return'),
        direction=_choice(raw, 'direction', DIRECTIONS, path, default='maximize'),
        storage=_optional_str(raw, 'storage', path),
        heartbeat_s=_positive_int(raw, 'heartbeat_s', path, default=10),
        sampler_seed=raw.get('sampler_seed'),
        max_retries=_positive_int(raw, 'max_retries', path, default=3))


def _param(key, raw, path):
    _check_binding_key(key, path)
    kind = raw.get('type') if isinstance(raw, dict) else None
    if kind not in PARAM_KEYS:
        raise UserError(f"Sweep file {path}: search parameter {key} needs 'type' float, int or "
                        f"categorical, got {raw!r}.")
    _check_keys(raw, PARAM_KEYS[kind], path, f'search.params.{key}')
    if kind == 'categorical':
        choices = raw.get('choices')
        if not isinstance(choices, list) or not choices:
            raise UserError(f"Sweep file {path}: categorical {key} needs a non-empty 'choices' "
                            "list.")
        return Param(key=key, type=kind, choices=tuple(choices))
    return _numeric_param(key, kind, raw, path)


def _numeric_param(key, kind, raw, path):
    number = _is_int if kind == 'int' else _is_number
    low, high, step, log = raw.get('low'), raw.get('high'), raw.get('step'), raw.get('log', False)
    if not (number(low) and number(high) and low < high):
        raise UserError(f"Sweep file {path}: {kind} parameter {key} needs numeric 'low' < 'high'"
                        f"{' (integers)' if kind == 'int' else ''}, got low={low!r}, "
                        f"high={high!r}.")
    if not isinstance(log, bool) or (log and low <= 0):
        raise UserError(f"Sweep file {path}: {key}: 'log' must be true or false, and a log "
                        "range needs low > 0.")
    if step is not None and (not number(step) or step <= 0 or log):
        raise UserError(f"Sweep file {path}: {key}: 'step' must be a positive number and "
                        "cannot be combined with log: true.")
    return Param(key=key, type=kind, low=low, high=high, log=log, step=step)


def _check_binding_key(key, path):
    if not isinstance(key, str) or '.' not in key or '=' in key:
        raise UserError(f"Sweep file {path}: {key!r} is not a Gin binding name; write it like "
                        "dqn.make_agent.learning_rate.")


def _choice(raw, key, allowed, path, *, default):
    value = raw.get(key, default)
    if value not in allowed:
        raise UserError(f"Sweep file {path}: search.{key} must be one of "
                        f"{', '.join(allowed)}, got {value!r}.")
    return value


def _optional_str(raw, key, path):
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise UserError(f"Sweep file {path}: search.{key} must be a string such as "
                        f"sqlite:///runs/study.db, got {value!r}.")
    return value


def _positive_int(raw, key, path, default=_REQUIRED):
    if key not in raw and default is not _REQUIRED:
        return default
    value = raw.get(key)
    if not _is_int(value) or value < 1:
        raise UserError(f"Sweep file {path}: '{key}' must be a positive integer, got {value!r}.")
    return value


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)
