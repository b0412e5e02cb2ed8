"""The transforms a preprocessing stage is composed of (each Gin-configurable).

A transform acts on observations, on rewards, or both:
  - `build(spec, num_envs)` creates its statistics and returns the observation
    spec it outputs (the agent's networks are built for the last one);
  - `observe(...)` gathers statistics from collected (raw) data every env step, and
    `end_chunk()` folds them in once per collect chunk;
  - observations reach a transform as [N, *spec.shape] (the stage flattens
    batch and time dimensions), rewards as they are;
  - `observation(x, training)` / `reward(r)` apply it with the current
    statistics; `training` is True only for sampled batches, which is where
    augmentation happens (never when acting, never to stored data).

Bind them in order with `run.preprocessing = [@preprocess.ObservationNormalization(), ...]`.
"""

import gin
import numpy as np
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

from core.checks import check
from core.errors import UserError
from preprocessing.augment import random_shift
from preprocessing.running_stats import RunningMeanStd


def is_pixels(spec):
    """Integer observations (uint8 frames) are pixels; float ones are feature vectors."""
    return spec.dtype.is_integer


class Transform(tf.Module):
    """The identity; subclasses override what they change."""

    augments = False  # True: applied to sampled batches only

    def build(self, spec, num_envs):
        del num_envs
        return spec

    def observe(self, observation, trajectory):
        """Updates statistics from a collected batch ([N, ...]: this transform's input)."""
        del observation, trajectory

    def observe_sampled(self, observation, experience, valid):
        """Updates statistics from sampled windows' first states (a learner that does not
        collect: offline, distributed); `valid` masks boundary windows."""
        del observation, experience, valid

    def end_chunk(self):
        """Folds what `observe` gathered during a collect chunk into the statistics."""

    def freeze(self):
        """Stops statistics from moving (evaluation never updates them either way)."""

    def observation(self, observation, training):
        del training
        return observation

    def reward(self, reward):
        return reward

    def summaries(self):
        """{tag: (kind, value)} with kind 'scalar' or 'histogram', for TensorBoard."""
        return {}


@gin.configurable(module='preprocess')
class ObservationNormalization(Transform):
    """(x - running mean) / running std per feature, clipped to +-clip.

    Like Stable-Baselines3's VecNormalize, but applied when acting and when
    sampling, never to what replay stores. Statistics come from every collected
    observation, the initial random collection included (the warm-up); with
    `freeze_after_warmup` they stop there.

    Args:
      clip: normalised values are clipped to [-clip, clip] (VecNormalize: 10).
      epsilon: added to the variance before the square root.
      freeze_after_warmup: keep the statistics of the initial random collection.
      include_pixels: also normalise integer (pixel) observations; off by default
        (frames are scaled to [0, 1] by their network instead).
    """

    def __init__(self, clip=10.0, epsilon=1e-8, freeze_after_warmup=False,
                 include_pixels=False):
        super().__init__(name='observation_normalization')
        check('preprocess.ObservationNormalization', locals(),
              numbers={'clip': (0.0, np.inf, 'open_low'), 'epsilon': (0.0, 1.0, 'open_low')},
              flags=('freeze_after_warmup', 'include_pixels'))
        self.clip = float(clip)
        self.epsilon = float(epsilon)
        self.freeze_after_warmup = freeze_after_warmup
        self.include_pixels = include_pixels
        self.stats = None
        self.frozen = tf.Variable(False, trainable=False, name='frozen')

    def build(self, spec, num_envs):
        del num_envs
        if is_pixels(spec) and not self.include_pixels:
            return spec  # pixels pass through (see include_pixels)
        self.stats = RunningMeanStd(spec.shape, name='observation_stats')
        # The transform as float32 shift and scale, recomputed whenever the statistics change
        # (a few ops per step when acting instead of a float64 pipeline).
        self.shift = tf.Variable(tf.zeros(spec.shape, tf.float32), trainable=False,
                                 name='shift')
        self.scale = tf.Variable(tf.ones(spec.shape, tf.float32), trainable=False,
                                 name='scale')
        self.refresh()
        return tf.TensorSpec(spec.shape, tf.float32, name=spec.name)

    def refresh(self):
        """Recomputes shift and scale from the statistics (after they changed)."""
        self.shift.assign(tf.cast(self.stats.mean, tf.float32))
        self.scale.assign(tf.cast(tf.math.rsqrt(self.stats.var + self.epsilon), tf.float32))

    def observe(self, observation, trajectory):
        del trajectory
        if self.stats is not None:
            self.stats.accumulate(observation)

    def end_chunk(self):
        if self.stats is None:
            return
        def merge():
            self.stats.merge_pending()
            self.refresh()
            return tf.constant(True)
        def discard():
            self.stats.discard_pending()
            return tf.constant(False)
        tf.cond(self.frozen, discard, merge)

    def observe_sampled(self, observation, experience, valid):
        del experience
        if self.stats is not None:
            self.stats.accumulate(observation, valid)
            self.end_chunk()

    def freeze(self):
        if self.freeze_after_warmup:
            self.frozen.assign(True)

    def observation(self, observation, training):
        del training
        if self.stats is None:
            return observation
        normalized = (tf.cast(observation, tf.float32) - self.shift) * self.scale
        return tf.clip_by_value(normalized, -self.clip, self.clip)

    def summaries(self):
        if self.stats is None:
            return {}
        return {'preprocess/obs_mean': ('histogram', self.stats.mean),
                'preprocess/obs_std': ('histogram', self.stats.std)}


