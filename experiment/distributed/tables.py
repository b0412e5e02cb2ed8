"""The weight hand-off between learner and actors: the replay server's second table.

(The replay table is the run's Reverb replay backend's own, built by that
backend in the replay role; collectors write and the learner samples through
the same backend class pointed at the server.)

Variables table: one item (max_size 1, Fifo) holding the latest policy
weights and the learner's train step, in the layout of TF-Agents'
`ReverbVariableContainer` (table `variables`, keys `policy_variables` and
`train_step`, flat columns), so its tools can read it. We do not use that
class itself because none of its waits is bounded: its constructor calls
`server_info()` without a timeout and `pull` blocks forever on an empty
table or an absent server. `WeightStore` pushes with a flush timeout and
pulls only after a timed `server_info` shows an item.
"""

import numpy as np
import reverb
import tensorflow as tf
import tree

from core.errors import UserError

VARIABLES_TABLE = 'variables'
POLICY_KEY = 'policy_variables'
TRAIN_STEP_KEY = 'train_step'


def variables_signature(policy_variables):
    return {POLICY_KEY: [tf.TensorSpec(v.shape, v.dtype) for v in policy_variables],
            TRAIN_STEP_KEY: tf.TensorSpec([], tf.int64)}


def variables_table(policy_variables):
    """One item, replaced on every push; `MinSize(1)` so a pull never waits on inserts."""
    return reverb.Table(
        name=VARIABLES_TABLE,
        sampler=reverb.selectors.Uniform(),
        remover=reverb.selectors.Fifo(),
        max_size=1,
        rate_limiter=reverb.rate_limiters.MinSize(1),
        signature=variables_signature(policy_variables))


class WeightStore:
    """Pushes and pulls policy weights through the variables table, every wait bounded."""

    def __init__(self, address, *, timeout_s):
        self._address = address
        self._timeout_s = timeout_s
        self._client = reverb.Client(address)
        self._pushes_pulled = 0  # the variables table's insert count at the last pull

    def server_info(self):
        return self._client.server_info(max(1, int(self._timeout_s)))

    def push(self, policy_weights, train_step):
        """Replaces the stored weights (variables or arrays); raises DeadlineExceededError
        after `timeout_s`."""
        values = {POLICY_KEY: [np.asarray(v) for v in policy_weights],
                  TRAIN_STEP_KEY: np.int64(train_step)}
        # Probe first: a writer opened against a dead server and closed with a failed
        # flush has crashed the process natively (malloc) in Reverb 0.14; the probe
        # raises instead, and the caller retries.
        self.server_info()
        writer = self._client.trajectory_writer(num_keep_alive_refs=1)
        try:
            writer.append(values)
            writer.create_item(VARIABLES_TABLE, 1.0,
                               tree.map_structure(lambda column: column[-1], writer.history))
            writer.flush(timeout_ms=int(self._timeout_s * 1000))
        finally:
            writer.close()

    def pull(self):
        """(list of weight arrays, train step), or None while nothing new has been pushed.

        A pull transfers and decompresses every weight (megabytes for a convolutional
        network) and collectors pull more often than the learner pushes, so the table's
        insert count, read in the same `server_info` call that checks it is not empty,
        tells whether a push has landed since this store's last pull. The count is read
        before the sample, so a push landing in between is pulled again next time, never
        missed (a server restarted empty counts from 0 again: its first push may then be
        skipped, and the collector acts on the weights it has until the next).
        """
        tables = self.server_info()
        if VARIABLES_TABLE not in tables:
            raise UserError(
                f"the Reverb server at {self._address} has no '{VARIABLES_TABLE}' table, so it "
                "is not this run's replay server: pass --replay_address=HOST:PORT of the "
                "server this run's replay role (train.py --role=replay) serves on")
        info = tables[VARIABLES_TABLE]
        pushes = int(info.rate_limiter_info.insert_stats.completed)
        if info.current_size == 0 or pushes == self._pushes_pulled:
            return None
        sample = next(self._client.sample(VARIABLES_TABLE, emit_timesteps=False,
                                          unpack_as_table_signature=True))
        self._pushes_pulled = pushes
        return list(sample.data[POLICY_KEY]), int(sample.data[TRAIN_STEP_KEY])


def assign(variables, values):
    """Copies pulled weights into a policy's variables (same agent config: same order)."""
    if len(variables) != len(values):
        raise ValueError(f"pulled {len(values)} weight arrays for {len(variables)} variables")
    for variable, value in zip(variables, values):
        variable.assign(value)
