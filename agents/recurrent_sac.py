"""Recurrent SAC: actor and critics with memory, trained on stored sequences with burn-in.

`sac.make_agent` builds it when `lstm_size` is bound
(configs/sac_recurrent_pendulum_pomdp.gin). The sequence machinery is R2D2's
(agents/recurrent.py, buffers/sequence.py): the collect policy records its
state, the learner samples `burn_in_steps + trace_length + 1` steps, warms
states up over the burn-in and trains every trace step.

The critics are history encoders with a Q head: an LSTM reads the
observations, and Q(h_t, a) is an MLP of its output and an action. Why not
TF-Agents' `CriticRnnNetwork`: it feeds the action into the LSTM, so the
critic's state at step t depends on the actions taken before, and evaluating
another action (the actor's sample, the target's next action) would need a
new unroll per action. Here one unroll per critic serves every action.

Whose state is stored: the actor's (the collect policy runs only the actor).
The critics unroll from a zero state over the whole sequence, so with
burn-in their state is warmed up exactly like the actor's.
"""

import collections

import tensorflow as tf
from tf_agents.agents import tf_agent
from tf_agents.agents.sac import tanh_normal_projection_network
from tf_agents.keras_layers import dynamic_unroll_layer
from tf_agents.networks import actor_distribution_rnn_network, network
from tf_agents.policies import actor_policy, greedy_policy
from tf_agents.trajectories import time_step as ts
from tf_agents.utils import common

from agents import recurrent
from agents.surface import AgentSurface

RecurrentSacLossInfo = collections.namedtuple(
    'RecurrentSacLossInfo', ('critic_loss', 'actor_loss', 'alpha_loss', 'priorities'))


def _lstm_cell(lstm_size):
    cells = [tf.keras.layers.LSTMCell(size) for size in lstm_size]
    return cells[0] if len(cells) == 1 else tf.keras.layers.StackedRNNCells(cells)


class RecurrentCriticNetwork(network.Network):
    """Q(h_t, a): an LSTM over the observations (reset at FIRST), then an MLP of [h_t, a]."""

    def __init__(self, input_tensor_spec, *, observation_fc_layer_params, lstm_size,
                 joint_fc_layer_params, name='RecurrentCriticNetwork'):
        cell = _lstm_cell(lstm_size)
        state_spec = tf.nest.map_structure(
            lambda size: tf.TensorSpec([size], tf.float32), cell.state_size)
        super().__init__(input_tensor_spec, state_spec=state_spec, name=name)
        self._observation_layers = [tf.keras.layers.Dense(units, activation='relu')
                                    for units in observation_fc_layer_params]
        self._unroll = dynamic_unroll_layer.DynamicUnroll(cell)
        self._joint_layers = [tf.keras.layers.Dense(units, activation='relu')
                              for units in joint_fc_layer_params]
        self._value = tf.keras.layers.Dense(1)

    def history(self, observation, step_type, network_state, training=False):
        """[B, T, ...] observations -> ([B, T, H] history encodings, the state after)."""
        encoded = tf.cast(observation, tf.float32)
        for layer in self._observation_layers:
            encoded = layer(encoded, training=training)
        return self._unroll(encoded, initial_state=network_state,
                            reset_mask=tf.equal(step_type, ts.StepType.FIRST),
                            training=training)

    def q(self, history, action, training=False):
        """Q of `action` [..., A] after `history` [..., H] -> [...]."""
        joint = tf.concat([history, tf.cast(action, history.dtype)], axis=-1)
        for layer in self._joint_layers:
            joint = layer(joint, training=training)
        return tf.squeeze(self._value(joint, training=training), axis=-1)

    def call(self, inputs, step_type=None, network_state=(), training=False):
        observation, action = inputs
        single_step = observation.shape.rank == len(self.input_tensor_spec[0].shape) + 1
        if single_step:
            observation, action, step_type = (observation[:, None], action[:, None],
                                              step_type[:, None])
        if not tf.nest.flatten(network_state):
            network_state = self.get_initial_state(tf.shape(observation)[0])
        history, network_state = self.history(observation, step_type, network_state, training)
        values = self.q(history, action, training)
        return (values[:, 0] if single_step else values), network_state


