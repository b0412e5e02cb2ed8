"""Hard-kill a run with each replay backend; the rerun finds its buffer as checkpointed.

Apart from tests/smoke/test_resume.py so that `make test`'s two workers
(`--dist loadfile`: one file per worker at a time) can run them side by side.
"""

import signal
import subprocess
import sys

import pytest

from app import cli
from tests.smoke.test_backends import backend_mixins
from tests.smoke.test_resume import CAPACITY, latest_checkpoint_step, signal_after_checkpoint_beyond
from tests.smoke.test_train import ROOT, TINY, read_scalars


@pytest.mark.parametrize('mixin', list(backend_mixins()))
def test_sigkill_resume_restores_every_backend(mixin, tmp_path):
    """Hard-kill a run with each backend; the rerun finds its buffer as checkpointed."""
    root_dir = str(tmp_path / 'run')
    args = TINY + [f'--gin_file={mixin}', '--gin_bindings=run.checkpoint_interval=200',
                   '--gin_bindings=run.export_final_policy=False', f'--root_dir={root_dir}']
    process = subprocess.Popen(
        [sys.executable, 'train.py', *args, '--gin_bindings=run.num_env_steps=50000'],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    signal_after_checkpoint_beyond(process, root_dir, 0, signal.SIGKILL)
    killed_at = latest_checkpoint_step(root_dir)
    # Finish early: a shorter budget is a config change, so it needs --force.
    metrics = cli.train_main(args + [f'--gin_bindings=run.num_env_steps={killed_at + 200}',
                                 '--force'])
    assert metrics['env_steps'] == killed_at + 200
    sizes = [(step, size) for step, size in read_scalars(root_dir)['buffer/size']
             if step > killed_at]
    # Had the buffer come back empty, it would hold ~200 steps here, not the checkpoint's plus new.
    # (Reverb windows need num_steps steps per copy before the first new item: allow for them.)
    for step, size in sizes:
        assert size >= min(step, CAPACITY) - 4 * 2 * 2, (step, size)
