"""DQN and Double DQN, built from TF-Agents' agents.

Only `make_agent` is Gin-configurable; it takes the specs and the step counter
from the experiment wiring and never builds envs, buffers or writers.
"""

import math

import gin
import tensorflow as tf
from tf_agents.agents.dqn import dqn_agent
from tf_agents.networks import q_network
from tf_agents.trajectories import trajectory as trajectory_lib
from tf_agents.utils import common

from agents import epsilon_greedy, r2d2, recurrent
from agents.exploration import TemporallyExtendedEpsilonGreedyPolicy
from agents.networks import DuelingQNetwork, make_optimizer
from agents.nstep import stop_windows_at_episode_end
from agents.surface import AgentSurface
from core.checks import check
from core.errors import UserError
from core.schedules import linear_schedule

# Defaults of the recurrent (R2D2) settings, which apply only with `lstm_size`.
_SEQUENCE_DEFAULTS = dict(recurrent.SEQUENCE_DEFAULTS, value_rescaling=False,
                          output_fc_layer_params=())

_LOSSES = {
    'huber': common.element_wise_huber_loss,
    'mse': common.element_wise_squared_loss,
}


class _EpisodeAwareNStepMixin(AgentSurface):
    """Makes n-step targets stop at episode ends (see agents/nstep.py); collects with
    this project's epsilon-greedy (agents/epsilon_greedy.py) or epsilon-z-greedy
    (agents/exploration.py) in place of TF-Agents' epsilon-greedy; implements the
    experiment's `AgentSurface`."""

    _own_collect_policy = None
    gives_priorities = True

    def summary_scalars(self):
        return {'train/epsilon': self._epsilon_greedy()}

    def batch_diagnostics(self, experience):
        return {'mean_q': _mean_max_q(self._q_network, experience)}

    def sample_priorities(self, loss_info):
        """|TD error| of each window's n-step target (Schaul et al., 2016)."""
        return tf.abs(loss_info.extra.td_error)

    @property
    def collect_policy(self):
        return self._own_collect_policy or super().collect_policy

    def _loss(self, experience, *args, **kwargs):
        if isinstance(experience, trajectory_lib.Trajectory):
            experience = stop_windows_at_episode_end(experience, self._gamma)
        return super()._loss(experience, *args, **kwargs)


class DqnAgent(_EpisodeAwareNStepMixin, dqn_agent.DqnAgent):
    """TF-Agents' DqnAgent with truncation-safe n-step targets and one target pass."""

    def _compute_next_q_values(self, next_time_steps, info):
        """max_a Q_target(s', a), from one pass of the target network.

        Why: TF-Agents' DqnAgent runs the target network twice on s' (once for its
        Q-values, once inside its target greedy policy for their argmax) and gathers the
        one at the other's argmax, which is their max. On the Nature CNN the second
        pass was ~18% of a gradient step (docs/atari.md, "The gradient step"). With an
        action mask the greedy action must respect the mask: that keeps TF-Agents' path.
        """
        scalar_actions = tf.nest.flatten(self._action_spec)[0].shape.rank == 0
        if self._observation_and_action_constraint_splitter is not None or not scalar_actions:
            return super()._compute_next_q_values(next_time_steps, info)
        next_target_q_values, _ = self._target_q_network(
            next_time_steps.observation, step_type=next_time_steps.step_type)
        return tf.reduce_max(next_target_q_values, axis=-1)


class DdqnAgent(_EpisodeAwareNStepMixin, dqn_agent.DdqnAgent):
    """TF-Agents' DdqnAgent with truncation-safe n-step targets."""


def _conv_layers(conv_layer_params):
    """((filters, kernel, stride), ...) as TF-Agents takes it, or None; one-line errors."""
    if not conv_layer_params:
        return None
    layers = []
    for layer in conv_layer_params:
        if (not isinstance(layer, (list, tuple)) or len(layer) != 3
                or not all(isinstance(v, int) and v > 0 for v in layer)):
            raise UserError(f"dqn.make_agent.conv_layer_params holds {layer!r}: each layer is "
                            "(filters, kernel, stride) of positive integers, e.g. (32, 8, 4).")
        layers.append(tuple(layer))
    return tuple(layers)


def _bytes_to_unit(observation_spec):
    """uint8 frames -> float32 in [0, 1] as the network's first layer (None otherwise)."""
    if tf.nest.is_nested(observation_spec) or observation_spec.dtype != tf.uint8:
        return None
    return tf.keras.layers.Rescaling(1.0 / 255.0)