class RecurrentSacAgent(AgentSurface, tf_agent.TFAgent):
    """SAC with an LSTM actor and LSTM critics on stored sequences; an `AgentSurface`."""

    gives_priorities = True

    def __init__(self, time_step_spec, action_spec, *, actor_network, critic_network,
                 actor_optimizer, critic_optimizer, alpha_optimizer, burn_in_steps,
                 trace_length, sequence_period, initial_state, priority_eta, target_entropy,
                 initial_log_alpha, target_update_tau, target_update_period, gamma,
                 reward_scale_factor, gradient_clipping, train_step):
        actor_network.create_variables()
        critic_network.create_variables()
        self._actor_network = actor_network
        self._critics = [critic_network, critic_network.copy(name='CriticNetwork2')]
        self._target_critics = [critic.copy(name=f'TargetCriticNetwork{i + 1}')
                                for i, critic in enumerate(self._critics)]
        for critic in self._critics[1:] + self._target_critics:
            critic.create_variables()
        self._actor_optimizer = actor_optimizer
        self._critic_optimizer = critic_optimizer
        self._alpha_optimizer = alpha_optimizer
        self._log_alpha = tf.Variable(initial_log_alpha, dtype=tf.float32, name='log_alpha')
        self._burn_in = burn_in_steps
        self._trace_length = trace_length
        self.sequence_period = sequence_period
        self._initial_state = initial_state
        self._eta = priority_eta
        self._target_entropy = target_entropy
        self._gamma = gamma
        self._reward_scale = reward_scale_factor
        self._gradient_clipping = gradient_clipping
        stochastic = actor_policy.ActorPolicy(time_step_spec, action_spec, actor_network,
                                              training=False)
        super().__init__(time_step_spec, action_spec, greedy_policy.GreedyPolicy(stochastic),
                         recurrent.StateRecordingPolicy(stochastic),
                         train_sequence_length=burn_in_steps + trace_length + 1,
                         train_step_counter=train_step)
        critic_variables = [v for critic in self._critics for v in critic.variables]
        target_variables = [v for critic in self._target_critics for v in critic.variables]
        self._update_target = common.Periodically(
            lambda: common.soft_variables_update(critic_variables, target_variables,
                                                 target_update_tau, tau_non_trainable=1.0),
            target_update_period, 'periodic_update_targets')

    def _initialize(self):
        for critic, target in zip(self._critics, self._target_critics):
            common.soft_variables_update(critic.variables, target.variables, tau=1.0)

    @property
    def alpha(self):
        return tf.exp(self._log_alpha)

    # AgentSurface

    def summary_scalars(self):
        return {'train/alpha': self.alpha}

    def batch_diagnostics(self, experience):
        """Mean Q of the first critic on the replayed actions and the policy's entropy
        estimate, over the batch's trained steps."""
        trained, mask, actor_state = self._prepare(experience)
        length = self._trace_length
        [history] = self._histories(self._critics[:1], experience, trained)
        q_1 = self._critics[0].q(history[:, :length], trained.action[:, :length])
        _, log_pi = self._actions_and_log_probs(trained, actor_state)

        def masked_mean(values):
            return tf.math.divide_no_nan(tf.reduce_sum(values * mask), tf.reduce_sum(mask))

        return {'mean_q': masked_mean(q_1), 'entropy': -masked_mean(log_pi[:, :length])}

    def sample_priorities(self, loss_info):
        return loss_info.extra.priorities

    # Training

    def _actions_and_log_probs(self, inputs, state, training=False):
        distribution, _ = self._actor_network(inputs.observation, step_type=inputs.step_type,
                                              network_state=state, training=training)
        actions = tf.nest.map_structure(lambda d: d.sample(), distribution)
        log_pi = common.log_probability(distribution, actions, self.action_spec)
        return actions, log_pi

    def _prepare(self, experience):
        """The trained steps, their loss mask, and the actor's state after the burn-in."""
        trained = recurrent.after_burn_in(experience, self._burn_in)
        mask = recurrent.sequence_mask(experience.step_type)[:, self._burn_in:]
        actor_state = recurrent.start_state(experience, self._actor_network,
                                            self._initial_state)
        [actor_state] = recurrent.burn_in([self._actor_network], experience, actor_state,
                                          self._burn_in)
        return trained, mask[:, :self._trace_length], actor_state

    def _histories(self, critics, experience, trained, training=False):
        """Each critic's history encodings [B, T + 1, H] of the trained steps, unrolled from
        a zero state through the burn-in (which passes no gradient)."""
        histories = []
        for critic in critics:
            state = critic.get_initial_state(tf.shape(experience.step_type)[0])
            if self._burn_in:
                _, state = critic.history(experience.observation[:, :self._burn_in],
                                          experience.step_type[:, :self._burn_in], state)
                state = tf.nest.map_structure(tf.stop_gradient, state)
            histories.append(critic.history(trained.observation, trained.step_type, state,
                                            training=training)[0])
        return histories

    def _train(self, experience, weights):
        trained, mask, actor_state = self._prepare(experience)
        count = tf.maximum(tf.reduce_sum(mask, axis=1), 1.0)
        weights = tf.ones_like(count) if weights is None else tf.cast(weights, tf.float32)
        length = self._trace_length

        def weighted_mean(per_step):
            return tf.reduce_mean(tf.reduce_sum(per_step * mask, axis=1) / count * weights)

        # Critics: Q_i(h_t, a_t) towards r_t + gamma d_t (min_j Q'_j(h'_{t+1}, a') - alpha log pi).
        next_actions, next_log_pi = self._actions_and_log_probs(trained, actor_state)
        next_actions = tf.nest.map_structure(lambda a: a[:, 1:], next_actions)
        target_histories = self._histories(self._target_critics, experience, trained)
        target_q = tf.minimum(
            self._target_critics[0].q(target_histories[0][:, 1:], next_actions),
            self._target_critics[1].q(target_histories[1][:, 1:], next_actions))
        soft_value = target_q - self.alpha * next_log_pi[:, 1:]
        target = tf.stop_gradient(self._reward_scale * trained.reward[:, :length]
                                  + self._gamma * trained.discount[:, :length] * soft_value)
        critic_variables = [v for critic in self._critics for v in critic.trainable_variables]
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(critic_variables)
            histories = self._histories(self._critics, experience, trained, training=True)
            td_errors = [critic.q(history[:, :length], trained.action[:, :length],
                                  training=True) - target
                         for critic, history in zip(self._critics, histories)]
            critic_loss = weighted_mean(tf.square(td_errors[0]) + tf.square(td_errors[1]))
        tf.debugging.check_numerics(critic_loss, 'Critic loss is inf or nan.')
        self._apply(tape.gradient(critic_loss, critic_variables), critic_variables,
                    self._critic_optimizer)

        # Actor: alpha log pi(a|h) - min_i Q_i(h_t, a), a freshly sampled.
        actor_variables = self._actor_network.trainable_variables
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(actor_variables)
            inputs = tf.nest.map_structure(lambda x: x[:, :length], trained)
            actions, log_pi = self._actions_and_log_probs(inputs, actor_state, training=True)
            q_values = tf.minimum(
                self._critics[0].q(tf.stop_gradient(histories[0][:, :length]), actions),
                self._critics[1].q(tf.stop_gradient(histories[1][:, :length]), actions))
            actor_loss = weighted_mean(tf.stop_gradient(self.alpha) * log_pi - q_values)
        tf.debugging.check_numerics(actor_loss, 'Actor loss is inf or nan.')
        self._apply(tape.gradient(actor_loss, actor_variables), actor_variables,
                    self._actor_optimizer)

        # Temperature: keeps the policy's entropy near the target.
        entropy_gap = tf.stop_gradient(-log_pi - self._target_entropy)
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch([self._log_alpha])
            alpha_loss = weighted_mean(self._log_alpha * entropy_gap)
        self._apply(tape.gradient(alpha_loss, [self._log_alpha]), [self._log_alpha],
                    self._alpha_optimizer)

        self.train_step_counter.assign_add(1)
        self._update_target()
        magnitude = tf.maximum(tf.abs(td_errors[0]), tf.abs(td_errors[1])) * mask
        priorities = (self._eta * tf.reduce_max(magnitude, axis=1)
                      + (1.0 - self._eta) * tf.reduce_sum(magnitude, axis=1) / count)
        return tf_agent.LossInfo(
            critic_loss + actor_loss + alpha_loss,
            RecurrentSacLossInfo(critic_loss, actor_loss, alpha_loss,
                                 tf.stop_gradient(priorities)))

    def _apply(self, gradients, variables, optimizer):
        if self._gradient_clipping:
            gradients, _ = tf.clip_by_global_norm(gradients, self._gradient_clipping)
        optimizer.apply_gradients(zip(gradients, variables))


