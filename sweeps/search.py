"""An Optuna search: configurations sampled by a study kept in a database.

Each Optuna trial is one configuration, run with every seed of the spec (one
train.py subprocess per seed, in `<root>/<sweep>/<k=v,...>/seed_<n>`); its
objective is the seeds' mean of `metric` (a steps_to_target that was never
reached counts as the run's env steps).

The study lives in the spec's `storage` (default: `study.db`, SQLite, in the
sweep dir), which is what makes a search resumable and shareable:

* Rerunning the command continues the study up to `num_trials`.
* Several `sweep.py` processes given the same storage URL work on one study,
  on one machine (SQLite) or on several (a server database, e.g.
  `--storage postgresql://user@host/db`, with its driver installed). Each
  process writes its trials' run dirs under its own --root_dir.
* Every running trial records a heartbeat. A trial whose process was killed
  stops beating; after `3 * heartbeat_s` any worker marks it FAIL and
  re-queues its configuration once (up to `max_retries` times), and the rerun
  resumes the seeds' checkpoints. A trial stopped by Ctrl-C is re-queued at
  once. Neither counts twice towards num_trials.
* A trial whose train.py exits with an error is FAIL and counts (it is not
  retried: a deterministic crash would only crash again).
* The number of trials is claimed after asking: a worker that finds
  num_trials earlier trials ahead of its own marks its trial FAIL ('surplus')
  and runs nothing, so racing workers never overshoot num_trials.
"""

import os
import random
import threading
import time
import warnings

from core.errors import UserError
from sweeps import executor, naming, results, trial, validate

OUTCOME = 'sweep_outcome'  # user attr: 'crashed' or 'surplus' on FAIL trials
CONFIG = 'config'          # user attr: the configuration's directory label
SEED_METRICS = 'seed_metrics'  # user attr: {seed: metrics.json} of a COMPLETE trial
_OPEN_TRIES = 3
_POLL_S = 2.0  # how often an idle worker looks for retries or the end


def storage_url(spec, sweep_dir, override=None):
    """The study's database URL: --storage, else the spec's, else SQLite in the sweep dir."""
    url = override or spec.search.storage
    if url is None:
        os.makedirs(sweep_dir, exist_ok=True)
        return 'sqlite:///' + os.path.join(os.path.abspath(sweep_dir), 'study.db')
    if url.startswith('sqlite:///'):
        directory = os.path.dirname(url[len('sqlite:///'):])
        if directory:
            os.makedirs(directory, exist_ok=True)
    return url


def check(spec, gin_files, base_bindings):
    """Validates every searched binding at its range ends / each choice (raises UserError)."""
    for param in spec.search.params:
        validate.check_values(gin_files, base_bindings, param.key, param.representative_values(),
                              spec.path)


def open_study(spec, url):
    """Creates or loads the study named after the sweep; returns (study, storage)."""
    import optuna

    _quiet_optuna()
    search = spec.search
    last_error = None
    for attempt in range(_OPEN_TRIES):  # workers starting together race to create tables
        try:
            storage = optuna.storages.RDBStorage(
                url, engine_kwargs=_engine_kwargs(url), heartbeat_interval=search.heartbeat_s,
                grace_period=3 * search.heartbeat_s,
                heartbeat_stale_trial_callback=optuna.storages.RetryFailedTrialCallback(
                    max_retry=search.max_retries))
            study = optuna.create_study(
                study_name=spec.name, storage=storage, sampler=make_sampler(search),
                direction=search.direction, load_if_exists=True)
            break
        except ImportError as error:
            raise UserError(f"Cannot open the Optuna storage {url}: {error}; install the "
                            "database driver (e.g. psycopg2-binary for postgresql).") from None
        except Exception as error:  # SQLAlchemy/Optuna errors vary by backend
            last_error = error
            time.sleep(0.1 + 0.5 * random.random())
    else:
        raise UserError(f"Cannot open the Optuna storage {url}: {_first_line(last_error)} -- "
                        "check the URL and that the database is reachable.")
    if study.direction.name.lower() != search.direction:
        raise UserError(f"Study {spec.name} in {url} was created to "
                        f"{study.direction.name.lower()}, but {spec.path} says "
                        f"{search.direction}: use another name or storage.")
    return study, storage


def make_sampler(search):
    import optuna

    if search.sampler == 'random':
        return optuna.samplers.RandomSampler(seed=search.sampler_seed)
    # constant_liar: parallel workers do not all sample next to the same running trial.
    return optuna.samplers.TPESampler(seed=search.sampler_seed, constant_liar=True)


