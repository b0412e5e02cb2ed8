"""Soft Actor-Critic with automatic entropy tuning, built from TF-Agents' SacAgent.

Only `make_agent` is Gin-configurable; it takes the specs and the step counter
from the experiment wiring and never builds envs, buffers or writers.

Windows that start on a LAST->FIRST boundary step of a batched auto-resetting
env are no transitions; SacAgent does not mask them itself, so the fused loop
passes them with weight 0 (`experiment/loop.py`), which removes them from the
critic, actor and alpha losses alike (each aggregates with `sample_weight`).
"""

import collections
import math

import gin
import numpy as np
import tensorflow as tf
from tf_agents.agents import tf_agent
from tf_agents.agents.ddpg import critic_network
from tf_agents.agents.sac import sac_agent, tanh_normal_projection_network
from tf_agents.networks import actor_distribution_network
from tf_agents.policies import greedy_policy
from tf_agents.trajectories import time_step as ts
from tf_agents.utils import common, object_identity

from agents import recurrent, recurrent_sac
from agents.exploration import ColoredNoisePolicy
from agents.networks import make_optimizer
from agents.surface import AgentSurface
from core.checks import check
from core.errors import UserError

# SAC's loss info, plus each window's priority from the critics' TD errors.
SacLossInfo = collections.namedtuple(
    'SacLossInfo', sac_agent.SacLossInfo._fields + ('td_error',))


class TdErrorRecorder:
    """A `td_errors_loss_fn` that keeps each call's TD error `target - prediction`.

    SAC's (and CQL-SAC's) critic losses call it once per critic on the same targets,
    so after one critic loss `priorities()` combines both critics' errors from the
    very pass that trained them: no extra forward pass for prioritized replay.
    """

    def __init__(self, loss_fn):
        self._loss_fn = loss_fn
        self.td_errors = []

    def __call__(self, targets, predictions):
        self.td_errors.append(targets - predictions)
        return self._loss_fn(targets, predictions)

    def priorities(self):
        """max(|delta_1|, |delta_2|): the larger of the two critics' absolute TD errors.

        Why the max: both critics are trained on every sampled window, so a window is
        worth replaying while either critic is still wrong about it; the min (the
        target's choice) would hide the critic that is furthest off, and the mean
        halves a window only one critic mispredicts. This is the choice of Fujimoto,
        Meger and Precup (2020), "An Equivalence between Loss Functions and
        Non-Uniform Sampling in Experience Replay", for TD3's twin critics.
        """
        if len(self.td_errors) != 2:
            raise ValueError(f"expected one TD error per critic, got {len(self.td_errors)}")
        return tf.stop_gradient(tf.maximum(tf.abs(self.td_errors[0]),
                                           tf.abs(self.td_errors[1])))


class SacSurface(AgentSurface):
    """The experiment's agent surface, shared by SAC and CQL-SAC."""

    gives_priorities = True

    def summary_scalars(self):
        return {'train/alpha': self.alpha}

    def batch_diagnostics(self, experience):
        return batch_diagnostics(self, experience)

    def sample_priorities(self, loss_info):
        return loss_info.extra.td_error


