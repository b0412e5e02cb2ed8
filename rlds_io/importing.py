"""Loading an RLDS dataset into replay: a Reverb table (TF-Agents' route) or any backend.

Both routes convert steps to TF-Agents `Trajectory`s with TF-Agents' own
`rlds_to_reverb.convert_rlds_to_trajectories`, and both check what arrived
against what the dataset holds: TF-Agents' CQL example sizes its table by the
shuffle buffer and silently keeps only the last 100 transitions; here a short
load is an error.
"""

import time

import reverb
import tensorflow as tf
from tf_agents.replay_buffers import reverb_utils, rlds_to_reverb
from tf_agents.specs import tensor_spec

from core.errors import UserError


def trajectories(dataset):
    """The dataset's steps as a tf.data.Dataset of unbatched `Trajectory`s, in order."""
    return rlds_to_reverb.convert_rlds_to_trajectories(dataset.episodes())


def count_transitions(dataset):
    """(steps, transitions): each episode's final step starts no transition."""
    steps = dataset.count_steps()
    return steps, steps - dataset.num_episodes


def load_into_backend(dataset, backend):
    """Adds every step of `dataset` to `backend` (built with num_envs=1), in order.

    Returns:
      The number of steps added.

    Raises:
      UserError: when the backend holds fewer steps afterwards than the dataset
        has (its capacity is too small, or the read stopped early).
    """
    added = _add_all(trajectories(dataset), backend)
    expected = dataset.count_steps()
    size = int(backend.metrics()['size'])
    if added != expected or size != expected:
        raise UserError(
            f"Loading {dataset.path} stored {size:,} of its {expected:,} steps: raise the "
            "replay capacity to at least the dataset's size.")
    return added


def _add_all(trajectory_dataset, backend):
    @tf.function
    def add_all():
        count = tf.constant(0, tf.int64)
        for trajectory in trajectory_dataset:
            backend.add(tf.nest.map_structure(lambda x: x[None], trajectory))
            count += 1
        return count

    return int(add_all().numpy())


def make_transition_table(name, dataset):
    """A uniform Reverb table of 2-step windows sized to hold the whole dataset.

    Its signature is TF-Agents' spec for the dataset's trajectories (what
    `push_rlds_to_reverb` insists on), and its size is the dataset's number of
    transitions, so nothing is evicted.
    """
    _, num_transitions = count_transitions(dataset)
    signature = tensor_spec.add_outer_dim(
        rlds_to_reverb.create_trajectory_data_spec(dataset.episodes()))
    return reverb.Table(name, max_size=int(num_transitions), sampler=reverb.selectors.Uniform(),
                        remover=reverb.selectors.Fifo(),
                        rate_limiter=reverb.rate_limiters.MinSize(1),
                        signature=signature)


def push_to_reverb(dataset, client, table_name):
    """Writes the dataset into a Reverb table with TF-Agents' `push_rlds_to_reverb`.

    Every transition becomes one 2-step item (an episode of L steps gives
    L - 1). The table must already exist (see `make_transition_table`).

    Returns:
      (steps pushed, items in the table).

    Raises:
      UserError: when the table does not hold exactly one item per transition.
    """
    episodes = dataset.episodes()
    observer = reverb_utils.ReverbAddTrajectoryObserver(
        client, table_name, sequence_length=2, stride_length=1)
    try:
        pushed = rlds_to_reverb.push_rlds_to_reverb(episodes, observer)
        observer.flush()
    finally:
        observer.close()
    _, expected = count_transitions(dataset)
    items = int(client.server_info()[table_name].current_size)
    if items != expected:
        raise UserError(
            f"Reverb table '{table_name}' holds {items:,} items after importing {dataset.path}, "
            f"but the dataset has {expected:,} transitions: size the table with "
            "make_transition_table(name, dataset) so nothing is evicted.")
    return pushed, items


def load_dataset_into_backend(dataset, replay_backend, *, spec, batch_size, num_steps, seed,
                              verbose=True):
    """A backend holding every step of `dataset` (capacity = its size), with a count check."""
    num_dataset_steps = dataset.count_steps()
    capacity = max(num_dataset_steps, batch_size)
    backend = replay_backend(spec, capacity=capacity, num_envs=1, batch_size=batch_size,
                             num_steps=num_steps, seed=seed)
    start = time.perf_counter()
    load_into_backend(dataset, backend)
    if verbose:
        behaviour = dataset.metadata.get('average_return')
        behaviour_text = '' if behaviour is None else f", behaviour return {behaviour:.1f}"
        print(f"Loaded {dataset.path}: {num_dataset_steps:,} steps in {dataset.num_episodes:,} "
              f"episodes into {type(backend).__name__}{behaviour_text} "
              f"({time.perf_counter() - start:.1f} s).", flush=True)
    return backend