@gin.configurable(module='preprocess')
class RewardScaling(Transform):
    """Rewards divided by the running std of the discounted return, then clipped.

    VecNormalize's reward normalisation: per env copy a discounted return
    `R = gamma * R + r` (reset at episode ends) is tracked during collection,
    and rewards are divided by the standard deviation of R (not centred, so
    their sign is kept). Applied at sampling time with the current scale, so all
    rewards of one batch share a scale and an n-step target's sum of scaled
    rewards is the scaled sum.

    Args:
      gamma: discount of the tracked return (use the agent's).
      clip: scaled rewards are clipped to [-clip, clip]; VecNormalize: 10.
      epsilon: added to the variance before the square root.
    """

    def __init__(self, gamma=0.99, clip=10.0, epsilon=1e-8):
        super().__init__(name='reward_scaling')
        check('preprocess.RewardScaling', locals(),
              numbers={'gamma': (0.0, 1.0, 'closed'), 'clip': (0.0, np.inf, 'open_low'),
                       'epsilon': (0.0, 1.0, 'open_low')})
        self.gamma = float(gamma)
        self.clip = float(clip)
        self.epsilon = float(epsilon)
        self.stats = RunningMeanStd([], name='return_stats')
        self.returns = None

    def build(self, spec, num_envs):
        self.returns = tf.Variable(tf.zeros([num_envs], tf.float64), trainable=False,
                                   name='discounted_returns')
        return spec

    def observe(self, observation, trajectory):
        del observation
        reward = tf.cast(trajectory.reward, tf.float64)
        # A step that starts on LAST is the LAST -> FIRST boundary of an auto-resetting env:
        # no transition (its reward is the reset's 0).
        real = tf.not_equal(trajectory.step_type, ts.StepType.LAST)
        # An episode's first step starts a new return (also the first episodes after a resume).
        previous = tf.where(tf.equal(trajectory.step_type, ts.StepType.FIRST),
                            tf.zeros_like(self.returns), self.returns)
        returns = tf.where(real, previous * self.gamma + reward, self.returns)
        self.stats.accumulate(returns, real)
        self.returns.assign(tf.where(tf.equal(trajectory.next_step_type, ts.StepType.LAST),
                                     tf.zeros_like(returns), returns))

    def end_chunk(self):
        self.stats.merge_pending()

    @property
    def scale(self):
        """What rewards are divided by."""
        return tf.sqrt(self.stats.var + self.epsilon)

    def reward(self, reward):
        scaled = tf.cast(reward, tf.float64) / self.scale
        return tf.cast(tf.clip_by_value(scaled, -self.clip, self.clip), reward.dtype)

    def summaries(self):
        return {'preprocess/reward_scale': ('scalar', self.scale)}


