"""The experiment's parameters are checked when the config is built, before anything else."""

import gin
import pytest

import experiment.registry  # noqa: F401  (registers every configurable)
from core.errors import UserError
from experiment import config


@pytest.fixture
def bind():
    def parse(*bindings):
        gin.clear_config()
        gin.parse_config(['run.make_agent = @dqn.make_agent', *bindings])
        return config.load(config.RunConfig)

    yield parse
    gin.clear_config()


def test_defaults_are_a_valid_run(bind):
    run = bind()
    assert run.num_env_steps == 50_000 and run.replay_ratio == 1.0
    assert run.replay_backend.__name__ == 'UniformReplay'


@pytest.mark.parametrize('binding, message', [
    ("run.num_env_steps = 'many'", "run.num_env_steps must be a positive whole number, "
                                   "got 'many'"),
    ('run.eval_interval = -1', 'run.eval_interval must be a whole number >= 0'),
    ('run.batch_size = 0', 'run.batch_size must be a positive whole number, got 0'),
    ('run.use_xla = 1', 'run.use_xla must be True or False'),
    ('run.logged_fraction = 1.5', 'run.logged_fraction must be a number in [0.0, 1.0]'),
    ('run.importance_beta_anneal_steps = 0', 'None or a whole number >= 1'),
    ('run.target_return = "high"', 'run.target_return must be None or a finite number'),
    ('run.stop_at_target_return = True', 'needs run.target_return'),
    ('run.initial_collect_steps = 8', 'is below run.batch_size=64'),
])
def test_a_bad_value_is_one_line_naming_the_binding(bind, binding, message):
    with pytest.raises(UserError) as error:
        bind(binding)
    assert message in str(error.value).splitlines()[0]


def test_offline_runs_need_a_dataset():
    gin.clear_config()
    gin.parse_config(['train_offline.make_agent = @cql_sac.make_agent'])
    try:
        with pytest.raises(UserError, match='binds no train_offline.dataset_dir'):
            config.load(config.OfflineConfig)
    finally:
        gin.clear_config()
