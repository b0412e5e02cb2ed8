"""Refuses bad bindings before any trial starts.

A typo'd binding or a wrong-typed value would otherwise surface as N crashed
trials minutes into a sweep. Each configuration is parsed in-process with
train.py's strict parser, and each swept value's type is compared with the
parameter's current value (from the configs) or its Python default.

Gin's config is global to the process, so every parse here holds one lock;
search workers parse sampled configurations from several threads.
"""

import dataclasses
import inspect
import threading

import gin
from gin import config as gin_config

from app import cli
from core.errors import UserError
from sweeps import naming

_GIN_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class TrialConfig:
    """What the sweep needs to know of a parsed trial configuration.

    num_env_steps and stop_at_target_return tell when a trial has finished;
    config_str is what train.py records in the run's config.gin, so a rerun
    can tell a finished trial of this configuration from one of an edited sweep.
    """

    num_env_steps: int
    stop_at_target_return: bool
    config_str: str


def check_base(gin_files, bindings, spec_path):
    """Parses the configs and the sweep's fixed bindings; returns nothing, raises UserError."""
    with _GIN_LOCK:
        cli.load_gin_config(gin_files, [])
        try:
            cli.load_gin_config(gin_files, bindings)
        except UserError as error:
            raise UserError(f"{cli.one_line(error)} (in the bindings of {spec_path} or "
                            "--gin_bindings)") from None


def check_values(gin_files, bindings, key, values, spec_path):
    """Checks one swept binding: known to Gin, and each value of the right type."""
    with _GIN_LOCK:
        cli.load_gin_config(gin_files, bindings)
        default = _current_value(key)
    for value in values:
        problem = type_problem(value, default)
        if problem:
            raise UserError(f"Sweep binding {key} = {naming.gin_literal(value, key)} in "
                            f"{spec_path} has the wrong type: {problem}.")
        _parse_one(gin_files, bindings, key, value, spec_path)


def trial_config(gin_files, bindings):
    """Parses one full trial configuration; returns its TrialConfig (raises UserError)."""
    with _GIN_LOCK:
        cli.load_gin_config(gin_files, bindings)
        return TrialConfig(
            num_env_steps=_current_value('run.num_env_steps'),
            stop_at_target_return=bool(_current_value('run.stop_at_target_return')),
            config_str=gin.config_str())


def type_problem(value, default):
    """Why `value` cannot replace `default`, or None when it can (or nothing is known)."""
    if isinstance(value, str) and value[:1] in ('@', '%'):
        return None  # a Gin reference or macro: the parser checks it
    expected = _kind(default)
    if expected is None or _fits(value, expected):
        return None
    return (f"expected {expected} (the current value is {default!r}), got "
            f"{type(value).__name__} {value!r}")


def _kind(default):
    if isinstance(default, bool):
        return 'bool'
    if isinstance(default, int):
        return 'int'
    if isinstance(default, float):
        return 'float'
    if isinstance(default, str):
        return 'str'
    if isinstance(default, (list, tuple)):
        return 'a sequence'
    return None  # None, gin.REQUIRED, references: any type may be intended


def _fits(value, expected):
    is_bool = isinstance(value, bool)
    return {
        'bool': is_bool,
        'int': isinstance(value, int) and not is_bool,
        'float': isinstance(value, (int, float)) and not is_bool,
        'str': isinstance(value, str),
        'a sequence': isinstance(value, (list, tuple)),
    }[expected]


def _parse_one(gin_files, bindings, key, value, spec_path):
    binding = f'{key} = {naming.gin_literal(value, key)}'
    with _GIN_LOCK:
        try:
            cli.load_gin_config(gin_files, list(bindings) + [binding])
        except UserError as error:
            raise UserError(f"Sweep binding {binding} in {spec_path} is refused: "
                            f"{cli.one_line(error)}") from None
        except Exception as error:  # Gin's tokenizer raises its own errors on bad syntax
            raise UserError(f"Sweep binding {binding} in {spec_path} does not parse: "
                            f"{error}; fix its value.") from None


def _current_value(key):
    """The value the parsed configs give `key`, else its Python default; None if unknown."""
    try:
        return gin.query_parameter(key)
    except ValueError:
        pass
    selector, _, param = key.rpartition('.')
    # Gin has no public lookup of a configurable's defaults; its registry is stable in 0.5.
    configurable = gin_config._REGISTRY.get_match(selector.rpartition('/')[2])
    if configurable is None:
        return None
    try:
        parameter = inspect.signature(configurable.wrapped).parameters.get(param)
    except (TypeError, ValueError):
        return None
    if parameter is None or parameter.default is inspect.Parameter.empty:
        return None
    return parameter.default
