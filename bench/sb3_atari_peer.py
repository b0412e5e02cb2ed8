"""Stable-Baselines3's DQN on an Atari game, the peer bench/atari_speed.py compares against.

SB3 needs torch, which requirements.lock does not carry: it runs in a venv of its own,

    python3.11 -m venv /tmp/sb3venv
    /tmp/sb3venv/bin/pip install torch==2.13.0 'numpy<2' gymnasium stable-baselines3 \\
        ale-py==0.12.1 opencv-python-headless==4.11.0.86
    make bench ARGS='--only atari_speed' SB3_PYTHON=/tmp/sb3venv/bin/python

Same work per env step as ours (configs/dqn_atari.gin as bench/atari_speed.py binds it): one
env, Nature CNN, 4-frame stacks of 84x84 grayscale frames with frame skip 4 and sticky actions
0.25, one gradient step of batch 32 every 4 env steps, Adam 6.25e-5 (eps 1.5e-4), Huber loss,
target network copied every 8,000 env steps, replay of 100,000 transitions stored as uint8
stacks with `optimize_memory_usage` (SB3's smallest layout). The rate is timed between two
env-step marks after the warm-up, so start-up cancels.
"""

import argparse
import json
import time

import ale_py
import gymnasium as gym
import torch
from stable_baselines3 import DQN
from stable_baselines3.common.atari_wrappers import AtariWrapper
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack


class Marks(BaseCallback):
    """Records the wall time at two env-step marks."""

    def __init__(self, start, stop):
        super().__init__()
        self.start, self.stop, self.times = start, stop, {}

    def _on_step(self):
        for mark in (self.start, self.stop):
            if self.num_timesteps == mark:
                self.times[mark] = time.perf_counter()
        return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--game', default='ALE/Pong-v5')
    parser.add_argument('--warmup', type=int, default=3_000)
    parser.add_argument('--steps', type=int, default=10_000)
    parser.add_argument('--threads', type=int, default=1)
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    gym.register_envs(ale_py)

    def make():
        env = gym.make(opts.game, frameskip=1, repeat_action_probability=0.25)
        return AtariWrapper(env, noop_max=30, frame_skip=4, screen_size=84,
                            terminal_on_life_loss=False, clip_reward=True)

    env = VecFrameStack(DummyVecEnv([make]), 4)
    model = DQN('CnnPolicy', env, learning_rate=6.25e-5, buffer_size=100_000,
                learning_starts=1_000, batch_size=32, train_freq=4, gradient_steps=1,
                target_update_interval=8_000, exploration_fraction=0.1,
                exploration_final_eps=0.01, optimize_memory_usage=True,
                replay_buffer_kwargs={'handle_timeout_termination': False},
                policy_kwargs={'optimizer_kwargs': {'eps': 1.5e-4}}, seed=0, device='cpu')
    marks = Marks(opts.warmup, opts.warmup + opts.steps)
    model.learn(total_timesteps=opts.warmup + opts.steps + 1, callback=marks)
    seconds = marks.times[marks.stop] - marks.times[marks.start]
    result = {'rate': opts.steps / seconds, 'steps': opts.steps, 'seconds': seconds,
              'torch': torch.__version__}
    print('RESULT ' + json.dumps(result))  # the line bench/atari_speed.py reads


if __name__ == '__main__':
    main()
