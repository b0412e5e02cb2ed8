"""The experiment's parameters are checked when the config is built, before anything else."""

import gin
import pytest

import app.registry  # noqa: F401  (registers every configurable)
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
    ('run.logged_fraction = 1.5', 'run.logged_fraction must be a number in [0, 1]'),
    ('run.importance_beta_anneal_steps = 0', 'None or a whole number >= 1'),
    ('run.target_return = "high"', 'run.target_return must be None or a finite number'),
    ('run.stop_at_target_return = True', 'needs run.target_return'),
    ('run.snapshot_collect_policy = True', 'set run.policy_snapshot_interval too'),
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


DQN = ['--gin_file=configs/dqn_cartpole.gin', '--gin_file=configs/testing/tiny.gin']
SAC = ['--gin_file=configs/sac_pendulum.gin', '--gin_file=configs/testing/tiny_sac.gin']


@pytest.mark.parametrize('config, binding, message', [
    (DQN, 'dqn.make_agent.gamma = 1.5', 'dqn.make_agent.gamma must be a number in (0, 1]'),
    (DQN, 'dqn.make_agent.fc_layer_params = (0,)', 'dqn.make_agent.fc_layer_params must be'),
    (DQN, 'dqn.make_agent.learning_rate = -1.0', 'dqn.make_agent.learning_rate must be a '
                                                 'number > 0'),
    (DQN, 'dqn.make_agent.epsilon_end = 2.0', 'dqn.make_agent.epsilon_end must be'),
    (DQN, 'make_env.num_envs = 0', 'make_env.num_envs must be a positive whole number'),
    (DQN, 'make_env.max_episode_steps = -5', 'make_env.max_episode_steps must be None or'),
    (SAC, "sac.make_agent.actor_learning_rate = 'fast'", 'sac.make_agent.actor_learning_rate'),
    (SAC, 'sac.make_agent.target_update_tau = 0.0', 'sac.make_agent.target_update_tau must'),
    (DQN + ['--gin_bindings=run.replay_backend = @PrioritizedReplay'],
     'PrioritizedReplay.alpha = -0.5', 'PrioritizedReplay.alpha must be a number >= 0'),
    (DQN + ['--gin_bindings=run.replay_backend = @ReverbUniformReplay'],
     'ReverbUniformReplay.flush_every = 0', 'ReverbUniformReplay.flush_every must be a positive'),
    (DQN + ['--gin_bindings=run.replay_backend = @ReverbUniformReplay'],
     'ReverbUniformReplay.chunk_length = 9', 'ReverbUniformReplay.chunk_length must be None or'),
])
def test_agent_and_env_values_are_checked_before_anything_is_built(tmp_path, config, binding,
                                                                   message):
    from app import cli

    with pytest.raises(UserError) as error:
        cli.train_main(config + [f'--gin_bindings={binding}', f'--root_dir={tmp_path / "r"}'])
    assert message in cli.one_line(error.value)


def test_a_start_that_failed_validation_does_not_block_the_corrected_command(tmp_path):
    from app import cli

    root = f'--root_dir={tmp_path / "r"}'
    with pytest.raises(UserError):
        cli.train_main(DQN + ['--gin_bindings=dqn.make_agent.gamma = 1.5', root])
    metrics = cli.train_main(DQN + ['--gin_bindings=run.num_env_steps = 96',
                                    '--gin_bindings=run.export_final_policy = False', root])
    assert metrics['env_steps'] == 96
