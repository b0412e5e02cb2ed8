"""What a learner does differently when the replay is split over shards (replay_shards > 1).

A mixin of the learner (`experiment/distributed/learner.py`): it keeps the whole
buffer's samples-per-insert ratio itself (the shards' limiters only hold a minimum
size, experiment/distributed/tier.py), re-weights the shards by their sizes every
`SHARD_REFRESH_S`, says when one goes down or comes back, and leaves a dataset that
waits on a dead shard for one over the live ones.
"""

import threading
import time

from experiment.distributed.waiting import Stopped

# How often the shards' weights are refreshed, and how long a shard may take to answer
# before it counts as down.
SHARD_REFRESH_S = 2.0
SHARD_REFRESH_TIMEOUT_S = 1.0
RATIO_POLL_S = 0.05  # how often a learner held by the ratio reads the shards' counters


class ShardedSampling:
    """The learner's sharded-replay methods; it provides `role`, `settings`, `params`,
    `tier`, `gate`, `allowance`, `sharded`, `batches`, `backend`, `reopen` and the
    bookkeeping fields `sampled_shards`, `reported_live`, `next_refresh`."""

    def _report_shards(self, live):
        """Logs each shard that went down or came back since the last report."""
        before = self.reported_live if self.reported_live is not None else \
            set(range(self.tier.num_shards))
        for shard in sorted(before - live):
            self.role.log(f"replay shard {shard} at {self.tier.addresses[shard]} does not "
                          "answer; sampling the other shards until it is back")
        for shard in sorted(live - before):
            self.role.log(f"replay shard {shard} at {self.tier.addresses[shard]} answers "
                          "again; sampling it again")
        self.reported_live = live

    def live_shards(self):
        down = set(self.sharded.down_shards())
        return {shard for shard in range(self.tier.num_shards) if shard not in down}

    def wait_for_ratio(self, watchdog):
        """Sharded replay: waits until the whole buffer's ratio allows the next call's samples.

        Polls the shards' counters only when the allowance from the last reading is used up.
        It reads the samples the shards served, as the collectors do, not the samples it
        used: a shard restored from its checkpoint forgets samples it served after it, and
        the two sides must count alike never to wait on each other.
        """
        need = self.settings.learner_steps_per_call * self.params.batch_size
        if self.gate is None:
            return
        if self.allowance < need:  # the last reading may not cover this call: read again
            with watchdog.waiting('waiting for inserts (samples-per-insert ratio over all '
                                  'shards)', 'the collectors', self.probe):
                while True:
                    counters = self.counters()
                    self.allowance = self.gate.samples_allowed(counters['inserted'],
                                                               counters['sampled'])
                    if self.allowance >= 0:
                        break
                    self.role.sleep(RATIO_POLL_S)
        self.allowance -= need

    def _next_sharded_batch(self):
        """The next stacked batch, waited for on a helper thread.

        Reverb keeps retrying a stream to a server that died, so a dataset drawing from
        a killed shard would wait until the shard is back. While the batch does not come,
        the shards are checked every `SHARD_REFRESH_S`; when one the dataset samples is
        down, that dataset is left (its thread with it) and a new one over the live
        shards takes its place.
        """
        while True:
            batches, box, done = self.batches, {}, threading.Event()

            def fetch():
                try:
                    box['value'] = batches.get_next()
                except Exception as error:  # noqa: BLE001  (re-raised on the caller's thread)
                    box['error'] = error
                done.set()

            threading.Thread(target=fetch, daemon=True, name='sharded-batch').start()
            while not done.wait(SHARD_REFRESH_S):
                if self.role.stop.is_set():
                    raise Stopped()
                if self.refresh_shards(force=True):
                    break  # reopened: fetch from the new dataset
            else:
                if 'error' in box:
                    raise box['error']
                return box['value']

    def refresh_shards(self, force=False):
        """Sharded replay: re-weights the shards by their sizes and readiness (every
        `SHARD_REFRESH_S`, or now with `force`), says when one goes down or comes back,
        and reopens the dataset when the live shards are no longer the ones it samples.

        Returns whether it reopened the dataset.
        """
        now = time.monotonic()
        if self.tier.num_shards == 1 or self.backend is None or \
                (now < self.next_refresh and not force):
            return False
        self.next_refresh = now + SHARD_REFRESH_S
        self.sharded.refresh()
        after = self.live_shards()
        if after != self.sampled_shards:
            self.reopen(abandon=True)
            return True
        return False
