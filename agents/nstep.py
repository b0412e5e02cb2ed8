"""Episode-aware n-step windows.

TF-Agents turns an `n + 1`-step window into one n-step transition with
`to_n_step_transition`, which is right only when the window stays inside one
episode or the episode *terminated* (discount 0 stops the sum). When a time
limit *truncates* an episode inside the window, the discount is 1 and the sum
runs on into the next episode's rewards and bootstraps from the wrong state
(tensorflow/agents#939). `stop_windows_at_episode_end` rewrites such windows
so the n-step target stops at the episode's LAST step and bootstraps from it:
termination gives a target of the rewards alone, truncation bootstraps.
"""

import tensorflow as tf
from tf_agents.trajectories import time_step as ts


def stop_windows_at_episode_end(experience, gamma):
    """Cuts each window of a `[B, T, ...]` Trajectory at its first LAST step.

    For a window whose step k (0 < k < T - 1) is LAST, steps k.. contribute no
    reward, and the final frame becomes step k. The discount of steps k..T-2 is
    set to `1 / gamma` so that TF-Agents' fixed `gamma ** n` factor becomes
    `gamma ** k`: the target is `sum_{i<k} gamma^i r_i + gamma^k d V(s_k)`.

    Args:
      experience: a `Trajectory` with tensors shaped `[B, T, ...]`.
      gamma: the agent's discount factor (> 0).

    Returns:
      A `Trajectory` of the same structure; unchanged when T <= 2.
    """
    num_frames = experience.step_type.shape[1]
    if num_frames is None or num_frames <= 2:
        # One-step windows: a LAST first frame is masked by the agent itself.
        return experience
    is_last = tf.equal(experience.step_type, ts.StepType.LAST)
    inner_last = tf.concat(
        [tf.zeros_like(is_last[:, :1]), is_last[:, 1:]], axis=1)
    ended = tf.cumsum(tf.cast(inner_last, tf.int32), axis=1) > 0  # [B, T]
    # Index of the frame to bootstrap from: the first inner LAST, else T - 1.
    first_end = tf.where(
        tf.reduce_any(inner_last[:, :-1], axis=1),
        tf.argmax(tf.cast(inner_last[:, :-1], tf.int32), axis=1, output_type=tf.int32),
        num_frames - 1)

    def with_final_frame(values):
        final = tf.gather(values, first_end, axis=1, batch_dims=1)
        return tf.concat([values[:, :-1], final[:, None]], axis=1)

    reward = tf.where(ended, tf.zeros_like(experience.reward), experience.reward)
    discount = tf.where(
        ended,
        tf.fill(tf.shape(experience.discount), tf.cast(1.0 / gamma, experience.discount.dtype)),
        experience.discount)
    return experience._replace(
        observation=tf.nest.map_structure(with_final_frame, experience.observation),
        step_type=with_final_frame(experience.step_type),
        reward=reward,
        discount=discount)
