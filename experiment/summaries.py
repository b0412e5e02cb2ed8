"""TensorBoard writing that stays consistent with checkpoints.

Summaries are held in memory and written to the event file only by `flush`,
which the run calls right before each checkpoint is saved. A run killed
between checkpoints therefore loses exactly the summaries after its last
checkpoint -- which the resumed run writes again -- so curves continue with
no gap and no duplicated step. (TF's own writer cannot be trusted with this:
every `as_default()` block flushes to disk on exit.) For the one remaining
window, a kill after the flush but before the checkpoint is complete, a
resumed run first drops any events newer than the checkpoint it restored.
"""

import glob
import os

import tensorflow as tf

from core import tags


class SummaryWriter:
    """Scalars, histograms and text under root_dir/tb, with the env-step count as step."""

    def __init__(self, root_dir, *, resume_step=None):
        self.logdir = os.path.join(root_dir, 'tb')
        if resume_step is not None:
            drop_events_after(self.logdir, resume_step)
        self._writer = tf.summary.create_file_writer(self.logdir)
        self._pending = []

    def scalars(self, values, step):
        for tag, value in values.items():
            self._pending.append((tf.summary.scalar, tag, float(value), int(step)))

    def histogram(self, tag, values, step):
        self._pending.append((tf.summary.histogram, tag, values, int(step)))

    def kinds(self, values, step):
        """{tag: (kind, value)} with kind 'scalar' or 'histogram' (e.g. preprocessing stats)."""
        for tag, (kind, value) in values.items():
            if kind == 'scalar':
                self.scalars({tag: value}, step)
            else:
                self.histogram(tag, value.numpy(), step)

    def animation(self, tag, gif_bytes, width, height, step, description=''):
        """An animated GIF in the Images tab (TensorBoard serves it as image/gif)."""
        self._pending.append((_write_gif, tag, (gif_bytes, width, height, description),
                              int(step)))

    def operative_config(self, config_text, step):
        # Gin's config is Python-like text; TB renders text summaries as markdown.
        markdown = '\n'.join('    ' + line for line in config_text.splitlines())
        self._pending.append((tf.summary.text, tags.OPERATIVE_CONFIG, markdown, int(step)))

    def flush(self):
        """Writes every pending summary to disk."""
        if not self._pending:
            return
        with self._writer.as_default():  # flushes on exit
            for write, tag, value, step in self._pending:
                write(tag, value, step=step)
        self._pending = []

    def close(self):
        self.flush()
        self._writer.close()


def _write_gif(tag, value, step):
    from tensorboard.plugins.image import metadata

    gif_bytes, width, height, description = value
    tf.summary.write(tag, tf.constant([str(width), str(height), gif_bytes]), step=step,
                     metadata=metadata.create_summary_metadata(tag, description))


def drop_events_after(logdir, step):
    """Rewrites event files without summaries newer than `step` (atomically, per file).

    A file cut short by a crash or a full disk ends in a truncated or corrupt
    record: what precedes it is kept, the rest dropped, so a resume never fails
    on the damage a kill can leave.
    """
    for path in sorted(glob.glob(os.path.join(logdir, 'events.out.tfevents.*'))):
        events, damaged = _readable_events(path)
        kept = [event for event in events if not event.summary.value or event.step <= step]
        if len(kept) == len(events) and not damaged:
            continue
        tmp_path = path + '.tmp'
        with tf.io.TFRecordWriter(tmp_path) as records:
            for event in kept:
                records.write(event.SerializeToString())
        os.replace(tmp_path, path)


def _readable_events(path):
    """(the events readable from the start of `path`, whether the rest was damaged)."""
    events = []
    try:
        for event in tf.compat.v1.train.summary_iterator(path):
            events.append(event)
    except (tf.errors.DataLossError, tf.errors.OutOfRangeError):
        return events, True
    return events, False
