"""The preprocessing stage: the transforms in their declared order, and policies that use it.

Order: observation transforms run in the order `run.preprocessing` lists them
(e.g. a feature function, then normalisation of the features, then noise);
reward transforms act on rewards only. Acting: each observation goes through
every non-augmenting transform with the current statistics, inside the
policy (`PreprocessedPolicy`), so evaluation, distributed collectors and the
exported SavedModel all take raw observations. Sampling: each sampled batch's
observations go through all of them (augmentations included) and its rewards
through the reward transforms, with the statistics of that moment; replay
itself only ever holds raw data.

Statistics move only where data is collected (`observe`, an observer of the
collect loop, the initial random collection included, folded in by `end_chunk`
after each chunk, so acting uses the statistics of the chunk's start) or, for
a learner that does not collect, from the batches it samples
(`observe_sampled`). Evaluation never moves them.
"""

import tensorflow as tf
from tf_agents.policies import tf_policy

from core.errors import UserError
from preprocessing.transforms import Transform


class Preprocessor(tf.Module):
    """The built stage: input and output observation specs, statistics, and the transforms."""

    def __init__(self, transforms, observation_spec, num_envs):
        super().__init__(name='preprocessor')
        transforms = list(transforms)
        for transform in transforms:
            if not isinstance(transform, Transform):
                raise UserError(f"run.preprocessing holds {transform!r}, which is no "
                                "preprocessing transform: list evaluated references such as "
                                "@preprocess.ObservationNormalization().")
        if len({id(t) for t in transforms}) != len(transforms):
            raise UserError("run.preprocessing lists one transform twice: list each once.")
        if isinstance(observation_spec, (tuple, list, dict)):
            raise UserError("run.preprocessing needs a single observation tensor; this "
                            "environment's observations are nested.")
        self.transforms = transforms
        self.input_spec = observation_spec
        specs = [observation_spec]
        for transform in transforms:
            specs.append(transform.build(specs[-1], num_envs))
        self._specs = specs
        self.observation_spec = specs[-1]

    def _flat(self, observation, spec):
        """[*outer, *spec.shape] -> ([N, *spec.shape], outer shape, or None if already flat)."""
        outer_rank = observation.shape.rank - spec.shape.rank
        if outer_rank == 1:
            return observation, None  # acting and collection: nothing to reshape
        shape = tf.shape(observation)
        return (tf.reshape(observation, tf.concat([[-1], shape[outer_rank:]], 0)),
                shape[:outer_rank])

    def observation(self, observation, training=False):
        """Raw observations [*outer, ...] -> the agent's; `training` adds augmentation."""
        flat, outer = self._flat(observation, self.input_spec)
        for transform in self.transforms:
            if transform.augments and not training:
                continue
            flat = transform.observation(flat, training)
        if outer is None:
            return flat
        return tf.reshape(flat, tf.concat([outer, tf.shape(flat)[1:]], 0))

    def reward(self, reward):
        for transform in self.transforms:
            reward = transform.reward(reward)
        return reward

    def observe(self, trajectory):
        """A collect-loop observer: every transform updates its statistics from this batch."""
        flat, _ = self._flat(trajectory.observation, self.input_spec)
        for transform in self.transforms:
            if transform.augments:
                continue
            transform.observe(flat, trajectory)
            flat = transform.observation(flat, training=False)

    def end_chunk(self):
        """Called once after every collect chunk: the gathered statistics are folded in."""
        for transform in self.transforms:
            transform.end_chunk()

    def observe_sampled(self, experience, valid):
        """Statistics from sampled windows' first states, for learners that do not collect."""
        first = experience.observation[:, 0]
        for transform in self.transforms:
            if transform.augments:
                continue
            transform.observe_sampled(first, experience, valid)
            first = transform.observation(first, training=False)

    def experience(self, experience):
        """A sampled batch as the agent trains on it (observations and rewards transformed)."""
        return experience._replace(observation=self.observation(experience.observation, True),
                                   reward=self.reward(experience.reward))

    def freeze(self):
        """The end of the warm-up (initial collection): transforms that freeze, freeze."""
        for transform in self.transforms:
            transform.freeze()

    def agent_time_step_spec(self, time_step_spec):
        return time_step_spec._replace(observation=self.observation_spec)

    def replay_data_spec(self, collect_data_spec):
        """What replay stores: the agent's data spec with the raw observation spec."""
        return collect_data_spec._replace(observation=self.input_spec)

    def summaries(self):
        values = {}
        for transform in self.transforms:
            values.update(transform.summaries())
        return values


class PreprocessedPolicy(tf_policy.TFPolicy):
    """`policy` (built on preprocessed observations) as a policy of raw observations.

    Its `variables()` are the policy's plus the stage's statistics, so the
    distributed learner publishes the statistics with the weights and the
    exported SavedModel carries them.
    """

    def __init__(self, policy, preprocessor, time_step_spec):
        super().__init__(time_step_spec, policy.action_spec,
                         policy_state_spec=policy.policy_state_spec, info_spec=policy.info_spec,
                         clip=False, emit_log_probability=policy.emit_log_probability,
                         name=policy.name + '_preprocessed')
        self._policy = policy
        self._preprocessor = preprocessor

    @property
    def wrapped_policy(self):
        return self._policy

    def _variables(self):
        return self._policy.variables() + list(self._preprocessor.variables)

    def _preprocess(self, time_step):
        return time_step._replace(
            observation=self._preprocessor.observation(time_step.observation, training=False))

    def _action(self, time_step, policy_state, seed):
        return self._policy.action(self._preprocess(time_step), policy_state, seed)

    def _distribution(self, time_step, policy_state):
        return self._policy.distribution(self._preprocess(time_step), policy_state)


def build(transforms, time_step_spec, num_envs):
    """The stage for `run.preprocessing`, or None when it lists nothing (no cost at all)."""
    if not transforms:
        return None
    return Preprocessor(transforms, time_step_spec.observation, num_envs)



