"""#26.3: compile fairness in the worker pool. Small specs have a lane of their own (they never wait
behind big compiles), and a big compile waits for a slot a bounded time, then gets a typed
``PoolBusy`` that the server answers as 503 ``overloaded`` with ``Retry-After``."""
from __future__ import annotations

import operator
import threading
import time

import pytest

from dgemma_struct.constraints.compile_pool import SMALL_SPEC_BYTES, CompileLanes, CompilePool, PoolBusy, spec_size
from dgemma_struct.server.http_errors import api_error_for

BIG = {"enum": ["x" * 64] * (SMALL_SPEC_BYTES // 32)}
SMALL = {"type": "object", "properties": {"a": {"type": "string"}}}


def test_spec_size_picks_the_lane():
    assert spec_size(SMALL) <= SMALL_SPEC_BYTES < spec_size(BIG)


def test_a_small_spec_gets_a_slot_while_big_ones_hold_every_big_slot():
    lanes = CompileLanes(big=2, small=1, wait_s=0.5)
    held = [lanes.acquire(BIG), lanes.acquire(BIG)]
    t0 = time.monotonic()
    with lanes.slot(SMALL):
        assert time.monotonic() - t0 < 0.1
    with pytest.raises(PoolBusy) as ei:
        lanes.acquire(BIG)
    assert 0.4 < time.monotonic() - t0 < 2 and ei.value.retry_after_s >= 1
    for s in held:
        s.release()
    with lanes.slot(BIG):
        pass


def test_pool_busy_is_a_503_overloaded_with_retry_after():
    e = api_error_for(PoolBusy("busy", retry_after_s=3))
    assert (e.status, e.code) == (503, "overloaded") and e.headers == {"Retry-After": "3"}


def test_the_pool_serves_a_small_call_during_a_big_flood():
    pool = CompilePool(size=1, small_lane=1, queue_wait_s=1.0)
    try:
        pool.warm(2)
        flood = threading.Thread(target=lambda: pool.run(time.sleep, 4, timeout_s=30, lane_of=BIG))
        flood.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        assert pool.run(operator.add, 2, 3, timeout_s=30, lane_of=SMALL) == 5
        small_s = time.monotonic() - t0
        with pytest.raises(PoolBusy):
            pool.run(operator.add, 1, 1, timeout_s=30, lane_of=BIG)
        flood.join()
        assert small_s < 1.0, small_s
    finally:
        pool.close()
