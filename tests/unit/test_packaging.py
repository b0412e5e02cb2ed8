"""What `pip install` of this project puts on a user's path: nothing that shadows their packages.

A TF-Agents user installs the project into their own environment to use buffers/tf_agents_api.py
(docs/replay_buffers.md). Our top-level packages have plain names (`core`, `envs`, `agents`,
...), so this checks them against every distribution in the locked environment, which holds
TF-Agents, Reverb, TFDS, Gym, Gymnasium and the rest of what such a user runs.
"""

import importlib.metadata
import pathlib

try:
    import tomllib
except ImportError:  # Python < 3.11: pip's own copy of the same parser
    from pip._vendor import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def installed_top_level_names():
    """The top-level import names the project installs (pyproject's package list)."""
    config = tomllib.loads((ROOT / 'pyproject.toml').read_text())
    include = config['tool']['setuptools']['packages']['find']['include']
    return {name.split('.')[0] for name in include}


def top_level_names(distribution):
    names = set((distribution.read_text('top_level.txt') or '').split())
    for path in distribution.files or []:
        first = path.parts[0] if path.parts else ''
        if first and not first.endswith(('.dist-info', '.egg-info', '.data', '.pth')) \
                and first not in ('..', '__pycache__'):
            names.add(first.removesuffix('.py'))
    return names


def test_no_installed_distribution_provides_one_of_our_top_level_names():
    ours = installed_top_level_names()
    assert {'buffers', 'core', 'agents', 'envs'} <= ours
    clashes = {}
    for distribution in importlib.metadata.distributions():
        if distribution.metadata['Name'] == 'rl-training':
            continue
        shared = top_level_names(distribution) & ours
        if shared:
            clashes[distribution.metadata['Name']] = sorted(shared)
    assert clashes == {}