class SacAgent(SacSurface, sac_agent.SacAgent):
    """TF-Agents' SacAgent whose `policy` is greedy: tanh of the Gaussian's mean.

    TF-Agents' SacAgent uses the same stochastic policy for `policy` and
    `collect_policy`. Evaluation and the exported policy should act
    deterministically (TF-Agents' SAC examples evaluate a `GreedyPolicy` too),
    while collection keeps sampling for exploration.
    """

    def __init__(self, *args, exploration_noise_beta=0.0, exploration_noise_horizon=1000,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self._greedy_policy = greedy_policy.GreedyPolicy(self._policy)
        noisy = None
        if exploration_noise_beta > 0:
            noisy = ColoredNoisePolicy(self._collect_policy, beta=exploration_noise_beta,
                                       horizon=exploration_noise_horizon)
        # Not tracked: its noise state is no part of the agent's checkpoint.
        object.__setattr__(self, '_colored_collect_policy', noisy)

    @property
    def policy(self):
        return self._greedy_policy

    @property
    def collect_policy(self):
        """SAC's sampling policy, with colored noise if `exploration_noise_beta` > 0."""
        return self._colored_collect_policy or self._collect_policy

    @property
    def alpha(self):
        """The current entropy temperature, exp(log_alpha)."""
        return tf.exp(self._log_alpha)

    def _train(self, experience, weights):
        """One SAC step: critics, then actor and temperature from one shared actor sample.

        TF-Agents' SacAgent samples the actor once more for the temperature's loss, after the
        actor update. SAC's reference implementation (and most others) reuse the actor loss's
        log-probabilities instead; with 256x256 networks that saves an actor pass, ~5% of a
        gradient step on one core. Everything else (losses, order, target update) is unchanged.
        """
        time_steps, policy_steps, next_time_steps = self._as_transition(experience)
        critic_loss, td_error = self._critic_step(time_steps, policy_steps.action,
                                                  next_time_steps, weights)
        actor_loss, log_pi = self._actor_step(time_steps, weights)
        alpha_loss = self._alpha_step(log_pi, weights)
        self.train_step_counter.assign_add(1)
        self._update_target()
        return tf_agent.LossInfo(
            loss=critic_loss + actor_loss + alpha_loss,
            extra=SacLossInfo(critic_loss=critic_loss, actor_loss=actor_loss,
                              alpha_loss=alpha_loss, td_error=td_error))

    def _critic_step(self, time_steps, actions, next_time_steps, weights):
        """One critic update; returns its loss and each window's priority (before it)."""
        variables = list(object_identity.ObjectIdentitySet(
            self._critic_network_1.trainable_variables
            + self._critic_network_2.trainable_variables))
        recorder = TdErrorRecorder(self._td_errors_loss_fn)
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(variables)
            loss = self._critic_loss_weight * self.critic_loss(
                time_steps, actions, next_time_steps, td_errors_loss_fn=recorder,
                gamma=self._gamma, reward_scale_factor=self._reward_scale_factor,
                weights=weights, training=True)
        tf.debugging.check_numerics(loss, 'Critic loss is inf or nan.')
        self._apply_gradients(tape.gradient(loss, variables), variables, self._critic_optimizer)
        return loss, recorder.priorities()

    def _actor_step(self, time_steps, weights):
        """Maximises min(Q1, Q2) - alpha * log pi; returns the loss and the sample's log pi."""
        variables = self._actor_network.trainable_variables
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(variables)
            actions, log_pi = self._actions_and_log_probs(time_steps, training=True)
            critic_input = (time_steps.observation, actions)
            q_1, _ = self._critic_network_1(critic_input, step_type=time_steps.step_type,
                                            training=False)
            q_2, _ = self._critic_network_2(critic_input, step_type=time_steps.step_type,
                                            training=False)
            per_example = tf.exp(self._log_alpha) * log_pi - tf.minimum(q_1, q_2)
            loss = self._actor_loss_weight * common.aggregate_losses(
                per_example_loss=per_example, sample_weight=weights,
                regularization_loss=self._actor_network.losses).total_loss
        tf.debugging.check_numerics(loss, 'Actor loss is inf or nan.')
        self._apply_gradients(tape.gradient(loss, variables), variables, self._actor_optimizer)
        return loss, log_pi

    def _alpha_step(self, log_pi, weights):
        """Moves log(alpha) so that the policy's entropy tracks `target_entropy`."""
        entropy_gap = tf.stop_gradient(-log_pi - self._target_entropy)
        variables = [self._log_alpha]
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(variables)
            # log(alpha), not alpha, in the loss: SacAgent's default, a steadier gradient.
            loss = self._alpha_loss_weight * common.aggregate_losses(
                per_example_loss=self._log_alpha * entropy_gap, sample_weight=weights).total_loss
        self._apply_gradients(tape.gradient(loss, variables), variables, self._alpha_optimizer)
        return loss


@gin.configurable(module='sac')
def make_agent(time_step_spec, action_spec, train_step, *,
               actor_fc_layer_params=(256, 256),
               critic_joint_fc_layer_params=(256, 256),
               actor_learning_rate=3e-4,
               critic_learning_rate=3e-4,
               alpha_learning_rate=3e-4,
               target_entropy=None,
               initial_log_alpha=0.0,
               target_update_tau=0.005,
               target_update_period=1,
               gamma=0.99,
               reward_scale_factor=1.0,
               gradient_clipping=None,
               exploration_noise_beta=0.0,
               exploration_noise_horizon=1000,
               lstm_size=None,
               burn_in_steps=recurrent.SEQUENCE_DEFAULTS['burn_in_steps'],
               trace_length=recurrent.SEQUENCE_DEFAULTS['trace_length'],
               sequence_period=recurrent.SEQUENCE_DEFAULTS['sequence_period'],
               initial_state=recurrent.SEQUENCE_DEFAULTS['initial_state'],
               priority_eta=recurrent.SEQUENCE_DEFAULTS['priority_eta']):
    """Builds a SAC agent for a continuous (Box) action spec.

    Args:
      time_step_spec: the environment's `TimeStep` spec.
      action_spec: a floating-point `BoundedTensorSpec`.
      train_step: int64 variable counting gradient steps.
      actor_fc_layer_params: hidden layer sizes of the actor.
      critic_joint_fc_layer_params: hidden layer sizes of each of the two
        critics, applied to the concatenated observation and action.
      actor_learning_rate: Adam learning rate of the actor.
      critic_learning_rate: Adam learning rate of the critics.
      alpha_learning_rate: Adam learning rate of log(alpha).
      target_entropy: entropy the temperature is tuned towards; None gives
        -dim(action), the SAC paper's choice (TF-Agents' own default is half that).
      initial_log_alpha: log of the initial temperature (0.0 is alpha = 1).
      target_update_tau: Polyak factor of the target critics' soft updates.
      target_update_period: gradient steps between target updates.
      gamma: discount factor; truncated episodes still bootstrap (discount 1).
      reward_scale_factor: multiplies rewards in the critic target.
      gradient_clipping: global-norm clip, or None.
      exploration_noise_beta: the collect policy's noise color (agents/exploration.py):
        0 is SAC's white noise, 1 pink (temporally correlated; what MountainCarContinuous
        needs), 2 red. Evaluation and the exported policy are greedy either way.
      exploration_noise_horizon: steps per colored-noise sequence (the episode length).
      lstm_size: LSTM cell sizes, e.g. (64,): a recurrent actor and recurrent critics
        trained on stored sequences (agents/recurrent_sac.py), for partially observed tasks.
        The first entry of `actor_fc_layer_params` and of `critic_joint_fc_layer_params`
        then comes before the LSTM, the rest after it. The arguments below apply only then;
        it needs run.replay_backend = @SequenceReplay or @PrioritizedSequenceReplay.
      burn_in_steps, trace_length, sequence_period, initial_state, priority_eta: the
        sequence settings, as for dqn.make_agent's recurrent Q-network.

    Returns:
      A `SacAgent` (a TF-Agents `TFAgent` with the experiment's `AgentSurface`).
    """
    validate(action_spec, 'sac.make_agent', locals())
    check('sac.make_agent', locals(), positive=('exploration_noise_horizon',),
          numbers={'exploration_noise_beta': (0.0, 4.0, 'closed')})
    if target_entropy is None:
        target_entropy = -float(sum(np.prod(spec.shape.as_list())
                                    for spec in tf.nest.flatten(action_spec)))
    sequence_settings = dict(burn_in_steps=burn_in_steps, trace_length=trace_length,
                             sequence_period=sequence_period, initial_state=initial_state,
                             priority_eta=priority_eta)
    if lstm_size is not None:
        return _recurrent(time_step_spec, action_spec, train_step, locals(), sequence_settings,
                          target_entropy)
    recurrent.refuse_unless_recurrent('sac.make_agent', sequence_settings,
                                      recurrent.SEQUENCE_DEFAULTS)
    actor_net, critic_net = make_networks(
        time_step_spec.observation, action_spec, actor_fc_layer_params,
        critic_joint_fc_layer_params)
    agent = SacAgent(
        time_step_spec,
        action_spec,
        actor_network=actor_net,
        critic_network=critic_net,
        actor_optimizer=make_optimizer('adam', actor_learning_rate),
        critic_optimizer=make_optimizer('adam', critic_learning_rate),
        alpha_optimizer=make_optimizer('adam', alpha_learning_rate),
        target_update_tau=target_update_tau,
        target_update_period=target_update_period,
        td_errors_loss_fn=tf.math.squared_difference,
        gamma=gamma,
        reward_scale_factor=reward_scale_factor,
        initial_log_alpha=initial_log_alpha,
        target_entropy=target_entropy,
        gradient_clipping=gradient_clipping,
        train_step_counter=train_step,
        exploration_noise_beta=exploration_noise_beta,
        exploration_noise_horizon=exploration_noise_horizon)
    agent.initialize()
    return agent


def _recurrent(time_step_spec, action_spec, train_step, values, sequence_settings,
               target_entropy):
    """The recurrent SAC agent `make_agent` builds for an `lstm_size`."""
    lstm_size = values['lstm_size']
    if (not isinstance(lstm_size, (list, tuple)) or not lstm_size
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                       for v in lstm_size)):
        raise UserError(f"sac.make_agent.lstm_size must list LSTM sizes (positive whole "
                        f"numbers), e.g. (64,); got {lstm_size!r}.")
    if values['exploration_noise_beta']:
        raise UserError("sac.make_agent.exploration_noise_beta cannot be used with the "
                        "recurrent actor (lstm_size): remove the binding.")
    return recurrent_sac.make_recurrent_sac(
        time_step_spec, action_spec, train_step,
        actor_fc_layer_params=values['actor_fc_layer_params'],
        critic_joint_fc_layer_params=values['critic_joint_fc_layer_params'],
        lstm_size=lstm_size,
        actor_optimizer=make_optimizer('adam', values['actor_learning_rate']),
        critic_optimizer=make_optimizer('adam', values['critic_learning_rate']),
        alpha_optimizer=make_optimizer('adam', values['alpha_learning_rate']),
        target_entropy=target_entropy, initial_log_alpha=values['initial_log_alpha'],
        target_update_tau=values['target_update_tau'],
        target_update_period=values['target_update_period'], gamma=values['gamma'],
        reward_scale_factor=values['reward_scale_factor'],
        gradient_clipping=values['gradient_clipping'], **sequence_settings)


