"""Recurrent DQN trained on stored sequences (R2D2, Kapturowski et al., 2019).

`dqn.make_agent` builds it when `lstm_size` is bound (configs/r2d2_cartpole_pomdp.gin).

An LSTM Q-network acts with a state carried per env copy through collection
(agents/recurrent.py records it for replay); the learner samples sequences of
`burn_in_steps + trace_length + n_step_update` steps (buffers/sequence.py),
warms the state up over the burn-in, and trains every trace step on an n-step
double-Q target that stops at its episode's end. A sequence's priority is
R2D2's `eta * max + (1 - eta) * mean` of its trace's |TD errors|.

Why not TF-Agents' DqnAgent with a `QRnnNetwork`: it unrolls every sequence from a
zero state, has no burn-in, and its n-step targets run across episode ends.
"""

import collections

import tensorflow as tf
from tf_agents.agents import tf_agent
from tf_agents.networks import q_rnn_network
from tf_agents.policies import epsilon_greedy_policy, greedy_policy, q_policy
from tf_agents.trajectories import time_step as ts
from tf_agents.utils import common

from agents import recurrent
from agents.surface import AgentSurface

R2D2LossInfo = collections.namedtuple('R2D2LossInfo', ('td_error', 'priorities'))

_RESCALE_EPSILON = 1e-3


def rescale(x):
    """R2D2's value rescaling h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x."""
    return tf.sign(x) * (tf.sqrt(tf.abs(x) + 1.0) - 1.0) + _RESCALE_EPSILON * x


def unrescale(x):
    """The inverse of `rescale`."""
    eps = _RESCALE_EPSILON
    root = (tf.sqrt(1.0 + 4.0 * eps * (tf.abs(x) + 1.0 + eps)) - 1.0) / (2.0 * eps)
    return tf.sign(x) * (tf.square(root) - 1.0)


def n_step_targets(rewards, discounts, step_type, gamma, n, trace_length):
    """Per trace step: its discounted n-step reward sum, the factor its bootstrap value gets,
    and the index of the step it bootstraps from.

    The sum stops at the first LAST row within n steps (an episode end): a time limit
    bootstraps from that final observation, a termination (discount 0) not at all.

    Args:
      rewards, discounts, step_type: [B, trace_length + n] of the steps after burn-in.
      gamma: the discount factor.
      n: steps per target.
      trace_length: the trained steps.

    Returns:
      (returns [B, T], bootstrap_scale [B, T], bootstrap_index int32 [B, T]).
    """
    is_last = tf.equal(step_type, ts.StepType.LAST)
    positions = tf.range(trace_length)[None, :]
    shape = tf.shape(rewards[:, :trace_length])
    returns = tf.zeros(shape, rewards.dtype)
    scale = tf.ones(shape, rewards.dtype)
    stopped = tf.zeros(shape, tf.bool)
    index = tf.broadcast_to(positions + n, shape)
    for k in range(n):
        last = is_last[:, k:k + trace_length]
        index = tf.where(last & ~stopped, tf.broadcast_to(positions + k, shape), index)
        stopped = stopped | last
        returns += tf.where(stopped, tf.zeros_like(returns),
                            scale * rewards[:, k:k + trace_length])
        scale = tf.where(stopped, scale, scale * gamma * discounts[:, k:k + trace_length])
    return returns, scale, index


