"""The package faces of ``dgemma_struct.tools`` and ``dgemma_struct.grounding`` (both split into
modules): every exported name resolves. (Import circles, including a module importing its own
package face, are caught by tests/test_architecture.py.)"""
import importlib

import pytest


@pytest.mark.parametrize("pkg", ["dgemma_struct.tools", "dgemma_struct.grounding"])
def test_face_exports_resolve(pkg):
    mod = importlib.import_module(pkg)
    assert mod.__all__ and all(getattr(mod, n, None) is not None for n in mod.__all__)