def validate(action_spec, scope, values):
    """Rejects settings SacAgent would accept but silently mistrain on (SAC and CQL-SAC)."""
    if not all(spec.dtype.is_floating for spec in tf.nest.flatten(action_spec)):
        raise UserError("SAC needs a continuous (Box) action space; use DQN "
                        "(configs/base/dqn.gin) for discrete actions.")
    rate = (0.0, math.inf, 'open_low')
    check(scope, values, layers=('actor_fc_layer_params', 'critic_joint_fc_layer_params'),
          positive=('target_update_period',),
          numbers={'actor_learning_rate': rate, 'critic_learning_rate': rate,
                   'alpha_learning_rate': rate, 'gamma': (0.0, 1.0, 'open_low'),
                   'target_update_tau': (0.0, 1.0, 'open_low'),
                   'initial_log_alpha': (-math.inf, math.inf, 'closed'),
                   'reward_scale_factor': (-math.inf, math.inf, 'closed')},
          optional_numbers={'gradient_clipping': rate,
                            'target_entropy': (-math.inf, math.inf, 'closed')})


def make_networks(observation_spec, action_spec, actor_layers, critic_layers):
    """The actor (tanh-squashed Gaussian) and the critic template, as in TF-Agents' examples.

    SacAgent copies the critic template into its second critic and both target
    critics, so one network here yields all four.
    """
    actor_net = actor_distribution_network.ActorDistributionNetwork(
        observation_spec,
        action_spec,
        fc_layer_params=tuple(actor_layers),
        continuous_projection_net=tanh_normal_projection_network.TanhNormalProjectionNetwork)
    critic_net = critic_network.CriticNetwork(
        (observation_spec, action_spec),
        joint_fc_layer_params=tuple(critic_layers),
        kernel_initializer='glorot_uniform',
        last_kernel_initializer='glorot_uniform')
    return actor_net, critic_net


def batch_diagnostics(agent, experience):
    """Mean Q(s, a) of the first critic and the policy's entropy estimate on a sampled batch.

    Q on the replayed (s, a) gauges over- or under-estimation; the entropy
    estimate (-log pi of a fresh sample) shows what the temperature is tuning
    towards `target_entropy`. Only the windows' first frames are used: they are
    the transitions' starting states.
    """
    first = tf.nest.map_structure(lambda x: x[:, 0], experience)
    time_steps = ts.TimeStep(step_type=first.step_type, reward=first.reward,
                             discount=first.discount, observation=first.observation)
    q_values, _ = agent._critic_network_1(  # pylint: disable=protected-access
        (first.observation, first.action), step_type=first.step_type, training=False)
    _, log_pi = agent._actions_and_log_probs(  # pylint: disable=protected-access
        time_steps, training=False)
    return {'mean_q': tf.reduce_mean(q_values), 'entropy': -tf.reduce_mean(log_pi)}
