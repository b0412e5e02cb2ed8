"""The learner's own replay, when it holds it (`distributed.settings.learner_holds_replay`).

Collectors write windows to a Reverb queue on the replay server (`ReverbWindowQueue`);
the learner takes them from it `windows_per_drain` at a time into a `WindowStore` in its
own memory and samples its batches there with the single-process training chunk, so a
window crosses the network and Reverb's client once instead of once per time it is
sampled (256 times for SAC Pendulum).

The run's replay ratio is kept here, as the server's rate limiter keeps it otherwise:
the first `min_size_to_sample` windows earn nothing (as with `SampleToInsertRatio`), every
later window earns `samples_per_insert` samples, and a learner call spends
`learner_steps_per_call x batch_size` of them; the learner drains the queue while its
credit is short. The collectors are held by the queue's length. The learner never asks
for more windows than the run collects (`run.num_env_steps`): a last call short of
credit trains on what is stored, so the end of a run never waits on windows that will
not come.

Taking a drain in (Reverb's client receiving the windows, the store's add, the counts) is
a few percent of the learner's loop, more the smaller its network: time its gradient steps
would stand still for. So where the store can be written while it samples (uniform
sampling; `WindowStore.capabilities.concurrent_writes`), each call takes the NEXT call's
drain in on a thread of its own while it trains, as one process collects its next chunk
while it trains (`run.overlap_collection`): the learner then keeps one drain (one call's
windows) more than the ratio strictly needs, never more. Prioritized sampling takes its
drains in between calls.

The store, the credit and the windows taken in are in the learner's checkpoint, saved
under `lock` so that a checkpoint never holds half a drain. Windows taken from the queue
after that checkpoint (and those requested ahead) are lost when the learner dies; the
server's queue keeps the rest.
"""

import threading
from queue import SimpleQueue

import tensorflow as tf

from buffers.base import allow_concurrent_writes
from experiment.distributed import config
from experiment.replay import held_store, num_steps_of


class HeldReplay:
    """The store, the queue's windows coming in, and the credit of samples."""

    def __init__(self, settings, params, agent, *, seed):
        self.windows_per_drain = config.windows_per_drain(settings, params)
        self.store = held_store(params, agent, windows_per_add=self.windows_per_drain,
                                seed=seed)
        self.num_steps = num_steps_of(agent)
        self.samples_per_call = settings.learner_steps_per_call * params.batch_size
        self.samples_per_window = settings.samples_per_insert
        self.min_size = settings.min_size_to_sample
        self.run_windows = params.num_env_steps
        self.credit = tf.Variable(0.0, dtype=tf.float64, trainable=False, name='credit')
        self.taken = tf.Variable(0, dtype=tf.int64, trainable=False, name='windows_taken')
        self._add = tf.function(self.store.add)
        self._windows = None
        self.lock = threading.Lock()  # one drain's add and counts, or a checkpoint's save
        # A drain taken in on a thread while the learner trains needs the store to skip the
        # add in flight when it samples, and room for it (3 adds: the guard, the one
        # sampled, one more).
        self.takes_ahead = (self.store.capabilities.concurrent_writes
                            and self.store.adds_kept >= 3)
        if self.takes_ahead:
            allow_concurrent_writes(self.store, 1)
            self._taker = _Taker(self._take)

    def checkpoint_items(self):
        return {'store': self.store.checkpoint_items(), 'credit': self.credit,
                'taken': self.taken}

    def open(self, queue):
        """Reads windows from `queue` (the learner's `ReverbWindowQueue`) from now on."""
        dataset = queue.as_dataset(self.windows_per_drain, self.num_steps)
        self._windows = iter(dataset.map(lambda windows, info: windows).prefetch(1))

    def drop(self):
        """Forgets the open iterator; returns it (its caller may keep it open)."""
        windows, self._windows = self._windows, None
        return windows

    def _take(self, windows=None):
        """Moves one drain of windows from the queue (`windows`, or the open iterator) into
        the store (raises like the dataset: OutOfRangeError when none came within the
        timeout, and then nothing changed)."""
        drain = (self._windows if windows is None else windows).get_next()
        with self.lock:
            self._add(drain)
            taken = int(self.taken.assign_add(self.windows_per_drain).numpy())
            earning = max(0, min(self.windows_per_drain, taken - self.min_size))
            self.credit.assign_add(earning * self.samples_per_window)

    def size(self):
        return int(self.store.size().numpy())

    def filled(self):
        return int(self.taken.numpy()) >= self.min_size

    def fill_step(self):
        """One drain towards `min_size_to_sample` windows; True once there."""
        if not self.filled():
            self._take()
        return self.filled()

    def _more_to_come(self):
        return int(self.taken.numpy()) + self.windows_per_drain <= self.run_windows

    def ready_for_call(self):
        """Drains until the credit covers one learner call (or the run has no more windows),
        then spends it; starts taking the next call's drain in while this one trains.

        A drain taken ahead that failed raises here, at the next call, as the dataset would
        have: nothing of it was stored.
        """
        self.settle()
        while self.credit.numpy() < self.samples_per_call and self._more_to_come():
            self._take()
        self.credit.assign_sub(min(float(self.credit.numpy()), float(self.samples_per_call)))
        if self.takes_ahead and self._more_to_come():
            self._taker.start(self._windows)

    def settle(self):
        """Waits for the drain taken ahead, if one is under way; raises its failure."""
        if self.takes_ahead:
            self._taker.wait()


class _Taker:
    """A thread that takes one drain in when started (daemon: a role exits without it).

    One thread for the run: starting a thread per call cost ~2 ms of the gradient loop
    (the starter waits until the new thread runs).
    """

    def __init__(self, take):
        self._take = take
        self._requests, self._results = SimpleQueue(), SimpleQueue()
        self._under_way = False
        threading.Thread(target=self._run, daemon=True, name='window-take').start()

    def start(self, windows):
        """Takes one drain from the iterator `windows` in, on the thread."""
        self._under_way = True
        self._requests.put(windows)

    def wait(self):
        """Returns once the drain started is stored; raises its failure."""
        if not self._under_way:
            return
        self._under_way = False
        error = self._results.get()
        if error is not None:
            raise error

    def _run(self):
        while True:
            windows = self._requests.get()
            try:
                self._take(windows)
                self._results.put(None)
            except BaseException as error:  # noqa: BLE001  (raised on the learner's thread)
                self._results.put(error)
