"""Gin helpers: find bindings that had no effect.

A binding to a parameter whose configurable was never called (a typo'd scope,
a mixin meant for another agent) parses fine and silently does nothing. After
a run, every bound parameter should appear in Gin's operative config; the
ones that do not are reported to the user and fail the config tests.
"""

from gin import config as gin_config


def unused_bindings():
    """Returns 'scope/configurable.param' for bound params never used by a call."""
    # Gin 0.5 keeps the parsed bindings and the used ones in these two dicts,
    # keyed by (scope, selector) -> {param: value}.
    bound = gin_config._CONFIG  # pylint: disable=protected-access
    used = gin_config._OPERATIVE_CONFIG  # pylint: disable=protected-access
    unused = []
    for (scope, selector), params in bound.items():
        used_params = used.get((scope, selector), {})
        for param in params:
            if param not in used_params:
                prefix = f'{scope}/' if scope else ''
                unused.append(f'{prefix}{selector}.{param}')
    return sorted(unused)

