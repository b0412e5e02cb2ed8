"""Shared test set-up: quiet TF once, and small helpers used across suites."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from experiment.quiet import quiet_startup  # noqa: E402

quiet_startup()
