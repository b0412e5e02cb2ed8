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

The store, the credit and the windows taken in are in the learner's checkpoint. Windows
taken from the queue after that checkpoint (and those requested ahead) are lost when the
learner dies; the server's queue keeps the rest.
"""

import tensorflow as tf

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

    def _take(self):
        """Moves one drain of windows from the queue into the store (raises like the dataset:
        OutOfRangeError when none came within the timeout)."""
        self._add(self._windows.get_next())
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

    def ready_for_call(self):
        """Drains until the credit covers one learner call (or the run has no more windows),
        then spends it."""
        while self.credit.numpy() < self.samples_per_call and \
                int(self.taken.numpy()) + self.windows_per_drain <= self.run_windows:
            self._take()
        self.credit.assign_sub(min(float(self.credit.numpy()), float(self.samples_per_call)))
