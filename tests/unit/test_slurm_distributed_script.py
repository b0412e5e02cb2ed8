"""The batch script of `python -m app.slurm distributed --dry_run` and the srun steps it runs:
resources per role, placement, addresses from Slurm's environment, save-then-requeue, and the
supervisor's signalling through Slurm (no Slurm needed: nothing is submitted)."""

import os
import signal
import stat
import subprocess
import types

import pytest

from app import slurm_distributed, slurm_steps
from app.slurm_distributed import node_cores, placement
from app.slurm_steps import SrunStarter
from core.errors import UserError

CONFIG = 'configs/sac_pendulum_distributed.gin'
CPUS = dict(slurm_distributed.DEFAULT_CPUS)


def _dry_run(tmp_path, *flags):
    root = tmp_path / 'run'
    result = slurm_distributed.main([f'--gin_file={CONFIG}', f'--root_dir={root}',
                                     '--dry_run', *flags])
    path = result['script']
    assert path == str(root / 'slurm' / 'distributed.sbatch')
    return path, open(path).read()


def _sbatch(text):
    return [line[len('#SBATCH '):] for line in text.splitlines() if line.startswith('#SBATCH ')]


def test_the_script_asks_cores_per_role_and_runs_the_supervisor(tmp_path):
    path, text = _dry_run(tmp_path, '--collectors=2', '--replay_shards=2', '--time=2:00:00',
                          '--warning_s=90', '--gin_bindings=run.num_env_steps=20000')
    assert os.stat(path).st_mode & stat.S_IXUSR
    subprocess.run(['bash', '-n', path], check=True)  # valid bash
    options = _sbatch(text)
    # learner 2 + 2 shards + 2 collectors + evaluator, all on the one node.
    for option in ('--nodes=1', '--ntasks-per-node=1', '--cpus-per-task=7', '--time=2:00:00',
                   '--requeue', '--signal=B:USR1@90', '--open-mode=append',
                   f'--output={tmp_path}/run/slurm/distributed-%j.out'):
        assert option in options, (option, options)
    assert not any(option.startswith('--gpus') for option in options)
    assert 'node 0 (7 cores): replay_0 (1 core), replay_1 (1 core), learner (2 cores), ' \
        'collector_0 (1 core), collector_1 (1 core), eval (1 core)' in text
    # Addresses from Slurm's own environment, ports from the job id.
    assert 'hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)' in text
    assert 'port=$(( 20000 + 16 * (SLURM_JOB_ID % 1000) ))' in text
    command = next(line for line in text.splitlines() if 'app.slurm_distributed roles' in line)
    for part in (f'--gin_file={CONFIG}', '--gin_bindings=run.num_env_steps=20000',
                 '--gin_bindings=distributed.settings.replay_shards=2',
                 # the shards hold the replay, whatever the config says of the learner
                 '--gin_bindings=distributed.settings.learner_holds_replay=False',
                 '--collectors=2',
                 f'--root_dir={tmp_path}/run', '--learner_cpus=2', '--collector_cpus=1',
                 '--hosts="$hosts" --port="$port" &'):
        assert part in command, (part, command)
    # The supervisor runs under save-then-requeue: USR1 -> SIGTERM to it, then a requeue.
    assert "trap 'requeue=1;" in text and 'USR1' in text
    assert 'scontrol requeue "${task:-$SLURM_JOB_ID}"' in text
    assert text.index('hosts=$(') < text.index(command)


def test_role_cores_nodes_memory_gpus_and_fixed_ports(tmp_path):
    _, text = _dry_run(tmp_path, '--collectors=3', '--replay_shards=2', '--nodes=2',
                       '--learner_cpus=4', '--collector_cpus=2', '--mem=16G', '--gpus=1',
                       '--port=31000', '--partition=cpu', '--sbatch=--constraint=avx2')
    options = _sbatch(text)
    # node 0: replay_0 1 + learner 4 + collectors 0, 2 (2 x 2) + eval 1 = 10;
    # node 1: replay_1 1 + collector_1 2 = 3. Every node gets the busiest node's cores.
    for option in ('--nodes=2', '--ntasks=2', '--ntasks-per-node=1', '--cpus-per-task=10',
                   '--mem=16G', '--gpus-per-node=1', '--partition=cpu',
                   '--constraint=avx2'):
        assert option in options, (option, options)
    assert '#   node 1 (3 cores): replay_1 (1 core), collector_1 (2 cores)' in text
    assert 'port=31000' in text
    command = next(line for line in text.splitlines() if 'app.slurm_distributed roles' in line)
    assert '--mem_per_node_mb=16384' in command and '--learner_gpus=1' in command
    assert '--nodes=2' in command and '--learner_cpus=4' in command


