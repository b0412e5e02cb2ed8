"""Binding values as Gin literals and as short, filesystem-safe directory names.

A trial's root_dir is `<root>/<sweep>/<k=v,...>/seed_<n>`, where k is the
shortest unambiguous tail of the binding name (`learning_rate` for
`dqn.make_agent.learning_rate`). The name is derived from the values alone,
so rerunning a sweep finds the same directories and resumes them.
"""

import hashlib
import math
import re

from core.errors import UserError

MAX_LABEL_CHARS = 100
_UNSAFE = re.compile(r'[^A-Za-z0-9._+-]+')


def gin_literal(value, key=None):
    """The Gin text for a YAML value: strings are quoted, '@ref' and '%MACRO' pass as-is.

    YAML lists become tuples because Gin configs here spell sequences that way
    (e.g. fc_layer_params = (100,)).
    """
    if value is None or isinstance(value, (bool, int)):
        return repr(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UserError(f"Binding {key}: {value!r} is not a finite number; use a real value.")
        return repr(value)
    if isinstance(value, str):
        return value if value[:1] in ('@', '%') else repr(value)
    if isinstance(value, (list, tuple)):
        items = [gin_literal(item, key) for item in value]
        return '(' + ', '.join(items) + (',)' if len(items) == 1 else ')')
    raise UserError(f"Binding {key}: cannot turn {value!r} ({type(value).__name__}) into a Gin "
                    "value; use a number, string, bool or list.")


def dir_text(value):
    """A compact, filesystem-safe rendering of one value (floats to 6 significant digits)."""
    if isinstance(value, float):
        text = format(value, '.6g')
    elif isinstance(value, (list, tuple)):
        text = '-'.join(dir_text(item) for item in value) or 'empty'
    elif isinstance(value, str):
        text = value.lstrip('@%')
    else:
        text = str(value)
    return _UNSAFE.sub('_', text) or '_'


def short_names(keys):
    """Maps each binding key to its shortest tail that no other key shares.

    'dqn.make_agent.learning_rate' -> 'learning_rate'; if two keys end alike
    ('run.batch_size', 'eval/run.batch_size'), more of each is kept.
    """
    parts = {key: _UNSAFE.sub('_', key.replace('/', '.')).split('.') for key in keys}
    depth = {key: 1 for key in keys}
    while True:
        names = {key: '.'.join(parts[key][-depth[key]:]) for key in keys}
        clashing = [key for key in keys
                    if list(names.values()).count(names[key]) > 1 and depth[key] < len(parts[key])]
        if not clashing:
            return names
        for key in clashing:
            depth[key] += 1


def config_label(params, names):
    """'k=v,k=v' for one configuration; 'default' when nothing is swept.

    Args:
      params: ordered (key, value) pairs of the configuration.
      names: short_names() of the keys.
    """
    label = ','.join(f'{names[key]}={dir_text(value)}' for key, value in params) or 'default'
    if len(label) <= MAX_LABEL_CHARS:
        return label
    digest = hashlib.sha1(label.encode()).hexdigest()[:8]
    return label[:MAX_LABEL_CHARS - 9] + '~' + digest


def bindings_for(params):
    """Gin binding strings for (key, value) pairs."""
    return [f'{key} = {gin_literal(value, key)}' for key, value in params]
