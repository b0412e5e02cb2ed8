"""Imports point down only (docs/architecture.md): a test that fails on an upward import.

Layers, bottom up: `core` (basics; imports nothing of ours) < the components
`envs`, `agents`, `buffers`, `rlds_io`, `preprocessing` (each imports only `core` and itself) <
`experiment` < `app` (command-line code: flags, Gin loading, the launcher) < `sweeps` <
the entry points (train.py, sweep.py, evaluate.py, make_dataset.py, the distributed
launcher), the benchmarks (`bench`) and the results documents made from runs (`reports`),
which nothing imports (only tests). Every import counts, including the ones inside
functions.

Inside `experiment/` the modules are layered too (`EXPERIMENT_LAYERS`): the parts, then
evaluation and summaries, the trainer, the two kinds of run, and the distributed roles
on top; a module imports only from its own layer or below.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMPONENTS = ('envs', 'agents', 'buffers', 'rlds_io', 'preprocessing')
LAYER_OF_PACKAGE = {'core': 0, **{name: 1 for name in COMPONENTS}, 'experiment': 2,
                    'app': 3, 'sweeps': 4, 'bench': 5, 'reports': 5}
ENTRY_POINTS = {'train', 'sweep', 'evaluate', 'make_dataset', 'app.launch', 'app.slurm'}
ENTRY_LAYER = 5
# experiment/, bottom up: (name, modules relative to experiment/).
EXPERIMENT_LAYERS = [
    ('parts', {'config', 'summaries', 'checkpointing', 'loop', 'replay', 'staged_agent',
               'run_state', 'run_session', 'progress', 'eval_report', 'video', 'best_policy',
               'buffer_probe'}),
    ('evaluation and summaries', {'evaluation', 'judging', 'train_summaries', 'takeaway',
                                  'dataset_collection'}),
    ('the trainer', {'trainer'}),
    ('the kinds of run', {'online', 'offline'}),
    ('distributed plumbing', {'distributed.config', 'distributed.net', 'distributed.tables',
                              'distributed.waiting', 'distributed.pusher'}),
    ('distributed common', {'distributed.common', 'distributed.cluster'}),
    ('replay tier', {'distributed.tier', 'distributed.held', 'distributed.learner_shards'}),
    ('distributed roles', {'distributed.collector', 'distributed.learner',
                           'distributed.evaluator', 'distributed.replay'}),
    ('role dispatch', {'distributed.roles'}),
]


def _module_name(path):
    return '.'.join(path.relative_to(ROOT).with_suffix('').parts)


def _layer(module):
    if module in ENTRY_POINTS:
        return ENTRY_LAYER
    return LAYER_OF_PACKAGE.get(module.split('.')[0])


def _our_imports(path):
    """(line, imported module) for every import of one of our modules in `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from experiment import cli` imports experiment.cli: check the submodule too.
            names = [f'{node.module}.{alias.name}' for alias in node.names]
            names = [name if _is_module(name) else node.module for name in names]
        else:
            continue
        found += [(node.lineno, name) for name in names
                  if name.split('.')[0] in LAYER_OF_PACKAGE or name in ENTRY_POINTS]
    return found


def _is_module(dotted):
    parts = dotted.split('.')
    return (ROOT.joinpath(*parts).with_suffix('.py').is_file()
            or ROOT.joinpath(*parts, '__init__.py').is_file())


def _source_files():
    skip = {'.venv', 'runs', 'tests', '.git'}
    return sorted(path for path in ROOT.rglob('*.py')
                  if not skip.intersection(path.relative_to(ROOT).parts))


def _violations(path):
    module = _module_name(path)
    layer = _layer(module)
    if layer is None:
        return []
    own_package = module.split('.')[0]
    bad = []
    for line, imported in _our_imports(path):
        target = _layer(imported)
        if imported in ENTRY_POINTS:
            bad.append(f'{path.relative_to(ROOT)}:{line} imports the entry point {imported}')
        elif target > layer or (target == layer and imported.split('.')[0] != own_package):
            bad.append(f'{path.relative_to(ROOT)}:{line} ({module}, layer {layer}) imports '
                       f'{imported} (layer {target})')
    return bad


def test_every_source_file_has_a_layer():
    unplaced = [str(path.relative_to(ROOT)) for path in _source_files()
                if _layer(_module_name(path)) is None
                and path.parent != ROOT / 'scripts']
    assert unplaced == [], 'place these in a layer (tests/unit/test_layers.py): ' + \
        ', '.join(unplaced)


def test_no_import_points_up_or_sideways_between_components():
    bad = [line for path in _source_files() for line in _violations(path)]
    assert bad == [], '\n'.join(bad)


def _experiment_layer(module):
    """The index in EXPERIMENT_LAYERS of an `experiment.` module (None for the packages)."""
    name = module[len('experiment.'):]
    for index, (_, modules) in enumerate(EXPERIMENT_LAYERS):
        if name in modules:
            return index
    return None


def _experiment_modules():
    return [path for path in sorted((ROOT / 'experiment').rglob('*.py'))
            if path.name != '__init__.py']


def test_every_experiment_module_has_a_layer_inside_experiment():
    unplaced = [_module_name(path) for path in _experiment_modules()
                if _experiment_layer(_module_name(path)) is None]
    assert unplaced == [], 'place these in EXPERIMENT_LAYERS: ' + ', '.join(unplaced)


def _experiment_violations(path):
    module = _module_name(path)
    layer = _experiment_layer(module)
    bad = []
    for line, imported in _our_imports(path):
        target = _experiment_layer(imported) if imported.startswith('experiment.') else None
        if target is not None and target > layer:
            bad.append(f'{path.relative_to(ROOT)}:{line} ({EXPERIMENT_LAYERS[layer][0]}) '
                       f'imports {imported} ({EXPERIMENT_LAYERS[target][0]})')
    return bad


def test_no_experiment_module_imports_one_above_it():
    bad = [line for path in _experiment_modules() for line in _experiment_violations(path)]
    assert bad == [], '\n'.join(bad)


def test_the_experiment_check_catches_an_upward_import(monkeypatch):
    monkeypatch.setattr(pathlib.Path, 'read_text', lambda self: 'from experiment import trainer')
    assert any('imports experiment.trainer (the trainer)' in line
               for line in _experiment_violations(ROOT / 'experiment' / 'loop.py'))


def test_no_test_imports_an_entry_point():
    bad = [f'{path.relative_to(ROOT)}:{line} imports {imported}'
           for path in sorted((ROOT / 'tests').rglob('*.py'))
           for line, imported in _our_imports(path) if imported in ENTRY_POINTS]
    assert bad == [], '\n'.join(bad)


def test_no_file_edits_sys_path():
    bad = [str(path.relative_to(ROOT)) for path in [*_source_files(),
                                                    *(ROOT / 'tests').rglob('*.py')]
           if path != pathlib.Path(__file__).resolve() and 'sys.path' in path.read_text()]
    assert bad == [], 'installed packages need no sys.path edits: ' + ', '.join(bad)


@pytest.mark.parametrize('source, message', [
    ('from experiment.run import x', 'imports experiment.run'),
    ('import train', 'entry point train'),
    ('from buffers.base import x', 'imports buffers.base'),
])
def test_the_check_catches_an_upward_import(tmp_path, monkeypatch, source, message):
    path = ROOT / 'envs' / 'suite.py'
    monkeypatch.setattr(pathlib.Path, 'read_text', lambda self: source)
    assert any(message in line for line in _violations(path))
