"""Type and range checks for configurable parameters, each failure one line naming the binding.

Every factory a user configures (run, train_offline, make_env, the agents, the
replay backends) checks its numeric parameters before it builds anything, so
`run.num_env_steps='many'` or `dqn.make_agent.gamma=1.5` stops the run with
`<scope>.<name> must be <what>, got <value>: fix the binding.` instead of a
traceback minutes later.

Rules name parameters by kind; `values` maps each name to its value:

    check('dqn.make_agent', locals(), positive=('n_step_update',),
          numbers={'gamma': (0.0, 1.0, 'open_low')}, layers=('fc_layer_params',))
"""

import math
import numbers as _numbers

from core.errors import UserError


def _is_int(value):
    return isinstance(value, _numbers.Integral) and not isinstance(value, bool)


def _is_number(value):
    return (isinstance(value, _numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value))


def _in_range(value, low, high, bounds):
    above = value > low if bounds in ('open_low', 'open') else value >= low
    below = value < high if bounds in ('open_high', 'open') else value <= high
    return above and below


def _range_text(low, high, bounds):
    left = '(' if bounds in ('open_low', 'open') else '['
    right = ')' if bounds in ('open_high', 'open') else ']'
    if low == -math.inf and high == math.inf:
        return 'a finite number'
    if high == math.inf:
        return f"a number {'>' if left == '(' else '>='} {low:g}"
    return f"a number in {left}{low:g}, {high:g}{right}"


def check(scope, values, *, positive=(), non_negative=(), optional_positive=(), numbers=None,
          optional_numbers=None, flags=(), callables=(), layers=()):
    """Raises a one-line `UserError` for the first parameter that breaks its rule.

    Args:
      scope: the Gin name of the configurable, e.g. 'run' or 'dqn.make_agent'.
      values: {parameter name: value}.
      positive: names of whole numbers >= 1.
      non_negative: names of whole numbers >= 0 (0 turns the thing off).
      optional_positive: names of None or whole numbers >= 1.
      numbers: {name: (low, high, bounds)} for finite numbers in a range; bounds
        is 'closed', 'open', 'open_low' or 'open_high'; high may be math.inf.
      optional_numbers: the same, where None is allowed too.
      flags: names of booleans.
      callables: names of configurable references (`@name`).
      layers: names of non-empty sequences of positive whole numbers (layer sizes).
    """
    def fail(name, expected):
        raise UserError(f"{scope}.{name} must be {expected}, got {values[name]!r}: "
                        "fix the binding.")

    for name in positive:
        if not _is_int(values[name]) or values[name] < 1:
            fail(name, 'a positive whole number')
    for name in non_negative:
        if not _is_int(values[name]) or values[name] < 0:
            fail(name, 'a whole number >= 0 (0 turns it off)')
    for name in optional_positive:
        if values[name] is not None and (not _is_int(values[name]) or values[name] < 1):
            fail(name, 'None or a whole number >= 1')
    for rules, optional in ((numbers or {}, False), (optional_numbers or {}, True)):
        for name, (low, high, bounds) in rules.items():
            value = values[name]
            if optional and value is None:
                continue
            if not _is_number(value) or not _in_range(value, low, high, bounds):
                fail(name, ('None or ' if optional else '') + _range_text(low, high, bounds))
    for name in flags:
        if not isinstance(values[name], bool):
            fail(name, 'True or False')
    for name in callables:
        if not callable(values[name]):
            fail(name, 'a configurable reference such as @dqn.make_agent')
    for name in layers:
        sizes = values[name]
        if not isinstance(sizes, (list, tuple)) or not sizes or not all(
                _is_int(size) and size >= 1 for size in sizes):
            fail(name, 'a non-empty tuple of positive layer sizes, e.g. (256, 256)')
