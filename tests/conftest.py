"""Shared test set-up: quiet TF once, AutoGraph kept out of TF-Agents as every run keeps it
(core/tf_setup.py), and a clean Gin config for every test module."""

import gin
import pytest

from core.quiet import quiet_startup

quiet_startup()  # first: importing TF sets the log level our subprocesses inherit

from core.tf_setup import leave_tf_agents_unconverted  # noqa: E402

leave_tf_agents_unconverted()


@pytest.fixture(scope='module', autouse=True)
def _fresh_gin_config():
    """Gin's config is process-global and pytest-xdist runs many modules in one worker, so a
    binding left by one module (an n-step of 3, a CNN) would otherwise reach the next module's
    agents. Module scope, not function scope: module fixtures may bind a config their tests
    share."""
    gin.clear_config()
    yield