def distributions(search):
    """{binding key: Optuna distribution}. Non-scalar choices are offered as their Gin text."""
    import optuna.distributions as od

    result = {}
    for param in search.params:
        if param.type == 'float':
            result[param.key] = od.FloatDistribution(param.low, param.high, log=param.log,
                                                     step=param.step)
        elif param.type == 'int':
            result[param.key] = od.IntDistribution(param.low, param.high, log=param.log,
                                                   step=param.step or 1)
        else:
            result[param.key] = od.CategoricalDistribution(_choice_keys(param))
    return result


def params_of(search, optuna_params):
    """((key, value), ...) of a trial, mapping Gin-text choices back to their values."""
    params = []
    for param in search.params:
        value = optuna_params[param.key]
        if param.type == 'categorical':
            value = dict(zip(_choice_keys(param), param.choices))[value]
        params.append((param.key, value))
    return tuple(params)


def counted(trials):
    """Trials that use up num_trials: not the stale/interrupted (re-queued) or surplus ones."""
    import optuna

    live = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING,
            optuna.trial.TrialState.WAITING)
    return [t for t in trials
            if t.state in live or t.user_attrs.get(OUTCOME) == 'crashed']


class Worker:
    """One ask-run-tell loop; a sweep runs --workers of them, each on its own thread."""

    def __init__(self, spec, gin_files, base_bindings, sweep_dir, launcher, open_fn, *,
                 echo=print, poll_s=None):
        self._spec = spec
        self._gin_files = gin_files
        self._base_bindings = tuple(base_bindings)
        self._sweep_dir = sweep_dir
        self._launcher = launcher
        self._open = open_fn  # () -> (study, storage); one study object per thread
        self._echo = echo
        self._poll_s = poll_s or min(_POLL_S, spec.search.heartbeat_s)
        self._names = naming.short_names(spec.swept_keys)

    def __call__(self):
        import optuna

        study, storage = self._open()
        waiting_announced = False
        while not self._launcher.stop_requested:
            optuna.storages.fail_stale_trials(study)  # killed trials: FAIL + re-queued
            trials = study.get_trials(deepcopy=False)
            if not self._can_ask(trials):
                if not any(t.state == optuna.trial.TrialState.RUNNING for t in trials):
                    return
                if not waiting_announced:
                    self._echo('waiting for trials still running (here or on other workers)')
                    waiting_announced = True
                time.sleep(self._poll_s)
                continue
            self._ask_and_run(study, storage)

    def _can_ask(self, trials):
        import optuna

        return (len(counted(trials)) < self._spec.search.num_trials
                or any(t.state == optuna.trial.TrialState.WAITING for t in trials))

    def _ask_and_run(self, study, storage):
        import optuna

        optuna_trial = study.ask(distributions(self._spec.search))
        # Optuna exposes no public trial id; the heartbeat API is keyed by it.
        with _Heartbeat(storage, optuna_trial._trial_id, self._spec.search.heartbeat_s):
            earlier = [t for t in counted(study.get_trials(deepcopy=False))
                       if t.number < optuna_trial.number]
            if len(earlier) >= self._spec.search.num_trials:
                optuna_trial.set_user_attr(OUTCOME, 'surplus')
                study.tell(optuna_trial, state=optuna.trial.TrialState.FAIL)
                return
            self._run(study, optuna_trial)

    def _run(self, study, optuna_trial):
        import optuna

        params = params_of(self._spec.search, optuna_trial.params)
        label = naming.config_label(params, self._names)
        optuna_trial.set_user_attr(CONFIG, label)
        self._echo(f'optuna trial {optuna_trial.number}: {label}')
        outcomes = self._run_seeds(label, params)
        statuses = {outcome.status for outcome in outcomes.values()}
        if statuses <= {'finished', 'skipped'} and len(outcomes) == len(self._spec.seeds):
            seed_metrics = {str(seed): outcome.metrics for seed, outcome in outcomes.items()}
            optuna_trial.set_user_attr(SEED_METRICS, seed_metrics)
            study.tell(optuna_trial, objective(self._spec.search.metric, seed_metrics.values()))
        elif 'crashed' in statuses:
            optuna_trial.set_user_attr(OUTCOME, 'crashed')
            study.tell(optuna_trial, state=optuna.trial.TrialState.FAIL)
        else:  # interrupted: fail it and queue the same configuration for the rerun
            study.tell(optuna_trial, state=optuna.trial.TrialState.FAIL)
            frozen = next(t for t in study.get_trials(deepcopy=False)
                          if t.number == optuna_trial.number)
            optuna.storages.RetryFailedTrialCallback(max_retry=None)(study, frozen)

    def _run_seeds(self, label, params):
        """{seed: Outcome} for the seeds run, stopping at the first crash or interrupt."""
        bindings = self._base_bindings + tuple(naming.bindings_for(params))
        try:
            config = validate.trial_config(self._gin_files, bindings)
        except UserError as error:
            self._echo(f'FAILED {label}: {error}')
            return {self._spec.seeds[0]: trial.Outcome('crashed', detail=str(error))}
        outcomes = {}
        for seed in self._spec.seeds:
            one = trial.Trial(label=label, params=params, seed=seed, bindings=bindings,
                              root_dir=trial.trial_dir(self._sweep_dir, label, seed),
                              config=config)
            outcomes[seed] = self._launcher.run(one)
            if outcomes[seed].status not in ('finished', 'skipped'):
                break
        return outcomes


