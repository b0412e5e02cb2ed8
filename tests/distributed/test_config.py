"""Refused before anything starts: deadlocking rate limits, unbounded waits, exposed servers."""

import dataclasses
import os

import gin
import pytest

from app import cli
from core.errors import UserError
from experiment.distributed import config, net

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = 'configs/sac_pendulum_distributed.gin'
SERVER_HOLDS = 'distributed.settings.learner_holds_replay = False'


@pytest.fixture
def parse():
    """Parses the distributed config plus bindings; returns (settings, run params)."""
    os.chdir(ROOT)

    def parse_with(*bindings):
        # The replay on the server, as before the config let the learner hold it (the
        # tests that want a learner holding it bind it again).
        cli.load_gin_config([CONFIG], [SERVER_HOLDS, *bindings])
        return config.settings(), config.run_params()

    yield parse_with
    gin.clear_config()


def test_the_config_derives_the_single_process_replay_ratio(parse):
    settings, params = parse()
    assert settings.samples_per_insert == 256  # batch 256 x 64 gradient / 64 env steps
    assert settings.min_size_to_sample == params.initial_collect_steps == 1000
    assert settings.learner_steps_per_call == 64 and settings.error_buffer == 32768
    config.validate(settings, params)
    assert config.max_train_steps(params) == 19_000


def test_the_other_roles_give_way_to_the_learner_where_a_config_says_so(parse):
    assert parse()[0].other_roles_niceness == 19  # the SAC config, learner-bound
    assert parse('distributed.settings.other_roles_niceness = 0')[0].other_roles_niceness == 0
    cli.load_gin_config(['configs/dqn_cartpole.gin'], [])
    assert config.settings().other_roles_niceness == 0  # the default
    cli.load_gin_config(['configs/dqn_atari_distributed.gin'], [])
    settings, params = config.settings(), config.run_params()
    # Pong's learner sets the pace: two TF threads for it, the other roles niced.
    assert (settings.other_roles_niceness, settings.learner_tf_threads) == (19, 2)
    assert settings.samples_per_insert == 8 and params.frame_stack == 4
    config.validate(settings, params)


@pytest.mark.parametrize('binding, message', [
    ('distributed.settings.error_buffer = 100', 'deadlock'),
    ('distributed.settings.min_size_to_sample = 200000', 'wait forever'),
    ('distributed.settings.min_size_to_sample = 0', 'empty table'),
    ('distributed.settings.min_size_to_sample = 100', 'below run.batch_size'),
    ('distributed.settings.samples_per_insert = 0', 'must be > 0'),
    ('distributed.settings.timeout_s = 0', r'timeout_s must be a number > 0, got 0'),
    ('distributed.settings.give_up_after_s = 1e400', 'got inf'),  # Gin reads inf
    ("distributed.settings.weight_pull_interval = 'often'", 'must be a positive whole number'),
    ('distributed.settings.flush_every = 2.5', 'flush_every must be a positive whole number'),
    ('distributed.settings.give_up_after_s = 20', 'three tries'),
    ('distributed.settings.replay_shards = 0', 'replay_shards must be a positive whole number'),
    ('distributed.settings.learner_tf_threads = 0',
     'learner_tf_threads must be None or a whole number >= 1'),
    ('distributed.settings.other_roles_niceness = -5', 'from 0 to 19 .a lower niceness needs root'),
    ('distributed.settings.other_roles_niceness = 20', 'from 0 to 19'),
    ('distributed.settings.other_roles_niceness = None', 'from 0 to 19'),
])
def test_settings_that_would_hang_are_refused(parse, binding, message):
    with pytest.raises(UserError, match=message):
        config.validate(*parse(binding))


def test_the_learner_has_its_own_thread_count(parse):
    settings, params = parse('run.tf_threads = 3', 'distributed.settings.learner_tf_threads = None')
    assert settings.learner_tf_threads == 3  # None: the run's own
    settings, params = parse()
    assert settings.learner_tf_threads == 2  # sac_pendulum_distributed.gin's
    settings, params = parse('distributed.settings.learner_tf_threads = 2')
    assert (settings.learner_tf_threads, params.tf_threads) == (2, 1)


def test_a_learner_holding_the_replay_gets_a_queue_sized_by_the_error_buffer(parse):
    settings, params = parse('distributed.settings.learner_holds_replay = True')
    config.validate(settings, params)
    # sac_pendulum_distributed.gin: error_buffer 32,768 / 256 samples per window = 128 windows.
    assert settings.queue_length == 128
    assert config.windows_per_drain(settings, params) == 64  # 64 steps x 256 / 256
    limiter = config.rate_limiter(settings)
    assert 'Queue' in type(limiter).__name__
    # The server holding the replay: no queue.
    settings, _ = parse()
    assert not settings.learner_holds_replay and settings.queue_length == 0
    settings, params = parse('distributed.settings.learner_holds_replay = True',
                             'distributed.settings.replay_shards = 2')
    with pytest.raises(UserError, match='nothing to shard: set replay_shards=1'):
        config.validate(settings, params)


