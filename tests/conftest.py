"""Shared test set-up: quiet TF once, and small helpers used across suites."""

from core.quiet import quiet_startup

quiet_startup()
