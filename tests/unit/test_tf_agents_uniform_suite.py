"""TF-Agents' own TFUniformReplayBuffer tests, run against buffers.tf_agents_api.UniformReplayBuffer
(the installed test file, unmodified; see tests/tf_agents_suites.py)."""

import pytest

from tests.tf_agents_suites import Suite, exclusion_share, parametrize, run_case


def _ours():
    from buffers.tf_agents_api import UniformReplayBuffer
    return UniformReplayBuffer


SUITE = Suite(
    test_module='tf_agents.replay_buffers.tf_uniform_replay_buffer_test',
    replaced=('tf_agents.replay_buffers.tf_uniform_replay_buffer', 'TFUniformReplayBuffer'),
    ours=_ours,
    excluded={})


@pytest.mark.parametrize('test_id', parametrize(SUITE))
def test_tf_agents_uniform_suite(test_id, monkeypatch):
    run_case(SUITE, test_id, monkeypatch)


def test_exclusions_are_at_most_a_fifth_of_the_file():
    assert exclusion_share(SUITE) <= 0.2