def objective(metric, seed_metrics):
    """The seeds' mean of metric; an unreached steps_to_target counts as the env steps run."""
    values = []
    for metrics in seed_metrics:
        value = metrics.get(metric)
        values.append(float(metrics['env_steps'] if value is None else value))
    return sum(values) / len(values)


def run(spec, gin_files, base_bindings, sweep_dir, launcher, workers, url, *, echo=print):
    """Runs `workers` Worker loops against the study at `url` until num_trials are done."""
    open_study(spec, url)  # fail fast, in one line, on a bad URL
    lock = threading.Lock()

    def open_fn():
        with lock:
            return open_study(spec, url)

    jobs = [Worker(spec, gin_files, base_bindings, sweep_dir, launcher, open_fn, echo=echo)
            for _ in range(max(1, workers))]
    executor.run_jobs(jobs, workers, launcher)


def collect(spec, url, sweep_dir):
    """Per-configuration results of the study's COMPLETE trials, best first.

    Metrics come from the study, so trials run on other machines are included;
    run dirs are looked up locally (curves and HParams only exist for those).
    """
    import optuna

    study, _ = open_study(spec, url)
    complete = [t for t in study.get_trials(deepcopy=False)
                if t.state == optuna.trial.TrialState.COMPLETE and SEED_METRICS in t.user_attrs]
    complete.sort(key=lambda t: t.value, reverse=spec.search.direction == 'maximize')
    by_label = {}
    for optuna_trial in complete:
        label = optuna_trial.user_attrs[CONFIG]
        if label in by_label:
            continue  # the sampler proposed a configuration again; its runs were reused
        result = results.ConfigResult(label, params_of(spec.search, optuna_trial.params),
                                      num_seeds=len(spec.seeds))
        for seed, metrics in optuna_trial.user_attrs[SEED_METRICS].items():
            root_dir = trial.trial_dir(sweep_dir, label, int(seed))
            result.runs.append(results.SeedRun(int(seed), metrics, root_dir))
        by_label[label] = result
    return list(by_label.values())


class _Heartbeat:
    """Records a trial's heartbeat now and every interval until the block ends.

    Study.optimize does this itself; the ask/tell loop here has to (the first
    beat is immediate, so a worker killed right after asking leaves a stale,
    retryable trial rather than one RUNNING forever).
    """

    def __init__(self, storage, trial_id, interval_s):
        self._storage = storage
        self._trial_id = trial_id
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name='sweep-heartbeat')

    def __enter__(self):
        self._storage.record_heartbeat(self._trial_id)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _beat(self):
        while not self._stop.wait(self._interval_s):
            try:
                self._storage.record_heartbeat(self._trial_id)
            except Exception:  # a database hiccup: the next beat may succeed
                pass


def _choice_keys(param):
    if all(value is None or isinstance(value, (bool, int, float, str))
           for value in param.choices):
        return list(param.choices)
    return [naming.gin_literal(value, param.key) for value in param.choices]


def _engine_kwargs(url):
    # SQLite locks the whole file per write; wait for it instead of failing at once.
    return {'connect_args': {'timeout': 60}} if url.startswith('sqlite') else {}


def _quiet_optuna():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings('ignore', category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings('ignore', message='.*[Hh]eartbeat.*')


def _first_line(error):
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
