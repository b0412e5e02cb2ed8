"""TensorBoard tags: one module, because sweeps and checks read them by name.

Changing a tag here breaks every tool that reads event files; treat the names
as a contract.
"""

TRAIN_AVERAGE_RETURN = 'Metrics/AverageReturn'
TRAIN_AVERAGE_EPISODE_LENGTH = 'Metrics/AverageEpisodeLength'
EVAL_AVERAGE_RETURN = 'eval/AverageReturn'
EVAL_AVERAGE_EPISODE_LENGTH = 'eval/AverageEpisodeLength'
TRAIN_LOSS = 'train/loss'
TRAIN_MEAN_Q = 'train/mean_q'
TRAIN_EPISODES = 'train/episodes'
ENV_STEPS_PER_SEC = 'perf/env_steps_per_sec'
TRAIN_STEPS_PER_SEC = 'perf/train_steps_per_sec'
BUFFER_PREFIX = 'buffer/'
OPERATIVE_CONFIG = 'config/operative_gin'
