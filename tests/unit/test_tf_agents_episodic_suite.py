"""TF-Agents' own EpisodicReplayBuffer tests, run against
buffers.tf_agents_episodic.EpisodicReplayBuffer (the installed test file, unmodified; see
tests/tf_agents_suites.py).

The file holds 45 tests as unittest loads them (pytest run on the file directly also collects
tf.test's `test_session` of each of its two classes, as skips: 47). Two are skipped by
TF-Agents itself in eager mode. None is excluded: the two deterministic-pass tests with
`sample_batch_size` that TF-Agents' own class fails pass here. `StatefulEpisodicReplayBuffer`
is ours too (TF-Agents' refuses any class but its own).
"""

import pytest

from tests.tf_agents_suites import Suite, exclusion_share, parametrize, run_case


def _ours():
    from buffers.tf_agents_episodic import EpisodicReplayBuffer
    return EpisodicReplayBuffer


def _our_stateful():
    # TF-Agents' wrapper accepts only its own class (isinstance), so users wrap ours in
    # ours; the file's StatefulEpisodicReplayBufferTest then tests that one.
    from buffers.tf_agents_episodic import StatefulEpisodicReplayBuffer
    return StatefulEpisodicReplayBuffer


SUITE = Suite(
    test_module='tf_agents.replay_buffers.episodic_replay_buffer_test',
    replaced=('tf_agents.replay_buffers.episodic_replay_buffer', 'EpisodicReplayBuffer'),
    ours=_ours,
    extra_patches={
        ('tf_agents.replay_buffers.episodic_replay_buffer', 'StatefulEpisodicReplayBuffer'):
            _our_stateful,
    },
    excluded={
        # 'EpisodicReplayBufferTest.testName': 'why it cannot pass against our class',
    })


@pytest.mark.parametrize('test_id', parametrize(SUITE))
def test_tf_agents_episodic_suite(test_id, monkeypatch):
    run_case(SUITE, test_id, monkeypatch)


def test_exclusions_are_at_most_a_fifth_of_the_file():
    assert exclusion_share(SUITE) <= 0.2
