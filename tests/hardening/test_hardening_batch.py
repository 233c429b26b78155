"""#15.2 and #15.5: a failing row leaves its batch (the others complete), and deadlines start when
a request starts running."""
from __future__ import annotations

import asyncio
import json
import sys
import time

import httpx
import jsonschema
from server_harness import running_server

from dgemma_struct.api import constraint_for
from dgemma_struct.errors import ConstraintEngineError
from dgemma_struct.options import GenerateOptions
from dgemma_struct.server.batcher import Batcher
from dgemma_struct.server.jobs import Job

MSG = [{"role": "user", "content": "Give the answer as JSON."}]
GOOD = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
        "additionalProperties": False}
# compiles, but validating an output recurses forever (RecursionError: the whole batched call failed)
POISON = {"type": "boolean", "not": {"$ref": "#"}}


def test_a_poisoned_row_does_not_fail_its_batch(rt):
    with running_server(rt, max_batch_size=8, max_wait_ms=300, max_tokens_cap=64) as url:
        async def go():
            async with httpx.AsyncClient(base_url=url, timeout=120) as c:
                bodies = [{"messages": MSG, "max_tokens": 24, "guided_json": GOOD} for _ in range(6)]
                bodies.insert(3, {"messages": MSG, "max_tokens": 24, "guided_json": POISON})
                return await asyncio.gather(*[c.post("/v1/chat/completions", json=b) for b in bodies])
        rs = asyncio.run(go())
        bad = rs.pop(3)
        assert 400 <= bad.status_code < 500, bad.text
        assert bad.json()["error"]["code"]
        for r in rs:
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            if choice["finish_reason"] == "stop":
                jsonschema.validate(json.loads(choice["message"]["content"]), GOOD)
        h = httpx.get(url + "/health").json()
        assert h["status"] == "ok"


class _Exploding(BaseException):
    """What a Rust panic looks like from Python: a BaseException, not an Exception."""


class _PanickyJob(Job):
    """A job whose row_stop poll (inside the batched loop) raises a BaseException, as native code
    could; the batcher's own reads of ``cancelled`` see False."""

    @property
    def cancelled(self):  # type: ignore[override]
        if getattr(self, "_armed", False) and sys._getframe(1).f_code.co_name == "<lambda>":
            raise _Exploding("panic in native code")
        return False

    @cancelled.setter
    def cancelled(self, value):
        pass


def test_a_base_exception_in_one_row_is_contained(rt):
    c = constraint_for(GOOD, rt)
    b = Batcher(rt, max_batch_size=4, max_wait_ms=1)
    loop = asyncio.new_event_loop()
    try:
        jobs = [Job("a", c, GenerateOptions(max_new_tokens=24), time.monotonic() + 60, loop, timeout_s=60),
                _PanickyJob("b", c, GenerateOptions(max_new_tokens=24), time.monotonic() + 60, loop, timeout_s=60),
                Job("c", c, GenerateOptions(max_new_tokens=24), time.monotonic() + 60, loop, timeout_s=60)]
        jobs[1]._armed = True
        got = {}
        for j in jobs:
            j.resolve = lambda v, j=j: got.__setitem__(j.prompt, v)
        b.run_jobs(jobs)
        assert isinstance(got["b"], ConstraintEngineError) and "panic" in str(got["b"])
        assert not isinstance(got["a"], BaseException) and not isinstance(got["c"], BaseException)
        assert b.counters["errors"] == 0   # contained in its row: the worker's loop never saw it
    finally:
        loop.close()


def test_deadline_starts_when_the_request_runs(rt):
    """A short request queued behind a long one keeps its whole run budget."""
    b = Batcher(rt, max_batch_size=1, max_wait_ms=0, queue_timeout_s=120)
    loop = asyncio.new_event_loop()
    try:
        job = Job("x", None, GenerateOptions(max_new_tokens=8), time.monotonic() + 120, loop, timeout_s=5.0)
        time.sleep(0.2)                                  # "queued" for a while
        job.start()
        assert job.deadline - job.started == 5.0
        assert job.deadline > time.monotonic() + 4.5
    finally:
        loop.close()


def test_short_requests_behind_a_long_one_do_not_time_out(rt):
    with running_server(rt, max_batch_size=1, max_wait_ms=0, request_timeout_s=15, queue_timeout_s=120,
                        max_tokens_cap=256) as url:
        async def go():
            async with httpx.AsyncClient(base_url=url, timeout=180) as c:
                long = c.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 120,
                                                             "response_format": {"type": "json_object"}})
                shorts = [c.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 8,
                                                                "guided_choice": ["yes", "no"]}) for _ in range(4)]
                return await asyncio.gather(long, *shorts)
        rs = asyncio.run(go())
        for r in rs[1:]:
            assert r.status_code == 200, r.text


def _huge_schema(n: int, salt: int) -> dict:
    return {"type": "object", "required": [f"p{salt}_{i}" for i in range(0, n, 3)],
            "properties": {f"p{salt}_{i}": {"type": "string", "pattern": f"^[a-z]{{{i % 7 + 1},{i % 7 + 9}}}[0-9]{{2}}$"}
                           for i in range(n)}}


def test_huge_compiles_do_not_fail_other_requests(rt):
    """The compile DoS of #15.4: slow compiles are killed at their own timeout and never make an
    innocent request fail (no false constraint_too_complex); a spec compiled before skips the queue."""
    with running_server(rt, compile_timeout_s=1.0, max_tokens_cap=64) as url:
        with httpx.Client(base_url=url, timeout=300) as c:
            warm = c.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 24, "guided_json": GOOD})
            assert warm.status_code == 200

        async def go():
            async with httpx.AsyncClient(base_url=url, timeout=300) as c:
                huge = [c.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 8,
                                                             "guided_json": _huge_schema(6000, k)}) for k in range(2)]
                known = [c.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 24, "guided_json": GOOD})
                         for _ in range(3)]
                new = c.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 8,
                                                           "guided_regex": "[a-f]{4}"})
                return await asyncio.gather(*huge, *known, new)
        rs = asyncio.run(go())
        for r in rs[:2]:
            # a huge spec: compiled, refused as too complex, or (the other huge one holding the compile slot
            # past the 1 s wait on a loaded box) told to retry; never a failure of another kind
            assert r.status_code in (200, 400, 503), r.text
            if r.status_code != 200:
                assert r.json()["error"]["code"] == {400: "constraint_too_complex", 503: "overloaded"}[r.status_code]
        for r in rs[2:]:
            assert r.status_code == 200, r.text
        assert httpx.get(url + "/health").json()["status"] == "ok"
