"""CQL-SAC against plain SAC offline and the behaviour policy, on the same dataset and episodes.

    python -m reports.offline_hopper --runs runs/offline_hopper --dataset data/hopper_medium

--runs holds `cql_s<N>` (configs/cql_sac_hopper_offline.gin) and `sac_s<N>`
(configs/sac_hopper_offline.gin) run directories, trained on --dataset (made by
configs/datasets/hopper_medium.gin). For every seed with both runs finished, the
behaviour snapshot that made the dataset, plain SAC's final policy and CQL-SAC's final
policy play the same --episodes seeded episodes (evaluate.py's comparison). Final
policies, not the best ones: picking a checkpoint by its evaluation return would use the
environment, which an offline method may not. The behaviour policy is the one that collected the
dataset: the snapshot's greedy or collect policy (collection.json's behaviour_policy) with the
dataset's action noise, played on the same episodes; the bar
(issue #15: CQL-SAC above both the behaviour policy and offline SAC by >= 20% of the behaviour
return) is taken against it. The snapshot's greedy (noise-free) return and CQL-SAC's margin over
it are shown beside it: the stricter reading, since acting greedily is itself an improvement on
a noisy behaviour policy.
Writes docs/offline_hopper.md. The compared seeds and the dataset's description are also kept
in docs/data/offline_hopper_runs.json, so seeds compared earlier, on
another machine or before their run directories were lost, stay in the table as long as the
dataset is the same one (same behaviour snapshot and size).
"""

import argparse
import datetime
import json
import os
import re

from core import rundir
from core.quiet import quiet_startup

MARGIN = 0.2  # of the behaviour return
ARCHIVE = os.path.join('docs', 'data', 'offline_hopper_runs.json')


def _same_dataset(a, b):
    return all(a.get(key) == b.get(key) for key in ('source', 'num_steps',
                                                      'action_noise_stddev',
                                                      'behaviour_policy'))


def archived_rows(path, metadata):
    """The seeds compared before on this dataset (none when the dataset has changed)."""
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        archive = json.load(f)
    return archive['rows'] if _same_dataset(archive['dataset'], metadata) else []


def save_archive(path, rows, metadata, command):
    payload = {'generated_by': command, 'dataset': metadata, 'rows': rows}
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    rundir.atomic_write_text(path, json.dumps(payload, indent=1) + '\n')


def _finished(run_dir):
    path = os.path.join(run_dir, 'metrics.json')
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        metrics = json.load(f)
    return None if metrics.get('interrupted') else metrics


def find_seeds(runs_dir):
    """{seed: {'cql': dir, 'sac': dir}} of the run directories under runs_dir."""
    seeds = {}
    for name in sorted(os.listdir(runs_dir)):
        found = re.fullmatch(r'(cql|sac)_s(\d+)', name)
        if found and os.path.isdir(os.path.join(runs_dir, name)):
            seeds.setdefault(int(found.group(2)), {})[found.group(1)] = os.path.join(runs_dir, name)
    return seeds


def behaviour_snapshot(dataset_dir):
    """(policy dir, dataset metadata) of a 'medium' dataset's behaviour snapshot."""
    with open(os.path.join(dataset_dir, 'collection.json')) as f:
        metadata = json.load(f)
    return metadata['source'].split(' (')[0], metadata


def behaviour_return(snapshot, metadata, episodes, eval_seed):
    """Mean return of the snapshot acting as it did for the dataset (its policy and noise)."""
    import numpy as np

    from envs.suite import make_env
    from experiment.evaluation import play_episodes, saved_actor
    from rlds_io.behaviour import BehaviourPolicy, snapshot_policy_dir
    env = make_env(metadata['env_id'], num_envs=episodes, seed=eval_seed)
    policy_dir = snapshot_policy_dir(snapshot, metadata.get('behaviour_policy') or 'greedy')
    try:
        act = BehaviourPolicy(env.action_spec(), saved_actor(policy_dir),
                              action_noise_stddev=metadata['action_noise_stddev'],
                              seed=eval_seed)
        returns, _ = play_episodes(env, act, seed=eval_seed)
    finally:
        env.close()
    return float(np.mean(returns))


def compare_seed(seed, runs, snapshot, metadata, episodes, eval_seed):
    from experiment.evaluation import compare_policies
    env_id = metadata['env_id']
    result = compare_policies([snapshot, os.path.join(runs['sac'], 'policy'),
                               os.path.join(runs['cql'], 'policy')],
                              env_id=env_id, episodes=episodes, seed=eval_seed)
    greedy, sac, cql = (report['mean'] for report in result['policies'])
    behaviour = behaviour_return(snapshot, metadata, episodes, eval_seed)
    return {'seed': seed, 'behaviour': behaviour, 'snapshot': greedy, 'sac': sac, 'cql': cql,
            'cql_minus_snapshot_ci95': result['differences'][1]['ci95'],
            'cql_metrics': _finished(runs['cql']), 'sac_metrics': _finished(runs['sac'])}


