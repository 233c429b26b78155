"""Every ``>>>`` example in the package's docstrings runs and prints what it says (examples that
need the network or a GPU are marked ``# doctest: +SKIP`` where they stand)."""
import doctest
import importlib
import pkgutil

import pytest

import dgemma_struct


def _module_names() -> list[str]:
    names = ["dgemma_struct"]
    for info in pkgutil.walk_packages(dgemma_struct.__path__, "dgemma_struct."):
        if ".embedded" in info.name:
            continue
        names.append(info.name)
    return sorted(names)


def _examples(name: str) -> int:
    module = importlib.import_module(name)
    return sum(len(t.examples) for t in doctest.DocTestFinder().find(module, module=module))


def test_the_package_has_examples():
    assert sum(_examples(n) for n in _module_names()) >= 20


@pytest.mark.parametrize("name", _module_names())
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    result = doctest.testmod(module, optionflags=flags, report=True, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples failed in {name}"