@pytest.mark.parametrize('flags, message', [
    (['--cpus_per_task=4'], 'cores per role'),
    (['--learner_cpus=0'], '--learner_cpus must be >= 1'),
    (['--collectors=0'], '--collectors must be >= 1'),
    (['--nodes=2'], 'give each node a shard'),
    (['--replay_shards=2', '--nodes=3'], 'give each node a shard'),
    (['--mem=lots'], 'not a Slurm memory size'),
    (['--gin_bindings=distributed.settings.replay_shards=0'], 'replay_shards'),
])
def test_refused_before_anything_is_written(tmp_path, flags, message):
    with pytest.raises(UserError, match=message):
        _dry_run(tmp_path, *flags)
    assert not (tmp_path / 'run' / 'slurm').exists()


def test_a_missing_config_is_one_line(tmp_path):
    with pytest.raises(UserError, match='not found'):
        slurm_distributed.main(['--gin_file=configs/nope.gin', f'--root_dir={tmp_path}',
                                '--dry_run'])


def test_placement_puts_collectors_with_a_shard_and_the_learner_with_shard_0():
    roles = placement(nodes=2, shards=4, collectors=3, eval_role=True, cpus=CPUS)
    where = {name: node for name, _, _, node, _ in roles}
    assert [name for name, *_ in roles] == ['replay_0', 'replay_1', 'replay_2', 'replay_3',
                                            'learner', 'collector_0', 'collector_1',
                                            'collector_2', 'eval']
    assert where == {'replay_0': 0, 'replay_1': 1, 'replay_2': 0, 'replay_3': 1, 'learner': 0,
                     'collector_0': 0, 'collector_1': 1, 'collector_2': 0, 'eval': 0}
    assert node_cores(roles, 2) == [1 + 1 + 2 + 1 + 1 + 1, 1 + 1 + 1]
    one = placement(nodes=1, shards=1, collectors=1, eval_role=False, cpus=CPUS)
    assert [name for name, *_ in one] == ['replay', 'learner', 'collector_0']


def test_ports_are_stable_for_a_job_and_apart_between_jobs():
    assert slurm_distributed.job_ports(1234) == slurm_distributed.job_ports('1234') == \
        20000 + 16 * 234
    assert slurm_distributed.job_ports(1235) - slurm_distributed.job_ports(1234) == 16
    assert slurm_distributed.job_ports(1234, port=31000) == 31000


def _starter(monkeypatch, *, state='RUNNING', steps='7.0 replay_0\n7.1 learner\n7.2 eval\n'):
    calls = []

    def fake_slurm(args, timeout_s=30):
        del timeout_s
        calls.append(args)
        if args[0] == 'squeue' and '-s' in args:
            out = steps
        elif args[0] == 'squeue':
            out = state + '\n'
        else:
            out = ''
        return types.SimpleNamespace(returncode=0, stdout=out, stderr='')

    monkeypatch.setattr(slurm_steps, '_slurm', fake_slurm)
    roles = placement(nodes=2, shards=2, collectors=2, eval_role=True, cpus=CPUS)
    starter = SrunStarter(7, ['nodeA', 'nodeB'], roles, mem_per_cpu_mb=2048, learner_gpus=1,
                          say=lambda text: None)
    return starter, calls


class _Proc:
    def __init__(self):
        self.sent = []

    def kill(self):
        self.sent.append('kill')

    def send_signal(self, signum):
        self.sent.append(signum)


def test_srun_steps_on_their_nodes_with_their_cores(monkeypatch):
    starter, _ = _starter(monkeypatch)
    command = ['python', 'train.py', '--role=collect', '--collector_id=1']
    argv = starter.command('collector_1', command)
    assert argv == ['srun', '--ntasks=1', '--nodes=1', '--nodelist=nodeB', '--cpus-per-task=1',
                    '--exact', '--job-name=collector_1', '--mem-per-cpu=2048M', *command]
    learner = starter.command('learner', ['python', 'train.py', '--role=learn'])
    assert '--nodelist=nodeA' in learner and '--cpus-per-task=2' in learner
    assert '--gpus=1' in learner


def test_a_role_is_signalled_through_its_step_not_its_srun(monkeypatch):
    """srun turns SIGTERM into SIGKILL of its step: the role gets SIGINT via scancel."""
    starter, calls = _starter(monkeypatch)
    proc = _Proc()
    starter.send('learner', proc, signal.SIGINT)
    assert ['scancel', '--signal=INT', '7.1'] in calls and proc.sent == []
    starter.send('eval', proc, signal.SIGKILL)
    assert ['scancel', '--signal=KILL', '7.2'] in calls
    # A role whose step does not exist yet (srun waits for cores): its srun is killed.
    starter.send('collector_0', proc, signal.SIGINT)
    assert proc.sent == ['kill']


def test_nothing_more_is_sent_while_slurm_ends_the_job(monkeypatch):
    """scancel has already sent every role SIGTERM; a second signal would end it unsaved."""
    starter, calls = _starter(monkeypatch, state='COMPLETING')
    proc = _Proc()
    starter.send('learner', proc, signal.SIGINT)
    starter.send('learner', proc, signal.SIGKILL)
    assert not any(call[0] == 'scancel' for call in calls) and proc.sent == []
    assert sum(call[0] == 'squeue' for call in calls) == 1  # remembered once seen
