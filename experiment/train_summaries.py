"""The periodic training summaries: agent, throughput and replay health."""

from core import tags
from experiment.buffer_probe import RateTracker
from experiment.loop import ALL_FINITE


class TrainSummaries:
    """Writes every `summary_interval` env steps; reads counters, never per-step data."""

    def __init__(self, writer, *, agent, backend, train_metrics, train_step, probe,
                 extra=dict):
        self._writer = writer
        self._agent = agent
        self._backend = backend
        self._train_metrics = train_metrics
        self._train_step = train_step
        self._probe = probe
        self._extra = extra  # {tag: (kind, value)}: e.g. the preprocessing statistics
        self._loop_rates = RateTracker()
        self._buffer_rates = RateTracker()
        self._capacity_checked = False

    def start(self, env_step):
        """Starts the rate clocks (after initial collection, so it is not counted)."""
        self._loop_rates({'env_steps': env_step, 'train_steps': int(self._train_step.numpy())})

    def write(self, env_step, diagnostics):
        values = {tag: metric.result().numpy() for tag, metric in self._train_metrics.items()}
        for name, value in diagnostics.items():  # loss and the agent's batch diagnostics
            if name != ALL_FINITE:
                values['train/' + name] = value.numpy()
        for name, value in self._agent.summary_scalars().items():
            values[name] = float(value)
        rates = self._loop_rates(
            {'env_steps': env_step, 'train_steps': int(self._train_step.numpy())})
        values[tags.ENV_STEPS_PER_SEC] = rates['env_steps_per_sec']
        values[tags.TRAIN_STEPS_PER_SEC] = rates['train_steps_per_sec']
        for name, value in self._buffer_values().items():
            values[tags.BUFFER_PREFIX + name] = value
        self._writer.scalars(values, env_step)
        self._writer.kinds(self._extra(), env_step)
        self._check_capacity(values.get(tags.TRAIN_AVERAGE_EPISODE_LENGTH, 0.0))
        for name, histogram in self._backend.histograms().items():
            if len(histogram):
                self._writer.histogram(tags.BUFFER_PREFIX + name, histogram, env_step)

    def _buffer_values(self):
        values = dict(self._backend.metrics())
        values.update(self._buffer_rates(
            {'inserted': values['inserted'], 'sampled': values['sampled']}))
        values['samples_per_insert'] = values['sampled'] / max(values['inserted'], 1.0)
        values.update(self._probe())
        return values

    def _check_capacity(self, average_episode_length):
        """Warns once if replay holds fewer than ~10 episodes: it would forget too fast."""
        if self._capacity_checked or average_episode_length <= 0:
            return
        self._capacity_checked = True
        capacity = self._backend.metrics()['capacity']
        if capacity < 10 * average_episode_length:
            print(f"warning: run.replay_capacity={capacity:.0f} holds fewer than 10 episodes "
                  f"(average length so far {average_episode_length:.0f} steps); consider "
                  "raising it.", flush=True)
