"""CQL-SAC learns the same from a converted Minari dataset as from our own of the same episodes.

One step stream, written twice: random play on Pendulum-v1 (100 seeded episodes, 20,100
RLDS steps) is recorded by Minari's own DataCollector and, step by step, by our RLDS
writer (EpisodeRecorder + write_dataset, as make_dataset.py writes). The Minari dataset is
converted with `make_dataset.py --from_minari`; the two RLDS datasets must hold identical
steps, and CQL-SAC (configs/cql_sac_pendulum_offline.gin, seed 0, 10k gradient steps as
tests/learning/test_cql_offline.py) trained on each must reach the same final return
(within noise) on the same 50 seeded episodes, and beat the behaviour policy by 100.
"""

import os
import subprocess
import sys
import warnings

import gymnasium as gym
import minari
import numpy as np
import pytest
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory as trajectory_lib

from app import cli
from experiment.evaluation import compare_policies
from rlds_io.episodes import EpisodeRecorder
from rlds_io.files import write_dataset
from rlds_io.minari_io import space_spec
from tests.smoke.test_train import ROOT
from tests.unit.test_minari_io import assert_nests_equal, rlds_episodes

NUM_EPISODES = 100
# Same seed, same steps, seeded initializers: the runs are expected to match exactly; the
# tolerance allows float-level drift, which can flip an episode or two between swing-up and
# failure (~27 each on 50 episodes); two unseeded runs of one seed differ by ~90.
TOLERANCE = 40.0


def _row(step_type, observation, action, next_step_type, reward, discount):
    batch = lambda x, dtype=None: np.asarray(x, dtype)[None]  # noqa: E731
    return trajectory_lib.Trajectory(
        step_type=batch(step_type, np.int32), observation=batch(observation, np.float32),
        action=batch(action, np.float32), policy_info=(),
        next_step_type=batch(next_step_type, np.int32), reward=batch(reward, np.float32),
        discount=batch(discount, np.float32))


def record_twice(dataset_id, rlds_dir, seed=0):
    """Random Pendulum play recorded by DataCollector and by our RLDS writer at once."""
    collector = minari.DataCollector(gym.make('Pendulum-v1'))
    recorder = EpisodeRecorder(num_envs=1)
    rng = np.random.default_rng(seed)
    episodes = []
    for episode in range(NUM_EPISODES):
        observation, _ = collector.reset(seed=seed + episode)
        step_type, done = ts.StepType.FIRST, False
        while not done:
            action = rng.uniform(-2.0, 2.0, (1,)).astype(np.float32)
            next_observation, reward, terminated, truncated, _ = collector.step(action)
            done = terminated or truncated
            next_step_type = ts.StepType.LAST if done else ts.StepType.MID
            recorder.add(_row(step_type, observation, action, next_step_type, reward,
                              0.0 if terminated else 1.0))
            observation, step_type = next_observation, next_step_type
        # The episode's last step: its final observation; no action follows it.
        recorder.add(_row(ts.StepType.LAST, observation, np.zeros(1), ts.StepType.FIRST, 0, 1))
        episodes.extend(recorder.pop_complete())
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # author, email, permalink unset
        collector.create_dataset(dataset_id, algorithm_name='uniform random actions')
    space = collector.observation_space, collector.action_space
    collector.close()
    return write_dataset(rlds_dir, episodes, observation_spec=space_spec(space[0]),
                         action_spec=space_spec(space[1]),
                         metadata={'kind': 'random', 'env_id': 'Pendulum-v1'})


# train.py, with Keras' initializers seeded too: `--seed` seeds TF's global RNG, which Keras
# 2.15's unseeded initializers ignore (they draw from Python's `random`), so two train.py
# runs of one seed start from different weights and end ~90 apart here. Seeded, a run is
# reproduced bit for bit, and what is left to differ is the data.
TRAIN = """
import sys, tensorflow as tf
tf.keras.utils.set_random_seed(0)
from app.cli import run_cli, train_main
sys.exit(run_cli(train_main))
"""


def train_cql(dataset_dir, root_dir):
    """One CQL-SAC run (seed 0, 10k gradient steps) in its own process."""
    subprocess.run([sys.executable, '-c', TRAIN,
                    '--gin_file=configs/cql_sac_pendulum_offline.gin',
                    f'--root_dir={root_dir}', '--seed=0',
                    f'--gin_bindings=train_offline.dataset_dir="{dataset_dir}"',
                    '--gin_bindings=train_offline.num_train_steps=10000',
                    '--gin_bindings=train_offline.eval_interval=2500'],
                   cwd=ROOT, check=True, timeout=1800)


@pytest.mark.slow
def test_cql_learns_the_same_from_a_converted_minari_dataset(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv('MINARI_DATASETS_PATH', str(tmp_path / 'minari'))
    ours, converted = str(tmp_path / 'ours'), str(tmp_path / 'converted')
    behaviour = record_twice('test/pendulum-random-v0', ours)['average_return']
    cli.make_dataset_main(['--from_minari=test/pendulum-random-v0', f'--output_dir={converted}'])
    ours_steps, converted_steps = rlds_episodes(ours), rlds_episodes(converted)
    assert len(ours_steps) == len(converted_steps) == NUM_EPISODES
    for a, b in zip(ours_steps, converted_steps):
        assert_nests_equal(a, b)

    runs = {name: str(tmp_path / f'cql_{name}') for name in ('ours', 'converted')}
    for name, dataset in (('ours', ours), ('converted', converted)):
        train_cql(dataset, runs[name])
    compared = compare_policies([os.path.join(runs['ours'], 'policy'),
                                 os.path.join(runs['converted'], 'policy')],
                                env_id='Pendulum-v1', episodes=50, seed=123)
    ours_mean, converted_mean = (report['mean'] for report in compared['policies'])
    print(f"behaviour {behaviour:.1f}; CQL-SAC final, same 50 episodes: ours "
          f"{ours_mean:.1f}, converted {converted_mean:.1f}")
    assert abs(ours_mean - converted_mean) <= TOLERANCE, compared['differences']
    assert min(ours_mean, converted_mean) >= behaviour + 100, (behaviour, compared)
