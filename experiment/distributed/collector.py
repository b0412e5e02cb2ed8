"""The collect role: batched envs stepped with the latest pulled weights, windows written to replay.

Writing goes through the run's Reverb replay backend pointed at the server
(`server_address=`), the same writer a single-process Reverb run uses, and
collection is the single-process loop's `Collection` (one `tf.function` per
chunk of env steps). The policy is uniform random until
the table holds `run.initial_collect_steps` transitions (all collectors
together) or while no weights have been pushed; afterwards the collect
policy with weights pulled every `weight_pull_interval` env steps.

A collector never crashes because the server is away or the rate limiter
holds its inserts: the failed chunk is dropped (experience is cheap), the
writer is rebuilt with backoff, and the watchdog logs who it waits on. It
ends when the table has received `run.num_env_steps` transitions, or on
SIGINT/SIGTERM.

With sharded replay (`distributed.settings.replay_shards` > 1) it writes to one
shard at a time, chosen at every weight pull by `buffers.reverb.shards.choose_shard`:
balanced first, then the one it writes to, then one on its own machine. Moving keeps
every window (the writer is retargeted, `ReverbBackend.retarget`); a shard that goes
down is left at the next reconnect. Weights come from shard 0.
"""

import time

import tensorflow as tf
from tf_agents.metrics import tf_metrics

from buffers.reverb.shards import choose_shard
from core import rundir, seeds, tags
from envs.suite import make_env
from experiment.distributed import common, config, tables, tier
from experiment.distributed.waiting import TRANSIENT, Stopped, Watchdog, one_line, retry
from experiment.loop import Collection
from experiment.replay import Mode

# Writers of replay shards that died: never closed (closing one waits for its server).
_LEFT_BEHIND = []
RATIO_POLL_S = 0.05  # how often a collector held by the ratio reads the shards' counters


