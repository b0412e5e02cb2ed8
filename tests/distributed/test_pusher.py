"""The learner's background weight pushes: newest wins, failures surface, close waits."""

import threading

import pytest

from experiment.distributed.pusher import BackgroundPusher


class _SlowStore:
    """Records pushes; each waits until the test lets it finish."""

    def __init__(self):
        self.pushed, self.started, self.release = [], threading.Event(), threading.Event()
        self.fail_with = None

    def push(self, values, step):
        self.started.set()
        assert self.release.wait(10)
        if self.fail_with is not None:
            raise self.fail_with
        self.pushed.append((values, step))


def test_a_newer_copy_replaces_one_not_yet_pushed_and_close_waits_for_the_push_under_way():
    store = _SlowStore()
    pusher = BackgroundPusher(store.push)
    pusher.submit(['w1'], 1)
    assert store.started.wait(10)  # step 1 is being pushed
    pusher.submit(['w2'], 2)
    pusher.submit(['w3'], 3)  # replaces step 2, which never goes out
    store.release.set()
    for _ in range(100):
        if store.pushed[-1:] == [(['w3'], 3)]:
            break
        threading.Event().wait(0.05)
    assert store.pushed == [(['w1'], 1), (['w3'], 3)]
    pusher.submit(['w4'], 4)
    pusher.close()  # drops or finishes step 4, and returns only when no push is under way
    assert store.pushed[-1][1] in (3, 4)
    assert not pusher._busy


def test_a_failed_push_is_raised_on_the_learners_next_hand_off():
    store = _SlowStore()
    store.fail_with = RuntimeError('gave up pushing weights')
    pusher = BackgroundPusher(store.push)
    pusher.submit(['w1'], 1)
    store.release.set()
    with pytest.raises(RuntimeError, match='gave up pushing weights'):
        for _ in range(100):
            threading.Event().wait(0.05)
            pusher.submit(['w2'], 2)
    store.fail_with = None
    pusher.close()
