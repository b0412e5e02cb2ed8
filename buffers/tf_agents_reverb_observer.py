"""TF-Agents' `ReverbAddTrajectoryObserver`, ours: the writing half of the drop-in Reverb pair.

The reading half, the packed table (`table`) and the layout checks both halves share live in
buffers/tf_agents_reverb.py, whose docstring tells the whole story; this module only writes.
It is a module of its own because writing is a job of its own: it shares only the table
with reading (the observer appends steps through a Python trajectory writer and creates the
items; the buffer streams them back through `tf.data` and decodes them).

On TF-Agents' own tables (one column per leaf, or no signature) the observer writes exactly
what `reverb_utils.ReverbAddTrajectoryObserver` writes, item for item; on a packed table it
encodes each step into `Layout`'s columns (buffers/reverb/layout.py), which needs `data_spec=`.
"""

import numpy as np
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory as trajectory_lib

from buffers.tf_agents_reverb import ReverbTableError, is_packed, packed_layout

__all__ = ['ReverbAddTrajectoryObserver']

_LAST = int(ts.StepType.LAST)

class ReverbAddTrajectoryObserver:
    """TF-Agents' `ReverbAddTrajectoryObserver`: same constructor and item rule, packed
    columns on a packed table.

    Call it with one unbatched `Trajectory` per step. Once `sequence_length` steps of an
    episode are cached, an item of the last `sequence_length` steps is created in every table,
    then one every `stride_length` steps; an episode's end (a boundary step) drops the cache,
    or, with `pad_end_of_episodes`, first pads it with zero boundary steps (all the
    `sequence_length - 1` tiles with `tile_end_of_episodes`). All of it TF-Agents' rule, the
    same items on the same stream.

    The tables' signatures decide the columns: TF-Agents' own (or none) -> one column per leaf,
    written as TF-Agents writes them; our packed layout (`table`) -> the step encoded into
    `Layout`'s columns, which needs `data_spec=` (the spec the table was built for).
    """

    def __init__(self, py_client, table_name, sequence_length, stride_length=1, priority=1,
                 pad_end_of_episodes=False, tile_end_of_episodes=False, *, data_spec=None):
        """Opens one trajectory writer on `py_client`.

        Args: as TF-Agents' `ReverbAddTrajectoryObserver`, plus `data_spec`: the trajectory
        spec of the steps, required (only) when the tables are packed.
        """
        self._table_names = [table_name] if isinstance(table_name, str) else list(table_name)
        self._sequence_length = sequence_length
        self._stride_length = stride_length
        self._priority = priority
        self._pad_end_of_episodes = pad_end_of_episodes
        self._tile_end_of_episodes = tile_end_of_episodes
        if tile_end_of_episodes and not pad_end_of_episodes:
            raise ValueError('Must set `pad_end_of_episodes=True` when using '
                             '`tile_end_of_episodes`')
        self._py_client = py_client
        self._data_spec = data_spec
        self._layout = self._find_layout()
        if self._layout is not None:
            self._specs = tf.nest.flatten(data_spec)
            self._dtypes = [spec.dtype.as_numpy_dtype for spec in self._specs]
            self._shapes = [tuple(spec.shape.as_list()) for spec in self._specs]
        self._writer = py_client.trajectory_writer(num_keep_alive_refs=sequence_length + 1,
                                                   validate_items=False)
        self._columns = None  # the writer's column histories, fetched once per structure
        self._cached_steps = 0  # steps of the current episode in the writer
        self._last_trajectory = None
        self._steps_written = 0  # every step appended (the packed layout's id leaf)

    def _find_layout(self):
        """The packed `Layout` if the tables declare it, else None (TF-Agents' columns)."""
        info = self._py_client.server_info()
        packed = []
        for name in self._table_names:
            try:
                signature = info[name].signature
            except KeyError:
                raise ReverbTableError(
                    f"The Reverb server has no table '{name}' (it has: "
                    f"{', '.join(sorted(info)) or 'none'}).") from None
            packed.append(is_packed(signature))
        if not any(packed):
            return None
        if not all(packed):
            raise ReverbTableError(
                f"Tables {self._table_names} mix our packed layout and TF-Agents' columns: one "
                "observer writes one layout, so give it tables of one kind.")
        if self._data_spec is None:
            raise ReverbTableError(
                f"Reverb table '{self._table_names[0]}' stores packed steps: pass data_spec= "
                "(the spec the table was built for) so the observer can pack them.")
        layouts = [packed_layout(info[name].signature, self._data_spec, name,
                                 self._sequence_length) for name in self._table_names]
        return layouts[0]

    @property
    def py_client(self):
        return self._py_client

    def get_table_signature(self):
        """What one item holds, logically: `add_outer_dim(data_spec)` on a packed table, else
        the first table's own signature (TF-Agents'); what `push_rlds_to_reverb` checks."""
        if self._layout is not None:
            return tensor_spec.add_outer_dim(self._data_spec)
        return self._py_client.server_info()[self._table_names[0]].signature

    def __call__(self, trajectory):
        """Writes one unbatched step; creates the items it completes."""
        self._last_trajectory = trajectory
        self._append(trajectory)
        self._write_cached_steps()
        # `Trajectory.is_boundary()` asks `tf.is_tensor` first, a Protocol check that costs
        # a third of a packed step; the step type as an array answers the same.
        if bool(np.all(np.asarray(trajectory.step_type) == _LAST)):
            self.reset(write_cached_steps=self._pad_end_of_episodes)

    def _get_writer(self):
        if self._writer is None:
            raise ValueError('Could not obtain writer from py_client.')
        return self._writer

    def _append(self, step):
        leaves = tf.nest.flatten(step)
        if self._layout is None:
            columns = [np.asarray(leaf) if isinstance(leaf, tf.Tensor) else leaf
                       for leaf in leaves]
        else:
            columns = self._encode(leaves)
        writer = self._get_writer()
        writer.append(columns)
        self._cached_steps += 1
        self._steps_written += 1
        if self._columns is None or len(self._columns) != len(columns):
            self._columns = writer.history  # live column objects: fetched once per structure

    def _encode(self, leaves):
        """One step's leaves -> the packed table's column values."""
        if len(leaves) != len(self._specs):
            raise ReverbTableError(
                f"The packed table stores steps of {len(self._specs)} leaves (data_spec), got "
                f"{len(leaves)}: write trajectories of the table's data spec.")
        arrays = []
        for leaf, dtype, shape in zip(leaves, self._dtypes, self._shapes):
            array = np.asarray(leaf, dtype=dtype)
            if array.shape != shape:
                raise ReverbTableError(
                    f"The packed table stores leaves of shapes {self._shapes}, got {array.shape} "
                    f"for one of shape {shape}: write unbatched steps of the table's data spec.")
            arrays.append(array[None])
        return self._layout.encode(arrays, np.array([self._steps_written], np.int64))[0]

    def _sequence_lengths_reached(self):
        return (self._cached_steps >= self._sequence_length
                and (self._cached_steps - self._sequence_length) % self._stride_length == 0)

    def _write_cached_steps(self):
        """Creates an item of the last `sequence_length` steps in every table, if one is due."""
        if not self._sequence_lengths_reached():
            return
        item = [column[-self._sequence_length:] for column in self._columns]
        writer = self._get_writer()
        for name in self._table_names:
            writer.create_item(table=name, trajectory=item, priority=self._priority)

    def flush(self):
        """Sends every pending item to the server and waits for it."""
        self._get_writer().flush()

    def _padding_step(self, example):
        """A boundary step (LAST -> FIRST) of zeros shaped like `example`."""
        def zeros(nest):
            return tf.nest.map_structure(lambda x: np.zeros_like(np.asarray(x)), nest)

        return trajectory_lib.boundary(zeros(example.observation), zeros(example.action),
                                       zeros(example.policy_info), zeros(example.reward),
                                       zeros(example.discount))

    def reset(self, write_cached_steps=True):
        """Ends the episode: optionally writes (pads) the cached steps, then clears the cache.

        Raises:
          ValueError: `write_cached_steps` without padding and too few steps cached.
        """
        if write_cached_steps and self._last_trajectory is not None:
            if self._pad_end_of_episodes:
                zero_step = self._padding_step(self._last_trajectory)
                pads = (self._sequence_length - 1 if self._tile_end_of_episodes
                        else self._sequence_length - self._cached_steps)
                for _ in range(pads):
                    self._append(zero_step)
                    self._write_cached_steps()
            elif self._sequence_lengths_reached():
                # TF-Agents writes the last due item once more here; so do we (same items).
                self._write_cached_steps()
            else:
                raise ValueError(
                    'write_cached_steps is True, but not enough steps remain in the cache to '
                    f'write an item with sequence_length={self._sequence_length}, consider '
                    'enabling pad_end_of_episodes.')
        self._cached_steps = 0
        self._last_trajectory = None
        if self._writer is None:
            self.open()
        else:
            self._writer.end_episode()

    def open(self):
        """Opens the writer again after `close` (no-op while open)."""
        if self._writer is None:
            self._writer = self._py_client.trajectory_writer(
                num_keep_alive_refs=self._sequence_length + 1, validate_items=False)
            self._columns = None
            self._cached_steps = 0

    def close(self):
        """Ends the episode and closes the writer (pending items are sent first)."""
        if self._writer is not None:
            self._writer.end_episode()
            self._writer.close()
            self._writer = None
            self._columns = None
