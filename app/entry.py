"""Which experiment train.py runs: online training (`run.*`) or offline (`train_offline.*`).

One Gin binding chooses, so a config file says what it is:
`experiment.kind = 'offline'` in configs/base/cql_sac.gin.
"""

import gin

from core.errors import UserError

KINDS = ('online', 'offline')


@gin.configurable('experiment')
def _kind(kind='online'):
    return kind


def experiment_function():
    """The configured experiment callable, `fn(root_dir, seed=..., force=...)`."""
    kind = _kind()
    if kind == 'online':
        from experiment.online import train_online

        return train_online
    if kind == 'offline':
        from experiment.offline import train_offline

        return train_offline
    raise UserError(f"experiment.kind must be one of {', '.join(KINDS)}, got {kind!r}.")
