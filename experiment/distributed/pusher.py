"""The learner's weight pushes, off its gradient loop.

A push is several round trips to the replay server (a timed `server_info` probe, a writer,
its flush). On one machine that is a few ms; across machines each round trip adds the
network's, and the gradient loop would stand still for all of them at every push. So the
learner copies its policy weights on its own thread (between two calls, so the next steps
cannot change them half-way) and hands the copy to `BackgroundPusher`, whose thread pushes
it. Collectors only ever want the newest weights, so a copy not yet pushed is replaced by a
newer one instead of queueing behind it.

A push that failed (the role gave up on the server, or was asked to stop while retrying) is
raised on the learner's thread at its next hand-off, as a push made there would have raised.
The first push (before training) and the last (after the final checkpoint) stay on the
learner's thread: they must have landed before it goes on.
"""

import threading


class BackgroundPusher:
    """Pushes the newest handed-off weights on a thread of its own."""

    def __init__(self, push):
        """`push(values, train_step)` pushes once, retried and bounded by the caller."""
        self._push = push
        self._changed = threading.Condition()
        self._pending = None  # (values, train_step) not yet pushed
        self._busy = False
        self._error = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, daemon=True, name='weight-pusher')
        self._thread.start()

    def submit(self, values, train_step):
        """Hands off a copy of the weights; raises a failure of an earlier push."""
        with self._changed:
            self._raise_failure()
            self._pending = (values, train_step)
            self._changed.notify_all()

    def close(self):
        """Drops a copy not yet pushed and waits for a push under way; raises its failure.

        The wait is bounded as that push's retries are (`give_up_after_s`, or at once
        when the role is stopping).
        """
        with self._changed:
            self._closed = True
            self._pending = None
            self._changed.notify_all()
            self._changed.wait_for(lambda: not self._busy)
            self._raise_failure()

    def _raise_failure(self):
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _run(self):
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._pending is not None or self._closed)
                if self._pending is None:
                    return
                (values, train_step), self._pending = self._pending, None
                self._busy = True
            try:
                self._push(values, train_step)
            except BaseException as error:  # noqa: BLE001  (raised on the learner's thread)
                with self._changed:
                    self._error = error
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()