class R2D2Agent(AgentSurface, tf_agent.TFAgent):
    """Recurrent (double) DQN on stored sequences with burn-in; implements `AgentSurface`."""

    gives_priorities = True

    def __init__(self, time_step_spec, action_spec, *, q_network, optimizer, epsilon,
                 burn_in_steps, trace_length, sequence_period, n_step_update, initial_state,
                 gamma, double_dqn, value_rescaling, priority_eta, td_loss, gradient_clipping,
                 reward_scale_factor, target_update_period, target_update_tau, train_step):
        q_network.create_variables()
        self._q_network = q_network
        self._target_q_network = common.maybe_copy_target_network_with_checks(
            q_network, None, name='TargetQRnnNetwork')
        self._optimizer = optimizer
        self._epsilon = epsilon
        self._burn_in = burn_in_steps
        self._trace_length = trace_length
        self.sequence_period = sequence_period
        self._n = n_step_update
        self._initial_state = initial_state
        self._gamma = gamma
        self._double_dqn = double_dqn
        self._value_rescaling = value_rescaling
        self._eta = priority_eta
        self._td_loss = td_loss
        self._gradient_clipping = gradient_clipping
        self._reward_scale = reward_scale_factor
        # QPolicy alone samples from a softmax of the Q-values; GreedyPolicy takes the argmax.
        greedy = greedy_policy.GreedyPolicy(
            q_policy.QPolicy(time_step_spec, action_spec, q_network=q_network))
        collect = recurrent.StateRecordingPolicy(
            epsilon_greedy_policy.EpsilonGreedyPolicy(greedy, epsilon=epsilon))
        super().__init__(time_step_spec, action_spec, greedy, collect,
                         train_sequence_length=burn_in_steps + trace_length + n_step_update,
                         train_step_counter=train_step)
        self._update_target = common.Periodically(
            lambda: common.soft_variables_update(
                self._q_network.variables, self._target_q_network.variables,
                target_update_tau, tau_non_trainable=1.0),
            target_update_period, 'periodic_update_targets')

    def _initialize(self):
        common.soft_variables_update(self._q_network.variables,
                                     self._target_q_network.variables, tau=1.0)

    # AgentSurface

    def summary_scalars(self):
        return {'train/epsilon': self._epsilon()}

    def batch_diagnostics(self, experience):
        """Mean over the batch's valid steps of max_a Q, unrolled from the start state."""
        state = recurrent.start_state(experience, self._q_network, self._initial_state)
        q_values, _ = self._q_network(experience.observation, step_type=experience.step_type,
                                      network_state=state)
        mask = recurrent.sequence_mask(experience.step_type)
        best = tf.reduce_max(q_values, axis=-1)
        if self._value_rescaling:
            best = unrescale(best)
        return {'mean_q': tf.math.divide_no_nan(tf.reduce_sum(best * mask),
                                                tf.reduce_sum(mask))}

    def sample_priorities(self, loss_info):
        """R2D2's sequence priority: eta * max + (1 - eta) * mean of |TD| over its trace."""
        return loss_info.extra.priorities

    # Training

    def _train(self, experience, weights):
        with tf.GradientTape() as tape:
            loss_info = self._loss(experience, weights=weights, training=True)
        variables = self._q_network.trainable_weights
        gradients = tape.gradient(loss_info.loss, variables)
        if self._gradient_clipping:
            gradients, _ = tf.clip_by_global_norm(gradients, self._gradient_clipping)
        self._optimizer.apply_gradients(zip(gradients, variables))
        self.train_step_counter.assign_add(1)
        self._update_target()
        return loss_info

    def _loss(self, experience, weights=None, training=False):
        """Mean over the batch (importance-weighted) of each sequence's mean TD loss."""
        state = recurrent.start_state(experience, self._q_network, self._initial_state)
        online_state, target_state = recurrent.burn_in(
            [self._q_network, self._target_q_network], experience, state, self._burn_in)
        trained = recurrent.after_burn_in(experience, self._burn_in)
        q_values, _ = self._q_network(trained.observation, step_type=trained.step_type,
                                      network_state=online_state, training=training)
        target_q, _ = self._target_q_network(trained.observation, step_type=trained.step_type,
                                             network_state=target_state)
        length = self._trace_length
        returns, scale, index = n_step_targets(
            self._reward_scale * trained.reward, trained.discount, trained.step_type,
            self._gamma, self._n, length)
        chooser = q_values if self._double_dqn else target_q
        best = tf.argmax(tf.gather(chooser, index, batch_dims=1), axis=-1,
                         output_type=tf.int32)
        value = tf.gather(tf.gather(target_q, index, batch_dims=1), best, batch_dims=2)
        if self._value_rescaling:
            target = rescale(returns + scale * unrescale(value))
        else:
            target = returns + scale * value
        actions = tf.cast(trained.action[:, :length], tf.int32)
        taken = tf.gather(q_values[:, :length], actions, batch_dims=2)
        target = tf.stop_gradient(target)
        td_error = taken - target
        mask = recurrent.sequence_mask(experience.step_type)[:, self._burn_in:][:, :length]
        count = tf.maximum(tf.reduce_sum(mask, axis=1), 1.0)
        per_sequence = tf.reduce_sum(self._td_loss(target, taken) * mask, axis=1) / count
        if weights is None:
            weights = tf.ones_like(per_sequence)
        loss = tf.reduce_mean(per_sequence * tf.cast(weights, per_sequence.dtype))
        tf.debugging.check_numerics(loss, 'R2D2 loss is not finite')
        magnitude = tf.abs(td_error) * mask
        priorities = (self._eta * tf.reduce_max(magnitude, axis=1)
                      + (1.0 - self._eta) * tf.reduce_sum(magnitude, axis=1) / count)
        return tf_agent.LossInfo(loss, R2D2LossInfo(td_error * mask,
                                                    tf.stop_gradient(priorities)))


def make_r2d2(time_step_spec, action_spec, train_step, *, fc_layer_params, lstm_size,
              output_fc_layer_params, optimizer, epsilon, burn_in_steps, trace_length,
              sequence_period, n_step_update, initial_state, gamma, double_dqn,
              value_rescaling, priority_eta, td_loss, gradient_clipping, reward_scale_factor,
              target_update_period, target_update_tau):
    """An `R2D2Agent` on an LSTM Q-network: what `dqn.make_agent` builds when it is given an
    `lstm_size` (its bindings are checked there)."""
    recurrent.check_sequence_settings('dqn.make_agent', burn_in_steps=burn_in_steps,
                                      trace_length=trace_length,
                                      sequence_period=sequence_period,
                                      initial_state=initial_state)
    network = q_rnn_network.QRnnNetwork(
        time_step_spec.observation, action_spec,
        input_fc_layer_params=tuple(fc_layer_params), lstm_size=tuple(lstm_size),
        output_fc_layer_params=tuple(output_fc_layer_params))
    agent = R2D2Agent(
        time_step_spec, action_spec, q_network=network, optimizer=optimizer, epsilon=epsilon,
        burn_in_steps=burn_in_steps, trace_length=trace_length,
        sequence_period=sequence_period, n_step_update=n_step_update,
        initial_state=initial_state, gamma=gamma, double_dqn=double_dqn,
        value_rescaling=value_rescaling, priority_eta=priority_eta, td_loss=td_loss,
        gradient_clipping=gradient_clipping, reward_scale_factor=reward_scale_factor,
        target_update_period=target_update_period, target_update_tau=target_update_tau,
        train_step=train_step)
    agent.initialize()
    return agent