@gin.configurable(module='preprocess')
class RewardClipping(Transform):
    """Clips the rewards the agent trains on to [low, high] (DQN on Atari: the sign, +-1).

    Replay, TensorBoard, evaluation and every report keep the game's own rewards:
    only the targets see clipped ones.
    """

    def __init__(self, low=-1.0, high=1.0):
        super().__init__(name='reward_clipping')
        if not (isinstance(low, (int, float)) and isinstance(high, (int, float)) and low < high):
            raise UserError(f"preprocess.RewardClipping needs numbers low < high, got low={low!r}"
                            f", high={high!r}.")
        self.low, self.high = float(low), float(high)

    def reward(self, reward):
        return tf.clip_by_value(reward, self.low, self.high)


@gin.configurable(module='preprocess')
class GaussianNoise(Transform):
    """Adds N(0, std^2) to every feature of sampled (vector) observations; never when acting."""

    augments = True

    def __init__(self, std=0.01):
        super().__init__(name='gaussian_noise')
        check('preprocess.GaussianNoise', locals(), numbers={'std': (0.0, np.inf, 'open_low')})
        self.std = float(std)

    def build(self, spec, num_envs):
        del num_envs
        if is_pixels(spec):
            raise UserError("preprocess.GaussianNoise is for feature-vector observations, and "
                            "these are pixels: use preprocess.RandomShift() instead.")
        return spec

    def observation(self, observation, training):
        if not training:
            return observation
        noise = tf.random.normal(tf.shape(observation), stddev=self.std, dtype=observation.dtype)
        return observation + noise


@gin.configurable(module='preprocess')
class RandomShift(Transform):
    """DrQ's random shift of sampled frames: pad by `pad` (edge pixels repeated), random crop.

    Every frame of a sampled batch (every sample and every step of its window)
    gets its own shift; acting and stored frames are never shifted.
    """

    augments = True

    def __init__(self, pad=4):
        super().__init__(name='random_shift')
        check('preprocess.RandomShift', locals(), positive=('pad',))
        self.pad = int(pad)

    def build(self, spec, num_envs):
        del num_envs
        if spec.shape.rank != 3:
            raise UserError(f"preprocess.RandomShift needs image observations [height, width, "
                            f"channels], got shape {spec.shape.as_list()}: use "
                            "preprocess.GaussianNoise() for feature vectors.")
        return spec

    def observation(self, observation, training):
        if not training:
            return observation
        return random_shift(observation, self.pad)


@gin.configurable(module='preprocess')
class FeatureFunction(Transform):
    """A user's own feature function: `fn(observations [N, ...]) -> features [N, ...]`.

    `fn` is any Gin-registered callable of TF ops (see preprocessing/features.py
    and configs/dqn_cartpole_features.gin). It runs when acting and when
    sampling, on raw observations (or on the previous transform's output), and
    the agent's networks are built for its output.
    """

    def __init__(self, fn=None):
        super().__init__(name='feature_function')
        if not callable(fn):
            raise UserError(f"preprocess.FeatureFunction.fn must be a Gin-registered function "
                            f"such as @preprocess.squared_features, got {fn!r}: bind it.")
        self.fn = fn

    def build(self, spec, num_envs):
        del num_envs
        name = getattr(self.fn, '__name__', repr(self.fn))
        try:
            traced = tf.function(self.fn).get_concrete_function(
                tf.TensorSpec([None, *spec.shape], spec.dtype))
        except Exception as error:  # a user's function: say which one failed and why
            reason = ' '.join(str(error).split())[:200]
            raise UserError(f"preprocess.FeatureFunction.fn={name} failed on observations of "
                            f"shape {spec.shape.as_list()} ({reason}): fix the function.") \
                from None
        output = traced.structured_outputs
        if not isinstance(output, tf.Tensor) or output.shape.rank < 1:
            raise UserError(f"preprocess.FeatureFunction.fn={name} must return one tensor "
                            "[batch, ...]: fix the function.")
        return tf.TensorSpec(output.shape[1:], output.dtype, name='features')

    def observation(self, observation, training):
        del training
        return self.fn(observation)
