"""#26.3 at the server's seam: while big compiles hold every shared compile slot, a small spec
takes the small lane at once, and a big one waits a bounded time, then gets 503 ``overloaded``
(with ``Retry-After``, added by the edge middleware) instead of a client time-out. A body that is
not JSON names ``body`` as its param, not a character offset (#24)."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from dgemma_struct.server import ServerConfig
from dgemma_struct.server.app import create_app
from dgemma_struct.constraints.compile_pool import SMALL_SPEC_BYTES, spec_size
from dgemma_struct.server.http_errors import APIError
from dgemma_struct.server.state import ServerState
from dgemma_struct.testing import tiny_runtime

SMALL = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
BIG = {"type": "object", "properties": {f"k{i}": {"type": "string", "description": "x" * 40} for i in range(100)}}


@pytest.fixture(scope="module")
def state():
    cfg = ServerConfig(isolate_compiles=False, compile_timeout_s=0.5, max_concurrent_compiles=2)
    st = ServerState(tiny_runtime(), cfg)
    yield st
    st.stop()


def test_the_specs_fall_in_different_lanes():
    assert spec_size(SMALL) <= SMALL_SPEC_BYTES < spec_size(BIG)


def test_a_small_spec_compiles_while_big_ones_hold_every_shared_slot(state):
    async def scenario():
        for _ in range(2):                       # a flood holds both shared slots
            await state.compile_sem.acquire()
        try:
            t0 = time.monotonic()
            c = await state.compile(SMALL, "response_format")
            small_s = time.monotonic() - t0
            with pytest.raises(APIError) as ei:
                await state.compile(BIG, "response_format")
            return c, small_s, ei.value
        finally:
            for _ in range(2):
                state.compile_sem.release()

    c, small_s, err = asyncio.run(scenario())
    assert c is not None and small_s < 5.0
    assert (err.status, err.code) == (503, "overloaded") and err.headers["Retry-After"]


def test_once_the_flood_ends_a_big_spec_compiles(state):
    assert asyncio.run(state.compile(BIG, "response_format")) is not None


def test_a_body_that_is_not_json_names_body():
    app = create_app(tiny_runtime(), ServerConfig(isolate_compiles=False, warmup=False))

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                return await client.post("/v1/chat/completions", content=b'{"model": "m", "messages": [',
                                         headers={"content-type": "application/json"})

    r = asyncio.run(go())
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "body", r.json()


def test_identical_specs_arriving_together_compile_once(state, monkeypatch):
    calls = []
    real = state._compile_blocking

    def counted(spec, max_tokens=None):
        calls.append(spec)
        time.sleep(0.2)
        return real(spec, max_tokens)

    monkeypatch.setattr(state, "_compile_blocking", counted)
    spec = {"type": "object", "properties": {"burst": {"type": "integer"}}, "required": ["burst"]}

    async def burst():
        return await asyncio.gather(*[state.compile(spec, "response_format") for _ in range(6)])

    out = asyncio.run(burst())
    assert len(calls) == 1 and all(c is out[0] for c in out)
    assert not state._inflight


def test_server_compiles_with_the_python_apis_defaults(state):
    """A request's constraint has the GenerateOptions defaults: numbers no longer than their type
    (bounded_numbers) and strings without maxLength bounded by the request's max_tokens (field_budget)."""
    spec = {"type": "object", "properties": {"s": {"type": "string"}, "n": {"type": "integer"}},
            "required": ["s", "n"], "additionalProperties": False}
    bounded = asyncio.run(state.compile(spec, "response_format", 64))
    long_text, huge = '{"s":"' + "a" * 500 + '","n":1}', '{"s":"a","n":' + "9" * 30 + "}"
    assert bounded.grammar_accepts('{"s":"abc","n":12}')
    assert not bounded.grammar_accepts(long_text) and not bounded.grammar_accepts(huge)
    wide = asyncio.run(state.compile(spec, "response_format", None))   # no budget: only the number bound
    assert wide.grammar_accepts(long_text) and not wide.grammar_accepts(huge)


def test_a_cancelled_compile_ends_cancelled_not_as_a_400(state, monkeypatch):
    """A compile cancelled while it runs (the server stopping, as asyncio.run cancels what is left) ends
    cancelled: it was turned into a 400 'cannot compile the constraint: CancelledError' that asyncio then
    reported as an unhandled error, with a traceback, on every Ctrl-C during the warm-up."""
    monkeypatch.setattr(state, "_compile_blocking", lambda spec, max_tokens=None: time.sleep(0.5))
    spec = {"type": "object", "properties": {"cancelled": {"type": "integer"}}, "required": ["cancelled"]}

    async def cancel_midway():
        task = asyncio.ensure_future(state._compile_once("k", spec, "response_format", None))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return task.cancelled()

    assert asyncio.run(cancel_midway())
