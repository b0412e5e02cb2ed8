"""TF-Agents' own ReverbReplayBuffer tests, run against buffers.tf_agents_reverb's
ReverbReplayBuffer with our ReverbAddTrajectoryObserver writing (the installed test file,
unmodified; see tests/tf_agents_suites.py). Every test builds our buffer; the tables are
TF-Agents' (one column per leaf, or no signature), so this is the drop-in path."""

import pytest

from tests.tf_agents_suites import Suite, exclusion_share, parametrize, run_case
from tests.unit.test_tf_agents_rlds_suite import _our_observer, _ours

pytestmark = pytest.mark.reverb


SUITE = Suite(
    test_module='tf_agents.replay_buffers.reverb_replay_buffer_test',
    replaced=('tf_agents.replay_buffers.reverb_replay_buffer', 'ReverbReplayBuffer'),
    ours=_ours,
    extra_patches={('tf_agents.replay_buffers.reverb_utils', 'ReverbAddTrajectoryObserver'):
                   _our_observer},
    excluded={})


@pytest.mark.parametrize('test_id', parametrize(SUITE))
def test_tf_agents_reverb_buffer_suite(test_id, monkeypatch):
    run_case(SUITE, test_id, monkeypatch)


def test_exclusions_are_at_most_a_fifth_of_the_file():
    assert exclusion_share(SUITE) <= 0.2
