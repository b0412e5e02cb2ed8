"""A plain PyTorch SAC on Pendulum-v1, the peer the SAC issue compares against.

PyTorch is not in requirements.lock, so it runs in a venv of its own; `make
bench` measures it (in the SAC section) when told where that venv is:

    python3.11 -m venv /tmp/torchvenv
    /tmp/torchvenv/bin/pip install torch==2.13.0 'numpy<2' gymnasium
    make bench TORCH_PYTHON=/tmp/torchvenv/bin/python    # or, alone:
    taskset -c 0 /tmp/torchvenv/bin/python bench/pytorch_sac_peer.py

Same work per env step as bench/sac_speed.py: one env, 1 gradient step per
env step, batch 256, 256x256 actor and twin critics on (obs, action), Adam
3e-4 for actor, critics and temperature, tau 0.005 every step, gamma 0.99,
target entropy -0.5, 1,000 initial random steps, a numpy replay buffer of
100,000. The rate is timed between two env-step marks after warm-up, so
start-up cancels as in the process-level method. It is written the way
SB3 / CleanRL write SAC (one update per step, no compilation).
"""

import argparse
import time

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


def mlp(inputs, outputs):
    return nn.Sequential(nn.Linear(inputs, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, outputs))


class Actor(nn.Module):
    def __init__(self, obs_dim, act_dim, scale):
        super().__init__()
        self.net = mlp(obs_dim, 2 * act_dim)
        self.scale = scale

    def forward(self, obs):
        mean, log_std = self.net(obs).chunk(2, dim=-1)
        std = log_std.clamp(-20, 2).exp()
        noise = mean + std * torch.randn_like(mean)
        action = torch.tanh(noise)
        log_prob = (torch.distributions.Normal(mean, std).log_prob(noise)
                    - torch.log(1 - action.pow(2) + 1e-6)).sum(-1)
        return action * self.scale, log_prob


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--steps', type=int, default=8000)
    parser.add_argument('--mark', type=int, default=3000, help='env step where timing starts')
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    env = gym.make('Pendulum-v1')
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    scale = float(env.action_space.high[0])
    actor = Actor(obs_dim, act_dim, scale)
    critics = [mlp(obs_dim + act_dim, 1) for _ in range(2)]
    targets = [mlp(obs_dim + act_dim, 1) for _ in range(2)]
    for target, critic in zip(targets, critics):
        target.load_state_dict(critic.state_dict())
    log_alpha = torch.zeros(1, requires_grad=True)
    actor_opt = torch.optim.Adam(actor.parameters(), 3e-4)
    critic_opt = torch.optim.Adam([p for c in critics for p in c.parameters()], 3e-4)
    alpha_opt = torch.optim.Adam([log_alpha], 3e-4)
    capacity = 100_000
    buf = {k: np.zeros((capacity, d), np.float32) for k, d in
           (('obs', obs_dim), ('act', act_dim), ('rew', 1), ('next', obs_dim), ('done', 1))}
    size = 0
    obs, _ = env.reset(seed=0)
    started = None
    for step in range(args.steps):
        if step == args.mark:
            started = time.perf_counter()
        if step < 1000:
            action = env.action_space.sample()
        else:
            with torch.no_grad():
                action = actor(torch.as_tensor(obs)[None])[0][0].numpy()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        i = step % capacity
        buf['obs'][i], buf['act'][i], buf['rew'][i] = obs, action, reward
        buf['next'][i], buf['done'][i] = next_obs, float(terminated)
        size = min(size + 1, capacity)
        obs = env.reset()[0] if terminated or truncated else next_obs
        if step < 1000:
            continue
        idx = np.random.randint(0, size, 256)
        o, a, r, n, d = (torch.as_tensor(buf[k][idx])
                         for k in ('obs', 'act', 'rew', 'next', 'done'))
        alpha = log_alpha.exp().detach()
        with torch.no_grad():
            next_a, next_logp = actor(n)
            na = torch.cat([n, next_a], -1)
            target_q = torch.min(targets[0](na), targets[1](na)) - alpha * next_logp[:, None]
            y = r + 0.99 * (1 - d) * target_q
        oa = torch.cat([o, a], -1)
        critic_loss = sum(F.mse_loss(c(oa), y) for c in critics)
        critic_opt.zero_grad()
        critic_loss.backward()
        critic_opt.step()
        new_a, logp = actor(o)
        oa_new = torch.cat([o, new_a], -1)
        q = torch.min(critics[0](oa_new), critics[1](oa_new))
        actor_loss = (alpha * logp[:, None] - q).mean()
        actor_opt.zero_grad()
        actor_loss.backward()
        actor_opt.step()
        alpha_loss = -(log_alpha * (logp.detach() - 0.5)).mean()
        alpha_opt.zero_grad()
        alpha_loss.backward()
        alpha_opt.step()
        with torch.no_grad():
            for target, critic in zip(targets, critics):
                for tp, p in zip(target.parameters(), critic.parameters()):
                    tp.mul_(0.995).add_(p, alpha=0.005)
    elapsed = time.perf_counter() - started
    print(f'pytorch SAC: {args.steps - args.mark} env steps (1 gradient step each) in '
          f'{elapsed:.1f} s = {(args.steps - args.mark) / elapsed:.1f} env steps/s '
          f'(torch {torch.__version__}, 1 thread)')


if __name__ == '__main__':
    main()
