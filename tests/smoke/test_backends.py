"""Every replay backend trains end to end, selected by its mixin file alone."""

import glob
import os

import pytest

from app import cli
from tests.smoke.test_train import ROOT, TINY, read_scalars


def backend_mixins():
    """One pytest param per configs/buffers/*.gin mixin; Reverb ones are marked `reverb`."""
    for path in sorted(glob.glob(os.path.join(ROOT, 'configs', 'buffers', '*.gin'))):
        name = os.path.splitext(os.path.basename(path))[0]
        marks = [pytest.mark.reverb] if name.startswith('reverb') else []
        yield pytest.param(os.path.relpath(path, ROOT), id=name, marks=marks)


@pytest.mark.parametrize('mixin', list(backend_mixins()))
def test_tiny_run_with_backend(mixin, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    root_dir = str(tmp_path / 'run')
    args = TINY + [f'--gin_file={mixin}', f'--root_dir={root_dir}',
                   '--gin_bindings=run.num_env_steps=200',
                   '--gin_bindings=run.export_final_policy=False']
    metrics = cli.train_main(args)
    assert metrics['env_steps'] == 200 and metrics['train_steps'] > 0
    assert metrics['unused_bindings'] == []
    scalars = read_scalars(root_dir)
    assert scalars['buffer/size'][-1][1] == 200
    assert 0 < scalars['buffer/sample_diversity'][-1][1] <= 1
    # Resume after a hard kill, per backend: tests/smoke/test_resume.py.
