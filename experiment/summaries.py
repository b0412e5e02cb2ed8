"""TensorBoard writing, flushed only together with checkpoints.

Events are held in the writer's queue and flushed right before each
checkpoint is saved. A run killed between checkpoints therefore loses exactly
the events after its last checkpoint -- which the resumed run writes again --
so curves continue with no gap and no duplicated step.
"""

import os

import tensorflow as tf

from experiment import tags

# Large enough that the writer never flushes on its own between checkpoints.
_MAX_QUEUE = 1_000_000
_FLUSH_MILLIS = 24 * 3600 * 1000


class SummaryWriter:
    """Scalars and text under root_dir/tb, with the env-step count as step."""

    def __init__(self, root_dir):
        self.logdir = os.path.join(root_dir, 'tb')
        self._writer = tf.summary.create_file_writer(
            self.logdir, max_queue=_MAX_QUEUE, flush_millis=_FLUSH_MILLIS)

    def scalars(self, values, step):
        with self._writer.as_default(step=int(step)):
            for tag, value in values.items():
                tf.summary.scalar(tag, float(value))

    def histogram(self, tag, values, step):
        with self._writer.as_default(step=int(step)):
            tf.summary.histogram(tag, values)

    def operative_config(self, config_text, step):
        # Gin's config is Python-like text; TB renders text summaries as markdown.
        markdown = '\n'.join('    ' + line for line in config_text.splitlines())
        with self._writer.as_default(step=int(step)):
            tf.summary.text(tags.OPERATIVE_CONFIG, markdown)

    def flush(self):
        self._writer.flush()

    def close(self):
        self._writer.close()