def make_recurrent_sac(time_step_spec, action_spec, train_step, *, actor_fc_layer_params,
                       critic_joint_fc_layer_params, lstm_size, **settings):
    """A `RecurrentSacAgent`: what `sac.make_agent` builds when it is given an `lstm_size`
    (its bindings are checked there). The dense layers before each LSTM are the first of
    `actor_fc_layer_params` (actor) and of `critic_joint_fc_layer_params` (critics); the
    rest follow the LSTM."""
    recurrent.check_sequence_settings(
        'sac.make_agent', burn_in_steps=settings['burn_in_steps'],
        trace_length=settings['trace_length'], sequence_period=settings['sequence_period'],
        initial_state=settings['initial_state'])
    actor = actor_distribution_rnn_network.ActorDistributionRnnNetwork(
        time_step_spec.observation, action_spec,
        input_fc_layer_params=tuple(actor_fc_layer_params[:1]), lstm_size=tuple(lstm_size),
        output_fc_layer_params=tuple(actor_fc_layer_params[1:]),
        continuous_projection_net=tanh_normal_projection_network.TanhNormalProjectionNetwork)
    critic = RecurrentCriticNetwork(
        (time_step_spec.observation, action_spec),
        observation_fc_layer_params=tuple(critic_joint_fc_layer_params[:1]),
        lstm_size=tuple(lstm_size),
        joint_fc_layer_params=tuple(critic_joint_fc_layer_params[1:]))
    agent = RecurrentSacAgent(time_step_spec, action_spec, actor_network=actor,
                              critic_network=critic, train_step=train_step, **settings)
    agent.initialize()
    return agent
