"""How a step of one env copy maps onto Reverb columns, and back after sampling."""

import math

import numpy as np
import tensorflow as tf

OWN_COLUMN_BYTES = 256  # leaves this large keep a column; smaller ones share the packed one


class Layout:
    """How one env copy's step maps onto Reverb columns, and back after sampling.

    Why pack: the writer's and the sampler's cost grows with the number of
    columns per item (every column is its own chunk stream, compressed, sent
    and unpacked per sample), far more than with bytes for small leaves. A
    `Trajectory` has 6 leaves plus our first-step id, 7 columns per env copy.
    `packed` keeps each leaf of at least `OWN_COLUMN_BYTES` (an image
    observation) in a column of its own -- slicing it out of a byte column
    after sampling would copy it once more -- and writes every smaller leaf
    and the id as raw bytes into one uint8 column, bit-cast back after
    sampling. A CartPole-like step is then 1 column, an Atari-like one 2. String
    leaves (compressed frames) always keep their own column.
    """

    def __init__(self, data_spec, num_steps):
        self._data_spec = data_spec
        self._num_steps = num_steps
        # The first-step id, `step * num_envs + env`, is stored as one more leaf.
        self._specs = [*tf.nest.flatten(data_spec), tf.TensorSpec([], tf.int64)]
        # Strings (compressed frames, buffers/frames.py) vary in length: a column of their own.
        sizes = [math.inf if spec.dtype == tf.string else
                 spec.shape.num_elements() * spec.dtype.size for spec in self._specs]
        self._own = [i for i, size in enumerate(sizes[:-1]) if size >= OWN_COLUMN_BYTES]
        self._small = [i for i in range(len(self._specs)) if i not in self._own]
        offsets = np.cumsum([0] + [sizes[i] for i in self._small])
        self._slices = dict(zip(self._small, zip(offsets[:-1], offsets[1:])))
        self.packed_bytes = int(offsets[-1])
        self.num_columns = len(self._own) + 1
        self.signature = tuple(
            [tf.TensorSpec([num_steps, *self._specs[i].shape], self._specs[i].dtype)
             for i in self._own] + [tf.TensorSpec([num_steps, self.packed_bytes], tf.uint8)])

    def encode(self, leaves, ids):
        """Batched numpy leaves `[N, ...]` and ids `[N]` -> per copy, its columns' values."""
        num_envs = len(ids)
        leaves = [*leaves, ids]
        packed = np.concatenate(
            [np.ascontiguousarray(leaves[i]).reshape(num_envs, -1).view(np.uint8)
             for i in self._small], axis=1)
        own = [leaves[i] for i in self._own]
        return [[*(leaf[env] for leaf in own), packed[env]] for env in range(num_envs)]

    def item(self, columns, num_steps):
        """The trajectory of one item: the last `num_steps` steps of one copy's columns."""
        window = slice(-num_steps, None)
        return tuple(column[window] for column in columns)

    def decode(self, data):
        """Sampled columns `[B, T, ...]` -> (the data spec's nest `[B, T, ...]`, ids `[B]`)."""
        columns = list(data)
        packed = columns[-1]
        outer = packed.shape[:2].as_list()  # static [B, T] when batched with drop_remainder
        if None in outer:
            outer = tf.unstack(tf.shape(packed)[:2])
        flat = [None] * len(self._specs)
        for i, column in zip(self._own, columns[:-1]):
            flat[i] = column
        for i in self._small:
            spec = self._specs[i]
            begin, end = self._slices[i]
            raw = packed[:, :, begin:end]
            if spec.dtype == tf.bool:
                value = tf.not_equal(raw, 0)
            elif spec.dtype.size == 1:
                value = raw if spec.dtype == tf.uint8 else tf.bitcast(raw, spec.dtype)
            else:
                raw = tf.reshape(raw, [*outer, -1, spec.dtype.size])
                value = tf.bitcast(raw, spec.dtype)
            flat[i] = tf.reshape(value, [*outer, *spec.shape.as_list()])
        ids = flat.pop()[:, 0]
        return tf.nest.pack_sequence_as(self._data_spec, flat), ids


class SequenceLayout:
    """A sequence table's columns: the steps' columns (`Layout`, without `policy_info`) and one
    more, the start state, referenced once per item (its first step's).

    Steps are appended every step; the start-state column only at steps that start a
    sequence (buffers/reverb/writer.py, `SequenceWriter`), so the state costs its bytes once
    per sequence start, not once per step. An item covers the last `num_steps` steps and the
    state cell of its first step; Reverb's chunks let overlapping items share their steps.
    """

    def __init__(self, data_spec, num_steps):
        self._data_spec = data_spec
        self._num_steps = num_steps
        self.rows = Layout(data_spec._replace(policy_info=()), num_steps)
        self._state_specs = tf.nest.flatten(data_spec.policy_info)
        self._state_sizes = [spec.shape.num_elements() * spec.dtype.size
                             for spec in self._state_specs]
        self.state_bytes = sum(self._state_sizes)
        self.num_columns = self.rows.num_columns + 1
        self.signature = (*self.rows.signature, tf.TensorSpec([self.state_bytes], tf.uint8))

    def split(self, leaves):
        """Flat numpy leaves of a batched `Trajectory` -> (the rows' leaves, the state leaves)."""
        step = tf.nest.pack_sequence_as(self._data_spec, list(leaves))
        return (tf.nest.flatten(step._replace(policy_info=())),
                tf.nest.flatten(step.policy_info))

    def encode(self, row_leaves, ids):
        return self.rows.encode(row_leaves, ids)

    def encode_states(self, state_leaves):
        """Batched state leaves `[N, ...]` -> per copy, its state as one uint8 vector."""
        num_envs = len(state_leaves[0])
        return np.concatenate([np.ascontiguousarray(leaf).reshape(num_envs, -1).view(np.uint8)
                               for leaf in state_leaves], axis=1)

    def item(self, columns, num_steps):
        """The last `num_steps` steps of one copy's step columns, and its first step's state."""
        return (*self.rows.item(columns[:-1], num_steps), columns[-1][-num_steps])

    def decode(self, data):
        """Sampled columns -> (the data spec's nest [B, T, ...] with the start state repeated
        over T in `policy_info`, first-step ids [B])."""
        columns = list(data)
        window, ids = self.rows.decode(columns[:-1])
        packed = columns[-1]
        states, offset = [], 0
        time = tf.shape(window.step_type)[1]
        for spec, size in zip(self._state_specs, self._state_sizes):
            raw = packed[:, offset:offset + size]
            offset += size
            if spec.dtype.size > 1:
                raw = tf.reshape(raw, [-1, size // spec.dtype.size, spec.dtype.size])
            value = tf.reshape(tf.bitcast(raw, spec.dtype) if spec.dtype != tf.uint8 else raw,
                               [-1, *spec.shape.as_list()])
            states.append(tf.repeat(value[:, None], time, axis=1))
        return window._replace(
            policy_info=tf.nest.pack_sequence_as(self._data_spec.policy_info, states)), ids
