"""Environments: a Gymnasium adapter for TF-Agents and a factory for it.

Nothing is imported here on purpose: importing TF-Agents pulls in TensorFlow,
and callers that only need, say, `envs.suite.make_env` should pay that cost
once, when they import the submodule they use.
"""

import os

# MuJoCo picks its OpenGL back end when it is imported, and its default (GLFW)
# needs a display: without one, rendering (videos) fails. EGL renders
# off-screen, with Mesa's software driver where there is no GPU (Debian:
# libegl1 + libgl1-mesa-dri). An explicit MUJOCO_GL (e.g. osmesa) is kept.
if not os.environ.get('DISPLAY'):
    os.environ.setdefault('MUJOCO_GL', 'egl')