def _played_by(metadata):
    if (metadata.get('behaviour_policy') or 'greedy') == 'collect':
        how = "its stochastic collect policy (the SAC policy's own sampling, as D4RL's medium)"
    else:
        how = 'its greedy policy'
    noise = metadata['action_noise_stddev']
    return how + (f' with action noise {noise}' if noise else '')


def markdown(rows, pending, metadata, episodes, eval_seed, command):
    data_return = metadata['average_return']
    lines = ['# CQL-SAC offline on a Hopper-v5 "medium" dataset', '',
             f'Generated by `{command}` on {datetime.date.today().isoformat()}; do not edit by '
             f"hand. Dataset: {metadata['num_steps']:,} steps in {metadata['num_episodes']:,} "
             f"episodes played by the snapshot `{metadata['source']}`, {_played_by(metadata)} "
             f'(average return {data_return:,.1f}). Every '
             f'policy below plays the same {episodes} seeded episodes (seed {eval_seed}); final '
             'policies of each run. Behaviour policy = the snapshot acting as it collected the '
             'data, on these episodes. Bar: CQL-SAC above both the '
             f'behaviour policy and offline SAC by >= {MARGIN:.0%} of the behaviour return. The '
             "greedy snapshot (the same snapshot's mean action, no noise) is the stricter "
             'reference.', '',
             '| seed | behaviour policy | offline SAC | CQL-SAC | margin over the better of the '
             'two | bar met | greedy snapshot | CQL-SAC − greedy snapshot, paired (95% CI) | '
             'margin over the greedy snapshot | CQL wall time (grad steps/s) |',
             '| ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |']
    for row in rows:
        behaviour = row['behaviour']
        margin = (row['cql'] - max(behaviour, row['sac'])) / behaviour
        strict = (row['cql'] - max(row['snapshot'], row['sac'])) / row['snapshot']
        low, high = row['cql_minus_snapshot_ci95']
        cql = row['cql_metrics'] or {}
        wall = (f"{cql['wall_time_s'] / 3600:.2f} h ({cql['train_steps_per_sec']:.0f})"
                if cql.get('wall_time_s') else '—')
        lines.append(f"| {row['seed']} | {behaviour:,.1f} | {row['sac']:,.1f} | "
                     f"{row['cql']:,.1f} | {margin:+.0%} | {'yes' if margin >= MARGIN else 'no'} "
                     f"| {row['snapshot']:,.1f} | {low:+,.0f} to {high:+,.0f} | {strict:+.0%} | "
                     f"{wall} |")
    for seed in pending:
        lines.append(f'| {seed} | in progress | | | | | | | | |')
    return '\n'.join(lines) + '\n'


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--runs', default='runs/offline_hopper')
    parser.add_argument('--dataset', default='data/hopper_medium')
    parser.add_argument('--episodes', type=int, default=100)
    parser.add_argument('--seed', type=int, default=1000, help='the evaluation episodes\' seed')
    parser.add_argument('--output', default='docs/offline_hopper.md')
    parser.add_argument('--archive', default=ARCHIVE)
    opts = parser.parse_args(argv)
    quiet_startup()
    if os.path.isdir(opts.dataset):
        snapshot, metadata = behaviour_snapshot(opts.dataset)
    elif os.path.isfile(opts.archive):  # the dataset is gone: the table from the archive
        with open(opts.archive) as f:
            metadata = json.load(f)['dataset']
        snapshot = None
    else:
        raise SystemExit(f'no dataset at {opts.dataset} and no archive at {opts.archive}: make '
                         'the dataset first (docs/offline_rl.md)')
    fresh, pending = [], []
    for seed, runs in sorted((find_seeds(opts.runs) if os.path.isdir(opts.runs) else {}).items()):
        if snapshot and set(runs) == {'cql', 'sac'} and all(map(_finished, runs.values())):
            fresh.append(compare_seed(seed, runs, snapshot, metadata, opts.episodes, opts.seed))
        else:
            pending.append(seed)
    command = (f'python -m reports.offline_hopper --runs {opts.runs} --dataset {opts.dataset}'
               + (f' --episodes {opts.episodes}' if opts.episodes != 100 else ''))
    by_seed = {row['seed']: row for row in archived_rows(opts.archive, metadata)}
    by_seed.update({row['seed']: row for row in fresh})
    rows = [by_seed[seed] for seed in sorted(by_seed)]
    pending = [seed for seed in pending if seed not in by_seed]
    save_archive(opts.archive, rows, metadata, command)
    text = markdown(rows, pending, metadata, opts.episodes, opts.seed, command)
    rundir.atomic_write_text(opts.output, text)
    print(text)


if __name__ == '__main__':
    main()