@gin.configurable(module='dqn')
def make_agent(time_step_spec, action_spec, train_step, *,
               fc_layer_params=(100,),
               conv_layer_params=None,
               dueling=False,
               optimizer='adam',
               adam_epsilon=None,
               learning_rate=1e-3,
               epsilon_start=1.0,
               epsilon_end=0.05,
               epsilon_decay_steps=10_000,
               target_update_period=1,
               target_update_tau=1.0,
               double_dqn=True,
               n_step_update=1,
               gamma=0.99,
               td_loss='huber',
               gradient_clipping=None,
               reward_scale_factor=1.0,
               exploration_repeat_mu=None,
               exploration_max_repeat=100,
               lstm_size=None,
               output_fc_layer_params=_SEQUENCE_DEFAULTS['output_fc_layer_params'],
               burn_in_steps=_SEQUENCE_DEFAULTS['burn_in_steps'],
               trace_length=_SEQUENCE_DEFAULTS['trace_length'],
               sequence_period=_SEQUENCE_DEFAULTS['sequence_period'],
               initial_state=_SEQUENCE_DEFAULTS['initial_state'],
               value_rescaling=_SEQUENCE_DEFAULTS['value_rescaling'],
               priority_eta=_SEQUENCE_DEFAULTS['priority_eta']):
    """Builds a (Double) DQN agent for a discrete, scalar action spec.

    Args:
      time_step_spec: the environment's `TimeStep` spec.
      action_spec: a scalar integer `BoundedTensorSpec`.
      train_step: int64 variable counting gradient steps.
      fc_layer_params: hidden layer sizes of the Q-network.
      conv_layer_params: convolutions before the dense layers, as
        (filters, kernel, stride) triples; the Nature CNN is
        ((32, 8, 4), (64, 4, 2), (64, 3, 1)) with fc_layer_params=(512,). uint8
        observations (frames) are scaled to [0, 1] inside the network, so replay
        and the exported policy keep bytes.
      dueling: split the output into a state value and per-action advantages
        (agents/networks.py, DuelingQNetwork), as Dopamine's DrQ(epsilon) does.
      optimizer: 'adam', 'rmsprop' or 'sgd'.
      adam_epsilon: the optimizer's epsilon (None: Keras' default, 1e-7); Dopamine's
        JAX DQN uses 1.5e-4 with Adam.
      learning_rate: optimizer learning rate.
      epsilon_start: collect-policy epsilon at train step 0.
      epsilon_end: epsilon after `epsilon_decay_steps` gradient steps.
      epsilon_decay_steps: gradient steps over which epsilon decays linearly
        (TF-Agents counts schedules in train steps).
      target_update_period: gradient steps between target-network updates.
      target_update_tau: 1.0 copies the network; < 1 is a soft (Polyak) update.
      double_dqn: use Double DQN's target (online argmax, target value).
      n_step_update: steps per bootstrapped target; targets stop at episode ends.
      gamma: discount factor.
      td_loss: 'huber' or 'mse'.
      gradient_clipping: global-norm clip, or None.
      reward_scale_factor: multiplies rewards in the target.
      exploration_repeat_mu: None is epsilon-greedy; a number makes collection
        epsilon-z-greedy (agents/exploration.py): each exploratory action is repeated
        for n ~ zeta(mu) steps (mu = 2 is the paper's default), which reaches rewards
        that need a long consistent push, e.g. MountainCar's flag.
      exploration_max_repeat: the longest repeat, in env steps per copy.
      lstm_size: LSTM cell sizes, e.g. (64,): a recurrent Q-network trained on stored
        sequences (R2D2, agents/r2d2.py), for partially observed tasks. `fc_layer_params`
        are then the dense layers before the LSTM. The arguments below apply only then;
        it needs run.replay_backend = @SequenceReplay or @PrioritizedSequenceReplay.
      output_fc_layer_params: dense layers after the LSTM, before the Q head.
      burn_in_steps: steps at each sequence's start that only warm the state up.
      trace_length: steps of each sequence that are trained on.
      sequence_period: steps between stored sequence starts within an episode (at most
        trace_length; R2D2 uses half of it).
      initial_state: the state a sequence is unrolled from: 'stored' (what the collect
        policy had at its first step) or 'zero' (agents/recurrent.py).
      value_rescaling: R2D2's invertible h(x) on targets (for large, unclipped returns).
      priority_eta: a sequence's priority is eta * max + (1 - eta) * mean of its |TD|.

    Returns:
      A `tf_agents.agents.TFAgent`.
    """
    if td_loss not in _LOSSES:
        raise UserError(f"Unknown dqn.make_agent.td_loss {td_loss!r}: choose 'huber' or 'mse'.")
    check('dqn.make_agent', locals(), layers=('fc_layer_params',),
          positive=('epsilon_decay_steps', 'target_update_period', 'n_step_update',
                    'exploration_max_repeat'),
          numbers={'learning_rate': (0.0, math.inf, 'open_low'),
                   'epsilon_start': (0.0, 1.0, 'closed'), 'epsilon_end': (0.0, 1.0, 'closed'),
                   'target_update_tau': (0.0, 1.0, 'open_low'), 'gamma': (0.0, 1.0, 'open_low'),
                   'reward_scale_factor': (-math.inf, math.inf, 'closed'),
                   'priority_eta': (0.0, 1.0, 'closed')},
          optional_numbers={'gradient_clipping': (0.0, math.inf, 'open_low'),
                            'exploration_repeat_mu': (0.0, math.inf, 'open_low')},
          flags=('double_dqn', 'dueling', 'value_rescaling'))
    if tf.nest.flatten(action_spec)[0].dtype.is_floating:
        raise UserError("DQN needs a discrete action space; use SAC for continuous actions.")
    epsilon = linear_schedule(train_step, epsilon_start, epsilon_end, epsilon_decay_steps)
    sequence_settings = dict(burn_in_steps=burn_in_steps, trace_length=trace_length,
                             sequence_period=sequence_period, initial_state=initial_state,
                             value_rescaling=value_rescaling, priority_eta=priority_eta)
    if lstm_size is None:
        recurrent.refuse_unless_recurrent(
            'dqn.make_agent', dict(sequence_settings,
                                   output_fc_layer_params=tuple(output_fc_layer_params)),
            _SEQUENCE_DEFAULTS)
    else:
        _refuse_for_recurrent(lstm_size=lstm_size, conv_layer_params=conv_layer_params,
                              dueling=dueling, exploration_repeat_mu=exploration_repeat_mu)
        return r2d2.make_r2d2(
            time_step_spec, action_spec, train_step, fc_layer_params=fc_layer_params,
            lstm_size=lstm_size, output_fc_layer_params=output_fc_layer_params,
            optimizer=make_optimizer(optimizer, learning_rate, epsilon=adam_epsilon),
            epsilon=epsilon, n_step_update=n_step_update, gamma=gamma, double_dqn=double_dqn,
            td_loss=_LOSSES[td_loss], gradient_clipping=gradient_clipping,
            reward_scale_factor=reward_scale_factor, target_update_period=target_update_period,
            target_update_tau=target_update_tau, **sequence_settings)
    network_cls = DuelingQNetwork if dueling else q_network.QNetwork
    network = network_cls(
        time_step_spec.observation, action_spec, fc_layer_params=tuple(fc_layer_params),
        conv_layer_params=_conv_layers(conv_layer_params),
        preprocessing_layers=_bytes_to_unit(time_step_spec.observation))
    agent_cls = DdqnAgent if double_dqn else DqnAgent
    agent = agent_cls(
        time_step_spec,
        action_spec,
        q_network=network,
        optimizer=make_optimizer(optimizer, learning_rate, epsilon=adam_epsilon),
        epsilon_greedy=epsilon,
        n_step_update=n_step_update,
        target_update_period=target_update_period,
        target_update_tau=target_update_tau,
        td_errors_loss_fn=_LOSSES[td_loss],
        gamma=gamma,
        reward_scale_factor=reward_scale_factor,
        gradient_clipping=gradient_clipping,
        train_step_counter=train_step)
    # Not tracked: a collect policy's state is no part of the agent's checkpoint or variables.
    if exploration_repeat_mu is not None:
        object.__setattr__(agent, '_own_collect_policy',
                           TemporallyExtendedEpsilonGreedyPolicy(
                               agent.policy, epsilon, mu=exploration_repeat_mu,
                               max_repeat=exploration_max_repeat))
    elif epsilon_greedy.supports(agent.policy):
        # The same actions' distribution, without a forward pass when every copy explores.
        object.__setattr__(agent, '_own_collect_policy',
                           epsilon_greedy.EpsilonGreedyPolicy(agent.policy, epsilon))
    agent.initialize()
    return agent


def _refuse_for_recurrent(*, lstm_size, conv_layer_params, dueling, exploration_repeat_mu):
    """What the recurrent Q-network does not support, refused in one line."""
    if (not isinstance(lstm_size, (list, tuple)) or not lstm_size
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                       for v in lstm_size)):
        raise UserError(f"dqn.make_agent.lstm_size must list LSTM sizes (positive whole "
                        f"numbers), e.g. (64,); got {lstm_size!r}.")
    unsupported = [name for name, value in (('conv_layer_params', conv_layer_params),
                                            ('dueling', dueling),
                                            ('exploration_repeat_mu', exploration_repeat_mu))
                   if value]
    if unsupported:
        raise UserError(f"dqn.make_agent.{', '.join(unsupported)} cannot be used with the "
                        "recurrent Q-network (lstm_size): remove the binding.")


def _mean_max_q(network, experience):
    """Mean over a sampled batch of max_a Q(s, a), a cheap over-estimation gauge."""
    first_frame = tf.nest.map_structure(lambda x: x[:, 0], experience.observation)
    q_values, _ = network(first_frame, step_type=experience.step_type[:, 0])
    return tf.reduce_mean(tf.reduce_max(q_values, axis=-1))
