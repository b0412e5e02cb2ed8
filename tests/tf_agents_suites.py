"""Runs TF-Agents' own replay-buffer test files against our classes.

TF-Agents ships the tests that specify its `ReplayBuffer` interface inside the
installed package (`tf_agents/replay_buffers/*_test.py`). A test module here
declares a `Suite`: which installed test file, which class in which TF-Agents
module our class stands in for, and the tests it excludes, each with its
reason. `parametrize(suite)` turns every test method of the file into one
pytest case that patches the class (a `monkeypatch` fixture: nothing outside
the case sees it) and runs the unmodified method. An excluded test is run too,
as a strict xfail, so an exclusion whose reason no longer holds fails loudly
rather than hiding a test that would pass.
"""

import dataclasses
import importlib
import unittest
from typing import Any, Callable, Mapping

import pytest


@dataclasses.dataclass(frozen=True)
class Suite:
    """One TF-Agents test file and the substitution it runs under.

    Attributes:
      test_module: the installed test file, e.g.
        'tf_agents.replay_buffers.tf_uniform_replay_buffer_test'.
      replaced: (module, attribute) of the TF-Agents class the tests construct,
        e.g. ('tf_agents.replay_buffers.tf_uniform_replay_buffer', 'TFUniformReplayBuffer').
      ours: returns our class (called inside the case, so collection stays cheap).
      excluded: test id (Class.method) -> why it cannot pass against our class.
      extra_patches: more (module, attribute) -> replacement factory pairs the
        suite needs, e.g. TF-Agents helpers that build the replaced class.
      without_buffer: test class -> why its tests construct no replay class (e.g. they
        test conversion functions only); they run under the same patches, without the
        check that they constructed ours.
    """

    test_module: str
    replaced: tuple
    ours: Callable[[], Any]
    excluded: Mapping[str, str] = dataclasses.field(default_factory=dict)
    extra_patches: Mapping[tuple, Callable[[], Any]] = dataclasses.field(default_factory=dict)
    without_buffer: Mapping[str, str] = dataclasses.field(default_factory=dict)


def test_ids(suite):
    """Every test method of the file, as 'Class.method', in the file's loader order."""
    module = importlib.import_module(suite.test_module)
    loader = unittest.TestLoader()
    ids = []
    for name in dir(module):
        cls = getattr(module, name)
        if isinstance(cls, type) and issubclass(cls, unittest.TestCase) \
                and cls.__module__ == module.__name__:
            # `test_session` is tf.test.TestCase's own helper, not one of the file's tests.
            ids += [f'{name}.{method}' for method in loader.getTestCaseNames(cls)
                    if method != 'test_session']
    return ids


def parametrize(suite):
    """pytest parameters for every test of the suite; excluded ones are strict xfails."""
    params = []
    for test_id in test_ids(suite):
        marks = ()
        if test_id in suite.excluded:
            marks = pytest.mark.xfail(reason=suite.excluded[test_id], strict=True)
        params.append(pytest.param(test_id, id=test_id, marks=marks))
    unknown = set(suite.excluded) - {p.values[0] for p in params}
    if unknown:
        raise ValueError(f'{suite.test_module}: excluded tests that do not exist: '
                         f'{sorted(unknown)}')
    return params


def run_case(suite, test_id, monkeypatch):
    """Runs one TF-Agents test method with our class patched in; fails with its report.

    A test TF-Agents itself skips (e.g. graph-mode only) is reported as a pytest skip. A
    test that passes must have constructed our class: proof the substitution took.
    """
    patches = {suite.replaced: suite.ours, **suite.extra_patches}
    for (module_name, attribute), factory in patches.items():
        monkeypatch.setattr(importlib.import_module(module_name), attribute, factory())
    ours = suite.ours()
    constructed = []
    original_init = ours.__init__

    def counting_init(self, *args, **kwargs):
        constructed.append(type(self))
        original_init(self, *args, **kwargs)

    monkeypatch.setattr(ours, '__init__', counting_init)
    module = importlib.import_module(suite.test_module)
    class_name, method = test_id.split('.')
    case = getattr(module, class_name)(method)
    result = unittest.TestResult()
    case.run(result)
    problems = result.errors + result.failures
    if problems:
        pytest.fail('\n'.join(text for _, text in problems), pytrace=False)
    if result.skipped:
        pytest.skip(f'skipped by TF-Agents itself: {result.skipped[0][1]}')
    if class_name not in suite.without_buffer:
        assert constructed, f'{test_id} passed without constructing {ours.__name__}'


def exclusion_share(suite):
    """Excluded tests as a fraction of the file's tests (the issue's bar is <= 20%)."""
    return len(suite.excluded) / len(test_ids(suite))
