"""`python -m app.slurm train --dry_run`: the batch script a single run is submitted with."""

import shlex
import subprocess
import sys

from tests.smoke.test_train import ROOT


def dry_run(*args):
    return subprocess.run([sys.executable, '-m', 'app.slurm', 'train', '--dry_run', *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_the_script_asks_for_a_warning_requeues_and_passes_train_flags_on(tmp_path):
    done = dry_run(f'--root_dir={tmp_path}/run', '--gin_file=configs/dqn_cartpole.gin',
                   "--gin_bindings=make_env.env_id='CartPole-v1'", '--time=2:00:00',
                   '--partition=gpu', '--cpus_per_task=4', '--warning_s=300',
                   '--sbatch=--constraint=skylake')
    assert done.returncode == 0, done.stderr
    script = open(tmp_path / 'run' / 'slurm' / 'train.sbatch').read()
    for line in ('#SBATCH --time=2:00:00', '#SBATCH --partition=gpu',
                 '#SBATCH --cpus-per-task=4', '#SBATCH --requeue',
                 '#SBATCH --signal=B:USR1@300', '#SBATCH --open-mode=append',
                 '#SBATCH --constraint=skylake',
                 f'#SBATCH --output={tmp_path}/run/slurm/train-%j.out'):
        assert line in script.splitlines(), line
    command = next(line for line in script.splitlines() if 'train.py' in line)
    assert shlex.split(command.rstrip(' &'))[1:] == [
        f'{ROOT}/train.py', f'--root_dir={tmp_path}/run', '--gin_file=configs/dqn_cartpole.gin',
        "--gin_bindings=make_env.env_id='CartPole-v1'"]  # quoted for bash, passed on intact
    assert 'scontrol requeue "${task:-$SLURM_JOB_ID}"' in script
    assert script in done.stdout  # --dry_run prints what it wrote


def test_bad_input_is_one_line_and_writes_nothing(tmp_path):
    for args, message in (
            (['--gin_file=configs/no_such.gin'],
             f'error: --gin_file=configs/no_such.gin: no such file (paths are relative to '
             f'{ROOT}).'),
            (['--cpus_per_task=0'], 'error: --cpus_per_task must be >= 1, got 0.'),
            (['--time=1', '--warning_s=30'],
             'error: --time=1 leaves no time to work: Slurm may send the --warning_s=30 warning '
             'up to 60 s early, so give at least 90 s, or a smaller --warning_s.'),
            (['--time=1h'], "error: --time='1h' is not a Slurm time limit: give minutes "
                            "('30'), 'H:MM:SS' or 'D-HH:MM:SS'."),
            (['--sbatch=constraint=x'], "error: --sbatch='constraint=x' is not an sbatch "
                                        "option: give it as --sbatch=--name=value.")):
        done = dry_run(f'--root_dir={tmp_path}/run', *args)
        assert done.returncode == 2
        assert done.stderr.strip().splitlines() == [message]
    assert not (tmp_path / 'run').exists()
