"""User-facing errors.

Anything a user can cause (a typo'd binding, a missing file, an unknown
environment id, an impossible buffer size) raises `UserError`. `train.py`
prints such errors as one line -- what was wrong and how to fix it -- instead
of a traceback, so every message must name both the problem and the fix.
"""


class UserError(Exception):
    """An error caused by the user's input, printed without a traceback."""
