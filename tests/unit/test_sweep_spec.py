"""Sweep files and directory names: what is accepted, what is refused in one line."""

import os

import pytest

from core.errors import UserError
from sweeps import grid, naming, spec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write(tmp_path, text):
    path = tmp_path / 'sweep.yaml'
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize('name', ['dqn_lr.yaml', 'dqn_search.yaml'])
def test_shipped_sweep_files_parse(name):
    parsed = spec.load(os.path.join(ROOT, 'configs', 'sweeps', name))
    assert parsed.name == name[:-len('.yaml')]
    assert parsed.seeds == (0, 1)


def test_grid_is_a_cartesian_product_in_file_order(tmp_path):
    parsed = spec.load(write(tmp_path, """
name: g
num_seeds: 3
grid:
  dqn.make_agent.learning_rate: [1e-3, 5.0e-4]
  dqn.make_agent.double_dqn: [true, false]
"""))
    assert parsed.seeds == (0, 1, 2)
    configs = grid.configurations(parsed.grid)
    assert len(configs) == 4
    assert configs[0] == (('dqn.make_agent.learning_rate', 0.001),
                          ('dqn.make_agent.double_dqn', True))
    assert isinstance(configs[0][0][1], float)  # YAML 1.1 would have read '1e-3' as a string


def test_search_spec_defaults(tmp_path):
    parsed = spec.load(write(tmp_path, """
name: s
search:
  num_trials: 4
  params:
    dqn.make_agent.learning_rate: {type: float, low: 1e-4, high: 1e-2, log: true}
    dqn.make_agent.td_loss: {type: categorical, choices: [huber, mse]}
"""))
    search = parsed.search
    assert (search.sampler, search.metric, search.direction) == ('tpe', 'best_eval_return',
                                                                 'maximize')
    assert parsed.seeds == (0,)
    assert search.params[0].representative_values() == [1e-4, 1e-2]
    assert parsed.swept_keys == ['dqn.make_agent.learning_rate', 'dqn.make_agent.td_loss']


@pytest.mark.parametrize('text, message', [
    ('name: x\nseeds: [0]\n', "neither of 'grid' and 'search'"),
    ('name: x\ngrid: {a.b: [1]}\nsearch: {num_trials: 1}\n', "both of 'grid' and 'search'"),
    ('name: x\ngrid: {a.b: [1]}\ngird: 1\n', 'unknown key(s) gird'),
    ('name: x/y\ngrid: {a.b: [1]}\n', "needs a 'name'"),
    ('name: x\nseeds: [0, 0]\ngrid: {a.b: [1]}\n', 'distinct non-negative'),
    ('name: x\ngrid: {a.b: 1}\n', 'grid entry a.b must be a non-empty list'),
    ('name: x\ngrid: {learning_rate: [1]}\n', 'is not a Gin binding name'),
    ('name: x\nsearch: {num_trials: 2, params: {a.b: {type: float, low: 2, high: 1}}}\n',
     "needs numeric 'low' < 'high'"),
    ('name: x\nsearch: {num_trials: 2, params: {a.b: {type: float, low: 0, high: 1, log: true}}}\n',
     'a log range needs low > 0'),
    ('name: x\nsearch: {num_trials: 0, params: {a.b: {type: int, low: 0, high: 1}}}\n',
     "'num_trials' must be a positive integer"),
    ('name: x\nsearch: {num_trials: 2, sampler: grid, params: {a.b: {type: int, high: 1}}}\n',
     'search.sampler must be one of random, tpe'),
    ('name: x\ngrid: [1\n', 'is not valid YAML at line'),
])
def test_bad_sweep_files_are_one_line_errors(tmp_path, text, message):
    with pytest.raises(UserError) as error:
        spec.load(write(tmp_path, text))
    assert message in str(error.value)
    assert '\n' not in str(error.value)


def test_missing_sweep_file():
    with pytest.raises(UserError, match='Sweep file not found: nope.yaml'):
        spec.load('nope.yaml')


def test_short_names_keep_the_shortest_unambiguous_tail():
    names = naming.short_names(['dqn.make_agent.learning_rate', 'run.batch_size',
                                'eval/run.batch_size'])
    assert names == {'dqn.make_agent.learning_rate': 'learning_rate',
                     'run.batch_size': 'run.batch_size',
                     'eval/run.batch_size': 'eval.run.batch_size'}


def test_labels_and_literals():
    names = {'a.lr': 'lr', 'a.layers': 'layers', 'a.loss': 'loss', 'a.ref': 'ref'}
    params = (('a.lr', 5e-4), ('a.layers', [64, 64]), ('a.loss', 'mse'), ('a.ref', '@Foo'))
    assert naming.config_label(params, names) == 'lr=0.0005,layers=64-64,loss=mse,ref=Foo'
    assert naming.bindings_for(params) == [
        'a.lr = 0.0005', 'a.layers = (64, 64)', "a.loss = 'mse'", 'a.ref = @Foo']
    assert naming.gin_literal([100]) == '(100,)'
    assert naming.config_label((), {}) == 'default'
    assert naming.dir_text('a/b c') == 'a_b_c'


def test_long_labels_are_cut_with_a_hash():
    names = {f'a.p{i}': f'p{i}' for i in range(30)}
    params = tuple((f'a.p{i}', 123456 + i) for i in range(30))
    label = naming.config_label(params, names)
    assert len(label) == naming.MAX_LABEL_CHARS
    assert label != naming.config_label(params[:-1] + (('a.p29', 1),), names)
