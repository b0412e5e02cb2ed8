"""DQN's collect policy: epsilon-greedy that runs the Q-network only when it is needed.

TF-Agents' `EpsilonGreedyPolicy` computes the greedy action of every env copy on
every step and then throws it away for the copies that explore. With one env
copy and epsilon near 1 (the first ~250k agent steps of an Atari run) almost
every Nature-CNN forward pass (~0.4 ms, about a fifth of an env step's cost on
one core) was wasted. Stable-Baselines3 (`DQN.predict`) and Dopamine
(`DQNAgent._select_action`) toss the coin first and call the network only for a
greedy step; this policy does the same for a batch of copies: the network runs
when at least one copy acts greedily, on all of them.

The actions are distributed exactly as TF-Agents' policy draws them: a uniform
random action with probability epsilon, else the greedy one. Only which random
numbers are drawn differs, so a seeded run collects other (equally likely)
episodes than it did with TF-Agents' policy.
"""

import tensorflow as tf
from tf_agents.distributions import shifted_categorical
from tf_agents.policies import tf_policy
from tf_agents.trajectories import policy_step


def supports(greedy_policy):
    """Whether `greedy_policy` can be wrapped: stateless, no policy info, one discrete action,
    no action mask (random actions here are drawn from the whole action range)."""
    spec = greedy_policy.action_spec
    return (greedy_policy.observation_and_action_constraint_splitter is None
            and not tf.nest.flatten(greedy_policy.policy_state_spec)
            and not tf.nest.flatten(greedy_policy.info_spec)
            and not tf.nest.is_nested(spec) and spec.shape.rank == 0
            and spec.dtype.is_integer)


class EpsilonGreedyPolicy(tf_policy.TFPolicy):
    """Epsilon-greedy over `greedy_policy` that skips its forward pass when every copy explores.

    A stateless greedy policy is required (`supports`): a recurrent network must see
    every step, so it cannot be skipped. `epsilon` is a number or a callable (the
    agent's decaying schedule), read at every action.
    """

    def __init__(self, greedy_policy, epsilon):
        if not supports(greedy_policy):
            raise ValueError('EpsilonGreedyPolicy needs a stateless greedy policy without '
                             'policy info and a scalar discrete action spec.')
        super().__init__(greedy_policy.time_step_spec, greedy_policy.action_spec,
                         policy_state_spec=(), info_spec=(), clip=False, name='epsilon_greedy')
        self._greedy = greedy_policy
        self._epsilon = epsilon
        spec = greedy_policy.action_spec
        self._low, self._high = int(spec.minimum), int(spec.maximum)

    def _variables(self):
        return self._greedy.variables()

    def _action(self, time_step, policy_state, seed):
        del seed
        dtype = self.action_spec.dtype
        batch = tf.shape(time_step.step_type)[0]
        epsilon = self._epsilon() if callable(self._epsilon) else self._epsilon
        # When every copy explores, nothing below reads the time step: this dependency keeps
        # the action after it, so an env's step never starts before its previous one ended
        # (TFPyEnvironment refuses concurrent calls; collection loops run iterations in parallel).
        with tf.control_dependencies([time_step.step_type]):
            explore = tf.random.uniform([batch]) < tf.cast(epsilon, tf.float32)
            random_action = tf.cast(
                tf.random.uniform([batch], self._low, self._high + 1, dtype=tf.int64), dtype)
        greedy_action = tf.cond(
            tf.reduce_all(explore),
            lambda: tf.zeros([batch], dtype),
            lambda: tf.cast(self._greedy.action(time_step, policy_state).action, dtype))
        action = tf.where(explore, random_action, greedy_action)
        return policy_step.PolicyStep(action, policy_state, ())

    def _distribution(self, time_step, policy_state):
        """The mixture the actions are drawn from: epsilon / n on every action, plus
        1 - epsilon on the greedy one (this always runs the greedy policy)."""
        count = self._high - self._low + 1
        epsilon = self._epsilon() if callable(self._epsilon) else self._epsilon
        epsilon = tf.cast(epsilon, tf.float32)
        greedy = self._greedy.action(time_step, policy_state).action
        probs = epsilon / count + (1.0 - epsilon) * tf.one_hot(
            tf.cast(greedy, tf.int32) - self._low, count)
        distribution = shifted_categorical.ShiftedCategorical(
            probs=probs, dtype=self.action_spec.dtype, shift=self._low)
        return policy_step.PolicyStep(distribution, policy_state, ())
