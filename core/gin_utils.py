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
    # An unscoped binding applies inside every scope too (e.g. make_env.env_id reaches
    # the eval env made under the 'eval' scope): it counts as used if any scope used it.
    used_anywhere = {}
    for (_, selector), params in used.items():
        used_anywhere.setdefault(selector, set()).update(params)
    unused = []
    for (scope, selector), params in bound.items():
        used_params = used.get((scope, selector), {}) if scope else used_anywhere.get(selector, ())
        for param in params:
            if param not in used_params:
                prefix = f'{scope}/' if scope else ''
                unused.append(f'{prefix}{selector}.{param}')
    return sorted(unused)

