"""Environments: a Gymnasium adapter for TF-Agents and a factory for it.

Nothing is imported here on purpose: importing TF-Agents pulls in TensorFlow,
and callers that only need, say, `envs.suite.make_env` should pay that cost
once, when they import the submodule they use.
"""
