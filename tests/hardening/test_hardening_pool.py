"""The compile worker pool on its own: a native crash, a runaway compile (killed at the timeout,
really stopped), typed errors carried back, and recovery after each."""
from __future__ import annotations

import ctypes
import operator
import os
import time

import pytest

from dgemma_struct.errors import ConstraintCompileTimeout, SchemaError
from dgemma_struct.constraints.compile_pool import CompileCrashed, CompilePool


@pytest.fixture(scope="module")
def pool():
    p = CompilePool(size=2)
    yield p
    p.close()


def test_a_segfault_is_a_typed_error_and_the_pool_recovers(pool):
    with pytest.raises(CompileCrashed, match="SIGSEGV"):
        pool.run(ctypes.string_at, 0, timeout_s=60)      # reads address 0: a real SIGSEGV in the worker
    assert pool.run(operator.add, 2, 3, timeout_s=60) == 5
    assert pool.counters["crashes"] >= 1


def test_a_runaway_compile_is_killed_at_the_timeout(pool):
    pool.run(operator.add, 0, 0, timeout_s=60)           # a started worker: start-up is not timed
    pid = [w.proc.pid for w in pool._idle][-1]
    t0 = time.monotonic()
    with pytest.raises(ConstraintCompileTimeout):
        pool.run(time.sleep, 60, timeout_s=1.0)
    assert time.monotonic() - t0 < 10
    with pytest.raises(ProcessLookupError):
        for _ in range(50):                              # the worker that ran it is gone (killed)
            os.kill(pid, 0)
            time.sleep(0.1)
    assert pool.run(operator.mul, 6, 7, timeout_s=60) == 42


def test_one_stuck_compile_does_not_hold_up_another(pool):
    import threading

    errors = []

    def stuck():
        try:
            pool.run(time.sleep, 30, timeout_s=8)
        except ConstraintCompileTimeout as err:
            errors.append(err)
    pool.warm(2)                                         # both workers up: start-up is not what is timed
    t = threading.Thread(target=stuck)
    t.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    assert pool.run(operator.add, 1, 1, timeout_s=60) == 2
    assert time.monotonic() - t0 < 8                     # served by the other worker meanwhile
    t.join()
    assert errors


def test_typed_errors_come_back_typed(pool, rt):
    with pytest.raises(SchemaError):
        pool.probe({"type": "nonsense"}, rt.tokenizer, stop_token_ids=rt.eos_token_ids, vocab_size=None,
                   timeout_s=60)
    pool.probe({"type": "object", "properties": {"a": {"type": "integer"}}}, rt.tokenizer,
               stop_token_ids=rt.eos_token_ids, vocab_size=None, timeout_s=60)
    n = pool.counters["compiles"]
    pool.probe({"type": "object", "properties": {"a": {"type": "integer"}}}, rt.tokenizer,
               stop_token_ids=rt.eos_token_ids, vocab_size=None, timeout_s=60)
    assert pool.counters["compiles"] == n                # a spec that compiled before is not probed again