def test_shards_keep_the_ratio_over_the_whole_buffer(parse):
    settings, params = parse('distributed.settings.replay_shards = 4')
    config.validate(settings, params)
    # Each shard only waits for its share of the minimum size...
    assert settings.shard_min_size() == 250
    assert 'MinSize' in type(config.rate_limiter(settings)).__name__
    # ...and the ratio is Reverb's rule over the summed counters: diff = inserted x 256 -
    # sampled within 256 x 1000 (the minimum size's offset) -/+ 32,768.
    from experiment.distributed import tier
    gate = tier.RatioGate(settings)
    offset = 256 * 1000
    assert (gate.min_diff, gate.max_diff) == (offset - 32_768, offset + 32_768)
    # Filling the minimum:
    assert gate.inserts_allowed({'inserted': 1000, 'sampled': 0, 'shards_down': 0})
    assert gate.samples_allowed(inserted=1000, sampled=0) == 32_768
    assert gate.samples_allowed(inserted=2000, sampled=300_000) < 0  # the learner waits
    assert gate.inserts_allowed({'inserted': 2128, 'sampled': 256_000, 'shards_down': 0})
    # Collectors wait:
    assert not gate.inserts_allowed({'inserted': 2129, 'sampled': 256_000, 'shards_down': 0})
    # Never both: both sides read the same counters, and min_diff < max_diff.
    for inserted, sampled in [(2000, 200_000), (2000, 300_000), (3000, 256_000), (1000, 0)]:
        assert gate.samples_allowed(inserted, sampled) >= 0 or gate.inserts_allowed(
            {'inserted': inserted, 'sampled': sampled, 'shards_down': 0})
    # While a shard is down each process counts it with its own last reading, so only the
    # learner keeps the ratio: collectors write on however far ahead they seem.
    assert gate.inserts_allowed({'inserted': 2129, 'sampled': 256_000, 'shards_down': 1})
    with pytest.raises(UserError, match='fewer than run.batch_size'):
        config.validate(settings, dataclasses.replace(params, replay_capacity=1000))


def test_the_shard_addresses_must_match_the_shard_count():
    from experiment.distributed import tier

    assert tier.parse_addresses('a:1, b:2', 2) == ['a:1', 'b:2']
    with pytest.raises(UserError, match=r'names 1 replay server\(s\) but .*replay_shards=2'):
        tier.parse_addresses('a:1', 2)
    with pytest.raises(UserError, match='is not HOST:PORT'):
        tier.parse_addresses('a:1,b', 2)


def test_reverb_agrees_that_the_accepted_limiter_is_valid(parse):
    settings, _ = parse()
    limiter = config.rate_limiter(settings)  # Reverb raises on an error buffer it rejects
    assert limiter is not None


def test_the_replay_server_is_not_exposed_without_the_flag(monkeypatch):
    with pytest.raises(UserError, match='not loopback'):
        net.check_replay_exposure('0.0.0.0', bind_all_interfaces=False)
    monkeypatch.setattr(net, 'exposed_interfaces', lambda: ['eth0'])
    with pytest.raises(UserError, match=r'always listens on every\s+interface.*eth0'):
        net.check_replay_exposure('localhost', bind_all_interfaces=False)
    net.check_replay_exposure('0.0.0.0', bind_all_interfaces=True)
    monkeypatch.setattr(net, 'exposed_interfaces', lambda: [])
    net.check_replay_exposure('127.0.0.1', bind_all_interfaces=False)
    net.check_replay_exposure('::1', bind_all_interfaces=False)


def test_addresses_are_checked():
    assert net.parse_address('localhost:8000') == ('localhost', 8000)
    assert net.parse_address('[::1]:8000') == ('::1', 8000)
    for bad in ('localhost', ':80', 'host:port', 'host:70000', None):
        with pytest.raises(UserError, match='HOST:PORT'):
            net.parse_address(bad)


def test_a_role_without_an_address_is_refused(tmp_path):
    os.chdir(ROOT)
    try:
        with pytest.raises(UserError, match='needs --replay_address'):
            cli.train_main([f'--gin_file={CONFIG}', '--role=collect', f'--root_dir={tmp_path}'])
        with pytest.raises(UserError, match='replay only'):
            cli.train_main([f'--gin_file={CONFIG}', '--role=learn', '--replay_address=localhost:1',
                        '--bind_all_interfaces', f'--root_dir={tmp_path}'])
    finally:
        gin.clear_config()


class _RecurrentAgent:
    sequence_period = 40


class _FeedForwardAgent:
    sequence_period = None


def test_a_recurrent_agents_table_counts_sequences_and_never_holds_collectors(parse):
    settings, params = parse()
    config.validate(settings, params)
    assert config.for_agent(settings, _FeedForwardAgent()) is settings
    sequences = config.for_agent(settings, _RecurrentAgent())
    assert sequences.samples_per_insert == 256 * 40
    assert sequences.min_size_to_sample == 25  # 1,000 transitions / 40
    assert sequences.error_buffer >= 2 * sequences.samples_per_insert
    limiter = config.rate_limiter(sequences)
    # Reverb takes it; the learner's lower bound is SampleToInsertRatio's, inserts are free.
    offset = sequences.samples_per_insert * sequences.min_size_to_sample
    assert limiter._min_diff == offset - sequences.error_buffer  # noqa: SLF001
    assert limiter._max_diff > 1e300  # noqa: SLF001
    with pytest.raises(UserError, match='one replay server'):
        config.for_agent(dataclasses.replace(settings, replay_shards=2), _RecurrentAgent())
