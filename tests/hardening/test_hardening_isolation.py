"""#26.1: compile isolation offered to the Python API (``isolate_compile=True``) and on by default in
``dgemma_struct.fastapi``: the spec is compiled in a worker process first; its typed errors come
back typed, and a crash there would be a ``ConstraintEngineError`` rather than the end of the process."""
from __future__ import annotations

import asyncio
import ctypes

import pytest

import dgemma_struct as ds
from dgemma_struct.repair import preparation as request
from dgemma_struct.errors import ConstraintEngineError, SchemaError


def test_isolated_compile_generates_and_probes_in_a_worker(rt):
    v = ds.generate_json("x", {"type": "integer", "minimum": 3, "maximum": 9}, runtime=rt, max_new_tokens=8,
                         isolate_compile=True)
    assert 3 <= v <= 9
    assert request._shared_pool().counters["compiles"] >= 1


def test_isolated_compile_carries_typed_errors_back(rt):
    with pytest.raises(SchemaError):
        ds.generate_json("x", {"type": "integer", "minimum": 5, "maximum": 4}, runtime=rt, isolate_compile=True)


def test_a_crash_in_the_worker_is_a_typed_error_and_this_process_lives():
    pool = request._shared_pool()
    with pytest.raises(ConstraintEngineError):
        pool.run(ctypes.string_at, 0, timeout_s=60)   # a real SIGSEGV, in the worker


def test_fastapi_generators_isolate_by_default(rt):
    from dgemma_struct.fastapi import StructuredGenerator

    g = StructuredGenerator(rt, raise_http=False, max_new_tokens=8)
    assert g.isolate_compile is True
    before = request._shared_pool().counters["compiles"]
    out = asyncio.run(g.choice("pick", ["left", "right", "up"]))
    assert out in ("left", "right", "up")
    assert request._shared_pool().counters["compiles"] == before + 1
