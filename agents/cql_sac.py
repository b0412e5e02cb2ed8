"""Conservative Q-Learning on top of SAC (CQL-SAC), built from TF-Agents' CqlSacAgent.

CQL adds to SAC's critic loss a term that pushes Q down on actions the policy
proposes and up on the dataset's actions, so that a policy trained purely
from logged data does not exploit over-estimated, never-tried actions. The
networks, temperature tuning, evaluation policy and diagnostics are SAC's
(`agents/sac.py`); only the conservative critic and its knobs are added here.

The fused loop zeroes the weight of windows that start on a LAST->FIRST
boundary step; SAC's critic, actor and alpha losses honour those weights.
TF-Agents' CQL regulariser itself is unweighted (a batch mean), so boundary
windows (one per episode, 0.5% of Pendulum's rows) still enter that term.
"""

import collections
import math

import gin
import numpy as np
import tensorflow as tf
from tf_agents.agents import tf_agent
from tf_agents.agents.cql import cql_sac_agent
from tf_agents.policies import greedy_policy

from agents import sac
from agents.networks import make_optimizer
from core.checks import check

# CQL-SAC's loss info, plus each window's priority from the critics' TD errors.
CqlSacLossInfo = collections.namedtuple(
    'CqlSacLossInfo', cql_sac_agent.CqlSacLossInfo._fields + ('td_error',))


class CqlSacAgent(sac.SacSurface, cql_sac_agent.CqlSacAgent):
    """TF-Agents' CqlSacAgent whose `policy` is greedy (see `agents.sac.SacAgent`), with
    per-window priorities: the SAC part of its critic loss's TD errors (the conservative
    term is a batch-level regulariser, not a per-window error)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._greedy_policy = greedy_policy.GreedyPolicy(self._policy)

    @property
    def policy(self):
        return self._greedy_policy

    @property
    def alpha(self):
        return tf.exp(self._log_alpha)

    @property
    def cql_alpha(self):
        """The weight of the conservative term now (learned when Lagrange is on)."""
        return tf.cast(self._get_cql_alpha(), tf.float32)

    def summary_scalars(self):
        return {'train/alpha': self.alpha, 'train/cql_alpha': self.cql_alpha}

    def _train(self, experience, weights):
        """TF-Agents' CQL-SAC step, its critic loss recording the TD errors it computes."""
        loss_fn = self._td_errors_loss_fn
        recorder = sac.TdErrorRecorder(loss_fn)
        object.__setattr__(self, '_td_errors_loss_fn', recorder)
        try:
            loss_info = super()._train(experience, weights)
        finally:
            object.__setattr__(self, '_td_errors_loss_fn', loss_fn)
        extra = CqlSacLossInfo(**loss_info.extra._asdict(), td_error=recorder.priorities())
        return tf_agent.LossInfo(loss=loss_info.loss, extra=extra)


