"""TF-Agents' own rlds_to_reverb tests, run against our ReverbReplayBuffer
(buffers/tf_agents_reverb.py) and ReverbAddTrajectoryObserver
(buffers/tf_agents_reverb_observer.py) (the installed test file, unmodified; see
tests/tf_agents_suites.py). The file builds TF-Agents' own table (one column per leaf), so this
proves the drop-in path; tests/unit/test_tf_agents_reverb.py covers the packed table.

`RldsToReverbTest` (23 tests) builds the buffer and the observer in its setUp and pushes
through them. `RldsToTrajectoriesTest` (16 tests) exercises only `convert_rlds_to_trajectories`
and `create_trajectory_data_spec`, so it constructs nothing of ours; it runs under the same
patches all the same. No test is excluded.
"""

import pytest

from tests.tf_agents_suites import Suite, exclusion_share, parametrize, run_case

pytestmark = pytest.mark.reverb


def _ours():
    from buffers.tf_agents_reverb import ReverbReplayBuffer
    return ReverbReplayBuffer


def _our_observer():
    from buffers.tf_agents_reverb_observer import ReverbAddTrajectoryObserver
    return ReverbAddTrajectoryObserver


SUITE = Suite(
    test_module='tf_agents.replay_buffers.rlds_to_reverb_test',
    replaced=('tf_agents.replay_buffers.reverb_replay_buffer', 'ReverbReplayBuffer'),
    ours=_ours,
    extra_patches={('tf_agents.replay_buffers.reverb_utils', 'ReverbAddTrajectoryObserver'):
                   _our_observer},
    without_buffer={'RldsToTrajectoriesTest': 'tests the conversion functions only: no '
                                              'buffer, observer or server'},
    excluded={})


@pytest.mark.parametrize('test_id', parametrize(SUITE))
def test_tf_agents_rlds_suite(test_id, monkeypatch):
    run_case(SUITE, test_id, monkeypatch)


def test_exclusions_are_at_most_a_fifth_of_the_file():
    assert exclusion_share(SUITE) <= 0.2