class _Collector:
    """One collector's state: env, agent, writer, counters."""

    def __init__(self, role, settings, params, *, address, collector_id, seed):
        self.role, self.settings, self.params = role, settings, params
        self.seed = seed
        env = make_env(seed=seeds.collection(seed, collector_id))
        self.agent, self.train_step, self.tf_env = common.build_agent(params, seed=seed, env=env)
        settings = self.settings = config.for_agent(settings, self.agent)
        self.num_envs = self.tf_env.batch_size
        # Listed once (TF-Agents walks the policy's modules on every `variables()` call).
        self.policy_variables = tuple(self.agent.collect_policy.variables())
        self.steps_per_call = max(1, params.collect_steps_per_iteration // self.num_envs)
        self.metrics = {
            tags.TRAIN_AVERAGE_RETURN: tf_metrics.AverageReturnMetric(batch_size=self.num_envs),
            tags.TRAIN_AVERAGE_EPISODE_LENGTH:
                tf_metrics.AverageEpisodeLengthMetric(batch_size=self.num_envs),
            'collector/episodes': tf_metrics.NumberOfEpisodes(),
        }
        self.env_step_counter = tf.Variable(0, dtype=tf.int64, name='env_steps')
        self.collector_id = collector_id
        self.tier = tier.ReplayTier(tier.parse_addresses(address, settings.replay_shards),
                                    timeout_s=settings.timeout_s, settings=settings)
        self.store = tables.WeightStore(self.tier.weights_address, timeout_s=settings.timeout_s)
        self.shard = 0  # the shard written to
        self.gate = tier.RatioGate(settings) if settings.replay_shards > 1 else None
        self.last_reading = None  # (time.monotonic(), inserted per shard) at the last choice
        self.writer = None
        self.env_steps = 0
        self.policy_step = None  # the learner step of the weights in use; None: none pulled
        self.global_inserted = 0
        self.staleness = []
        self.moves = 0  # shard changes (sharded replay)

    @property
    def address(self):
        """The replay shard this collector writes to."""
        return self.tier.addresses[self.shard]

    def whom(self):
        return f"the replay server at {self.address} or the learner (rate limiter)"

    def probe(self):
        return common.limiter_state(self.tier.counters())

    def finished(self):
        """Why collecting is over (the table has the run's transitions), or None."""
        inserted = self.tier.counters()['inserted']
        budget = self.params.num_env_steps
        if inserted >= budget:
            return f"the table has {inserted:,} transitions, the run's {budget:,}"
        return None

    def connect(self):
        """Opens the writer (with retries) and traces the two collect functions for it."""
        if self.tier.num_shards > 1:
            shards = self.tier.shard_counters()
            if self.writer is not None and shards[self.shard] is None:
                # Closing a writer waits for its server: leave a dead shard's writer behind.
                _LEFT_BEHIND.append(self.writer)
                self.writer = None
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:  # noqa: BLE001  (a dead server's writer may fail to close)
                pass

        def open_writer():
            if self.tier.num_shards > 1:  # a live shard, chosen afresh on every try
                shards = self.tier.shard_counters()
                if all(shard is None for shard in shards):
                    raise ConnectionError("no replay shard answers")
                self.shard = self.choose_shard(shards)
            return common.remote_backend(Mode.COLLECTOR, self.params, self.settings,
                                         self.agent, num_envs=self.num_envs,
                                         address=self.address, seed=self.seed)

        self.writer = retry(self.role, open_writer, what='opening the replay writer',
                            whom=self.tier.describe(), timeout_s=self.settings.timeout_s)
        self.fresh_writer = True
        self.collection = Collection(
            tf_env=self.tf_env, collect_policy=self.agent.collect_policy,
            observers=[self.writer.add, *self.metrics.values()],
            env_steps=self.env_step_counter)
        # Traced now, not inside the first (watched) write: tracing is no waiting on peers.
        self.collection.collect_random.get_concrete_function()
        self.collection.collect_with_agent.get_concrete_function()

    def choose_shard(self, shards=None):
        """The shard to write to now (`choose_shard`), from each shard's counters."""
        shards = shards if shards is not None else self.tier.shard_counters()
        inserted = [None if c is None else c['inserted'] for c in shards]
        now, rates = time.monotonic(), None
        if self.last_reading is not None:
            then, before = self.last_reading
            rates = [0.0 if new is None or old is None else (new - old) / max(now - then, 1e-6)
                     for new, old in zip(inserted, before)]
        self.last_reading = (now, inserted)
        return choose_shard(inserted, local=self.tier.local_shards(), current=self.shard,
                            rates=rates, offset=self.collector_id)

    def rebalance(self):
        """Moves the writer to another shard when that one should get the next windows.

        Returns the shard moved to, or None. A failed move leaves the writer broken: the
        next chunk fails and reconnects (choosing again).
        """
        if self.tier.num_shards == 1:
            return None
        shards = self.tier.shard_counters()
        chosen = self.choose_shard(shards)
        if chosen == self.shard:
            return None
        alive = shards[self.shard] is not None
        if not alive:
            self.role.log(f"replay shard {self.shard} at {self.address} does not answer; "
                          f"moving to shard {chosen} at {self.tier.addresses[chosen]}")
        self.shard = chosen
        self.moves += 1
        self.writer.retarget(self.address, old_server_alive=alive)
        return chosen

    def wait_for_ratio(self, watchdog):
        """Sharded replay: waits while the learner is too far behind (the whole buffer's ratio,
        experiment/distributed/tier.py); checked at every weight pull."""
        if self.gate is None:
            return
        with watchdog.waiting('waiting for the learner (samples-per-insert ratio over all '
                              'shards)', 'the learner', self.probe, self.finished):
            while not self.gate.inserts_allowed(retry(
                    self.role, self.tier.counters, what='reading the replay shards',
                    whom=self.tier.describe(), timeout_s=self.settings.timeout_s)):
                self.role.sleep(RATIO_POLL_S)

    def pull(self):
        """Refreshes weights and the run's insert count; returns the insert count."""
        def call():
            return self.tier.counters(), self.store.pull()

        counters, pulled = retry(self.role, call, what='pulling weights',
                                 whom=self.tier.describe(),
                                 timeout_s=self.settings.timeout_s)
        self.global_inserted = counters['inserted']
        if pulled is not None:
            values, step = pulled
            tables.assign(self.policy_variables, values)
            self.train_step.assign(step)  # schedules tied to the train step (epsilon) follow
            if self.policy_step is not None:
                self.staleness.append(step - self.policy_step)
            self.policy_step = step
        return self.global_inserted

    def collect_chunk(self):
        use_random = (self.policy_step is None
                      or self.global_inserted < self.params.initial_collect_steps)
        function = (self.collection.collect_random if use_random
                    else self.collection.collect_with_agent)
        steps = tf.constant(self.steps_per_call, tf.int32)
        function(steps)
        self.env_steps += self.steps_per_call * self.num_envs


def main(root_dir, *, address, collector_id=0, seed=0, force=False, verbose=True):
    """Collects until the table has `run.num_env_steps` transitions; returns counters."""
    params, settings, role, directory = common.start_role(
        'collect', root_dir, force=force, seed=seed, collector_id=collector_id)
    collector = _Collector(role, settings, params, address=address, collector_id=collector_id,
                           seed=seed)
    summaries = common.RateSummaries(directory)
    watchdog = Watchdog(role, exit_when_stopped_after_s=2 * settings.timeout_s)
    role.install_signal_handlers()
    start = time.monotonic()
    finished_at = None
    try:
        collector.connect()
        _loop(collector, role, settings, params, summaries, watchdog)
        finished_at = time.time()
    except Stopped:
        pass
    finally:
        if collector.writer is not None:
            # Items the rate limiter still holds may keep the writer's close waiting.
            with watchdog.waiting('closing the replay writer', 'the replay server',
                                  finished=lambda: 'the collector is done'):
                try:
                    collector.writer.close()
                except Exception:  # noqa: BLE001  (a dead server's writer may fail to close)
                    pass
        watchdog.close()
        role.restore_signal_handlers()
        summaries.close()
    result = {'env_steps': collector.env_steps, 'policy_train_step': collector.policy_step,
              'shard_moves': collector.moves,
              'env_steps_per_sec': collector.env_steps / max(time.monotonic() - start, 1e-9),
              'finished_at': finished_at}
    rundir.write_metrics(directory, result)
    if verbose:
        role.log(f"stopped after {collector.env_steps:,} env steps")
    return result


def _loop(collector, role, settings, params, summaries, watchdog):
    next_pull = 0
    next_summary = time.monotonic() + settings.summary_interval_s
    while not role.stop.is_set():
        if collector.env_steps >= next_pull:
            with watchdog.waiting('pulling weights', collector.tier.describe()):
                inserted = collector.pull()
            if inserted >= params.num_env_steps:
                role.log(f"the table has {collector.global_inserted:,} transitions, the run's "
                         f"{params.num_env_steps:,}: collection done")
                return
            next_pull = collector.env_steps + settings.weight_pull_interval
            collector.wait_for_ratio(watchdog)
            try:
                with watchdog.waiting('moving to another replay shard', collector.tier.describe()):
                    collector.rebalance()
            except TRANSIENT as error:
                role.log(f"moving to replay shard {collector.shard} failed ({one_line(error)}); "
                         "reconnecting")
                with watchdog.waiting('reconnecting the replay writer', collector.tier.describe()):
                    collector.connect()
        try:
            with watchdog.waiting('writing a chunk of env steps to replay', collector.whom(),
                                  collector.probe, collector.finished):
                collector.collect_chunk()
        except TRANSIENT as error:
            role.log(f"writing to replay failed ({one_line(error)}); dropping this chunk and "
                     "reconnecting")
            with watchdog.waiting('reconnecting the replay writer',
                                  f'the replay server at {collector.address}'):
                collector.connect()
            continue
        if collector.fresh_writer:
            collector.fresh_writer = False
            where = (f"replay shard {collector.shard} at {collector.address}"
                     if collector.tier.num_shards > 1 else
                     f"the replay server at {collector.address}")
            role.log(f"writing to {where} ({collector.num_envs} envs, "
                     f"{collector.env_steps:,} env steps so far)")
        if time.monotonic() >= next_summary:
            _summarize(collector, summaries)
            next_summary = time.monotonic() + settings.summary_interval_s


def _summarize(collector, summaries):
    scalars = {tag: metric.result() for tag, metric in collector.metrics.items()
               if tag != 'collector/episodes'}
    if collector.staleness:
        scalars['collector/weight_staleness'] = sum(collector.staleness) / len(
            collector.staleness)
        collector.staleness = []
    if collector.policy_step is not None:
        scalars['collector/policy_train_step'] = collector.policy_step
    if collector.tier.num_shards > 1:
        scalars['collector/shard'] = collector.shard
    values = summaries.write(collector.global_inserted, scalars, {
        'collector/env_steps': collector.env_steps,
        'collector/episodes': int(collector.metrics['collector/episodes'].result()),
        'collector/shard_moves': collector.moves})
    if 'collector/env_steps_per_sec' in values:
        summaries.write(collector.global_inserted,
                        {tags.ENV_STEPS_PER_SEC: values['collector/env_steps_per_sec']})