@gin.configurable(module='cql_sac')
def make_agent(time_step_spec, action_spec, train_step, *,
               actor_fc_layer_params=(256, 256),
               critic_joint_fc_layer_params=(256, 256),
               actor_learning_rate=3e-5,
               critic_learning_rate=3e-4,
               alpha_learning_rate=3e-4,
               target_entropy=None,
               initial_log_alpha=0.0,
               target_update_tau=0.005,
               target_update_period=1,
               gamma=0.99,
               reward_scale_factor=1.0,
               gradient_clipping=None,
               cql_alpha=5.0,
               use_lagrange_cql_alpha=False,
               cql_alpha_learning_rate=3e-4,
               cql_tau=10.0,
               num_cql_samples=10,
               include_critic_entropy_term=False,
               num_bc_steps=0,
               softmax_temperature=1.0,
               seed=0):
    """Builds a CQL-SAC agent for a continuous (Box) action spec.

    Args:
      time_step_spec: the environment's `TimeStep` spec.
      action_spec: a floating-point `BoundedTensorSpec`.
      train_step: int64 variable counting gradient steps.
      actor_fc_layer_params: hidden layer sizes of the actor.
      critic_joint_fc_layer_params: hidden layer sizes of each critic.
      actor_learning_rate: Adam learning rate of the actor (CQL's paper uses
        a tenth of the critic's: a slow actor over a conservative critic).
      critic_learning_rate: Adam learning rate of the critics.
      alpha_learning_rate: Adam learning rate of the entropy temperature.
      target_entropy: None gives -dim(action).
      initial_log_alpha: log of the initial entropy temperature.
      target_update_tau: Polyak factor of the target critics.
      target_update_period: gradient steps between target updates.
      gamma: discount factor.
      reward_scale_factor: multiplies rewards in the critic target.
      gradient_clipping: global-norm clip, or None.
      cql_alpha: weight of the conservative term (its start value with Lagrange).
      use_lagrange_cql_alpha: tune cql_alpha so the Q gap between policy and
        dataset actions stays near `cql_tau` (CQL-Lagrange).
      cql_alpha_learning_rate: learning rate of the Lagrange multiplier.
      cql_tau: the target action gap of CQL-Lagrange.
      num_cql_samples: policy actions sampled per state for the log-sum-exp.
      include_critic_entropy_term: subtract alpha * log pi in the critic target.
      num_bc_steps: gradient steps of behaviour cloning before the SAC actor
        loss takes over (a warm-up on the dataset's actions).
      softmax_temperature: temperature of the log-sum-exp over sampled Qs.
      seed: seed of the agent's action sampling for the CQL term.

    Returns:
      A `CqlSacAgent` (a TF-Agents `TFAgent` with the experiment's `AgentSurface`).
    """
    values = locals()
    sac.validate(action_spec, 'cql_sac.make_agent', values)
    check('cql_sac.make_agent', values, positive=('num_cql_samples',),
          non_negative=('num_bc_steps',), flags=('use_lagrange_cql_alpha',
                                                  'include_critic_entropy_term'),
          numbers={'cql_alpha': (0.0, math.inf, 'closed'),
                   'cql_alpha_learning_rate': (0.0, math.inf, 'open_low'),
                   'cql_tau': (-math.inf, math.inf, 'closed'),
                   'softmax_temperature': (0.0, math.inf, 'open_low')})
    actor_net, critic_net = sac.make_networks(
        time_step_spec.observation, action_spec, actor_fc_layer_params,
        critic_joint_fc_layer_params)
    if target_entropy is None:
        target_entropy = -float(sum(np.prod(spec.shape.as_list())
                                    for spec in tf.nest.flatten(action_spec)))
    agent = CqlSacAgent(
        time_step_spec,
        action_spec,
        actor_network=actor_net,
        critic_network=critic_net,
        actor_optimizer=make_optimizer('adam', actor_learning_rate),
        critic_optimizer=make_optimizer('adam', critic_learning_rate),
        alpha_optimizer=make_optimizer('adam', alpha_learning_rate),
        cql_alpha=cql_alpha,
        num_cql_samples=num_cql_samples,
        include_critic_entropy_term=include_critic_entropy_term,
        use_lagrange_cql_alpha=use_lagrange_cql_alpha,
        cql_alpha_learning_rate=cql_alpha_learning_rate,
        cql_tau=cql_tau,
        random_seed=seed,
        num_bc_steps=num_bc_steps,
        softmax_temperature=softmax_temperature,
        target_update_tau=target_update_tau,
        target_update_period=target_update_period,
        td_errors_loss_fn=tf.math.squared_difference,
        gamma=gamma,
        reward_scale_factor=reward_scale_factor,
        initial_log_alpha=initial_log_alpha,
        target_entropy=target_entropy,
        gradient_clipping=gradient_clipping,
        train_step_counter=train_step)
    agent.initialize()
    return agent
