"""TensorBoard HParams summaries, so `tensorboard --logdir <sweep dir>` shows the sweep.

The experiment config (which hparams and metrics exist) goes once in the sweep
dir; each trial gets `<root_dir>/hparams/`, an event dir holding its hparam
values and its final metrics as scalars. Seeds share hparam values, so the
dashboard groups them into one session group per configuration. Everything is
rewritten from metrics.json on each run, so reruns never duplicate entries.
"""

import glob
import os
import shutil

from sweeps import naming

TRIAL_SUBDIR = 'hparams'
METRICS = ('final_eval_return', 'best_eval_return', 'steps_to_target', 'wall_time_s',
           'env_steps')


def write(sweep_dir, spec, param_names, config_results):
    """Writes the experiment config and one session per finished, local trial."""
    import tensorflow as tf
    from tensorboard.plugins.hparams import api as hp

    hparams = {key: hp.HParam(param_names[key], _domain(spec, key)) for key in spec.swept_keys}
    for old in glob.glob(os.path.join(sweep_dir, 'events.out.tfevents.*')):
        os.remove(old)
    writer = tf.summary.create_file_writer(sweep_dir)
    with writer.as_default():
        hp.hparams_config(hparams=list(hparams.values()),
                          metrics=[hp.Metric(metric) for metric in METRICS])
    writer.close()
    for result in config_results:
        values = {hparams[key]: _coerce(hparam_value(value), hparams[key].domain)
                  for key, value in result.params}
        for run in result.runs:
            if os.path.isdir(run.root_dir):
                _write_session(run, values, result.label)


def _write_session(run, values, group):
    """One seed's session; `group` (the configuration) makes TensorBoard group the seeds."""
    import tensorflow as tf
    from tensorboard.plugins.hparams import api as hp

    logdir = os.path.join(run.root_dir, TRIAL_SUBDIR)
    shutil.rmtree(logdir, ignore_errors=True)
    writer = tf.summary.create_file_writer(logdir)
    with writer.as_default(step=int(run.metrics.get('env_steps') or 0)):
        hp.hparams(values, trial_id=group)
        for metric in METRICS:
            if run.metrics.get(metric) is not None:
                tf.summary.scalar(metric, float(run.metrics[metric]))
    writer.close()


def hparam_value(value):
    """HParams take bool, int, float or str; sequences are shown as their Gin text."""
    if isinstance(value, (bool, int, float, str)):
        return value
    return naming.gin_literal(value)


def _coerce(value, domain):
    """An int in a float domain is written as a float, as the domain declares."""
    if getattr(domain, 'dtype', None) is float and isinstance(value, int):
        return float(value)
    return value


def _domain(spec, key):
    from tensorboard.plugins.hparams import api as hp

    if spec.grid is not None:
        return _discrete(dict(spec.grid)[key])
    param = next(p for p in spec.search.params if p.key == key)
    if param.type == 'float':
        return hp.RealInterval(float(param.low), float(param.high))
    if param.type == 'int':
        return hp.IntInterval(int(param.low), int(param.high))
    return _discrete(param.choices)


def _discrete(values):
    """A Discrete domain when the values share one type (ints mixed with floats count as
    floats); None (no declared domain) otherwise."""
    from tensorboard.plugins.hparams import api as hp

    values = [hparam_value(value) for value in values]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        if any(isinstance(v, float) for v in values):
            values = [float(v) for v in values]
    kinds = {type(v) for v in values}
    return hp.Discrete(values) if len(kinds) == 1 else None
