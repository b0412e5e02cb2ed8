"""Loading an RLDS dataset into replay: a Reverb table (TF-Agents' route) or any backend.

Both routes convert steps to TF-Agents `Trajectory`s as TF-Agents'
`rlds_to_reverb.convert_rlds_to_trajectories` does (the Reverb route calls it; loading
into a backend converts whole episodes at once, the same result ~4x faster), and both
check what arrived
against what the dataset holds: TF-Agents' CQL example sizes its table by the
shuffle buffer and silently keeps only the last 100 transitions; here a short
load is an error.
"""

import time

import reverb
import rlds
import tensorflow as tf
from tf_agents.replay_buffers import reverb_utils, rlds_to_reverb
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory

from core.errors import UserError


def trajectories(dataset):
    """The dataset's steps as a tf.data.Dataset of unbatched `Trajectory`s, in order."""
    return episode_trajectories(dataset).unbatch()


def episode_trajectories(dataset):
    """One `Trajectory` [L, ...] per episode: `convert_rlds_to_trajectories`, vectorised.

    TF-Agents pairs adjacent steps one element at a time (~60 us a step: a minute per 1M
    steps). The same fields come out of whole episodes: a step's type from is_first /
    is_last, the next step's type from the step after it (the next episode's first
    for an episode's last step), discount 0 on a terminal last step, a one-step episode
    as LAST -> LAST. Episodes must end on their is_last step and only there.
    """
    def convert(episode):
        steps = episode[rlds.STEPS].batch(2**31 - 1).get_single_element()
        is_first, is_last = steps[rlds.IS_FIRST], steps[rlds.IS_LAST]
        length = tf.shape(is_last)[0]
        tf.debugging.assert_equal(
            is_last, tf.range(length) == length - 1,
            message='An RLDS episode must end on its is_last step, and only there.')
        tf.debugging.assert_equal(
            tf.logical_and(steps[rlds.IS_TERMINAL], tf.logical_not(is_last)), False,
            message='Terminal step must be the last step of an episode.')
        step_type = tf.where(is_first, ts.StepType.FIRST,
                             tf.where(is_last, ts.StepType.LAST, ts.StepType.MID))
        next_step_type = tf.concat([step_type[1:], [ts.StepType.FIRST]], 0)
        one_step = tf.logical_and(tf.equal(step_type, ts.StepType.FIRST),
                                  tf.equal(next_step_type, ts.StepType.FIRST))
        step_type = tf.where(one_step, ts.StepType.LAST, step_type)
        next_step_type = tf.where(one_step, ts.StepType.LAST, next_step_type)
        discount = tf.where(tf.logical_and(is_last, steps[rlds.IS_TERMINAL]),
                            tf.zeros_like(steps[rlds.DISCOUNT]), steps[rlds.DISCOUNT])
        return trajectory.Trajectory(
            step_type=step_type, observation=steps[rlds.OBSERVATION],
            action=steps[rlds.ACTION], policy_info=(), next_step_type=next_step_type,
            reward=steps[rlds.REWARD], discount=discount)

    return dataset.episodes().map(convert)


def count_transitions(dataset):
    """(steps, transitions): each episode's final step starts no transition."""
    steps = dataset.count_steps()
    return steps, steps - dataset.num_episodes


def load_into_backend(dataset, backend, expected=None):
    """Adds every step of `dataset` to `backend` (built with num_envs=1), in order.

    Returns:
      The number of steps added.

    Raises:
      UserError: when the backend holds fewer steps afterwards than the dataset
        has (its capacity is too small, or the read stopped early).
    """
    added = _add_all(trajectories(dataset), backend)
    expected = dataset.count_steps() if expected is None else expected
    size = int(backend.metrics()['size'])
    if added != expected or size != expected:
        raise UserError(
            f"Loading {dataset.path} stored {size:,} of its {expected:,} steps: raise the "
            "replay capacity to at least the dataset's size.")
    return added


LOAD_CHUNK = 4096  # steps per `add_steps` call when the backend takes whole chunks


def _add_all(trajectory_dataset, backend):
    if backend.capabilities.bulk_steps:
        @tf.function
        def add_chunks():
            count = tf.constant(0, tf.int64)
            for chunk in trajectory_dataset.batch(min(LOAD_CHUNK, backend.capacity)):
                backend.add_steps(chunk)
                count += tf.shape(chunk.step_type, out_type=tf.int64)[0]
            return count

        return int(add_chunks().numpy())

    @tf.function
    def add_all():
        count = tf.constant(0, tf.int64)
        for step in trajectory_dataset:
            backend.add(tf.nest.map_structure(lambda x: x[None], step))
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
    load_into_backend(dataset, backend, expected=num_dataset_steps)
    if verbose:
        behaviour = dataset.metadata.get('average_return')
        behaviour_text = '' if behaviour is None else f", behaviour return {behaviour:.1f}"
        print(f"Loaded {dataset.path}: {num_dataset_steps:,} steps in {dataset.num_episodes:,} "
              f"episodes into {type(backend).__name__}{behaviour_text} "
              f"({time.perf_counter() - start:.1f} s).", flush=True)
    return backend
