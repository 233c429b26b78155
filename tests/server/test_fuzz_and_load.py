"""Schemathesis over the server's OpenAPI (bounded: a few examples per operation, no 5xx), and a
load test: 64 concurrent clients sending a mix of valid and invalid requests."""
from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import jsonschema
import pytest
from hypothesis import HealthCheck, settings

from server_harness import running_server

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed (pip install schemathesis)")


@pytest.fixture(scope="module")
def fuzz_url(rt):
    # small token caps keep every generated request fast; a big-enough timeout means no 504s
    with running_server(rt, max_tokens_cap=48, default_max_tokens=32, request_timeout_s=120,
                        compile_timeout_s=30) as url:
        yield url


@pytest.fixture(scope="module")
def api_schema(fuzz_url):
    return schemathesis.openapi.from_url(fuzz_url + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_no_server_errors(case):
    response = case.call(timeout=120)
    assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])
    if response.status_code >= 400:
        err = response.json()["error"]
        assert err["message"] and err["type"]


SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                           "size": {"type": "string", "enum": ["S", "M", "L"]},
                                           "n": {"type": "integer", "minimum": -5, "maximum": 5}},
          "required": ["ok", "size", "n"], "additionalProperties": False}
MSG = [{"role": "user", "content": "Give the answer as JSON."}]
ERROR_STATUSES = {400, 404, 413, 422, 429, 503}


def _request(i: int) -> tuple[dict, str]:
    """Request i of the mix and what a 200 must satisfy."""
    kind = ["schema", "regex", "choice", "bad_regex", "bad_schema", "too_many_tokens", "schema", "bad_body"][i % 8]
    if kind == "schema":
        return {"messages": MSG, "max_tokens": 48, "seed": i,
                "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}}, kind
    if kind == "regex":
        return {"messages": MSG, "max_tokens": 16, "guided_regex": "[0-9]{2}-[a-z]{2}"}, kind
    if kind == "choice":
        return {"messages": MSG, "max_tokens": 8, "structured_outputs": {"choice": ["left", "right"]}}, kind
    if kind == "bad_regex":
        return {"messages": MSG, "guided_regex": "[z-a"}, kind
    if kind == "bad_schema":
        return {"messages": MSG, "guided_json": {"type": "object", "properties": {"a": {"type": 5}}}}, kind
    if kind == "too_many_tokens":
        return {"messages": MSG, "max_tokens": 10 ** 6}, kind
    return {"messages": "not a list"}, kind


def _check(kind: str, r: httpx.Response) -> None:
    body = r.json()                                     # every answer is JSON
    if r.status_code == 200:
        text = body["choices"][0]["message"]["content"]
        finish = body["choices"][0]["finish_reason"]
        assert finish in ("stop", "length")
        if finish == "length":          # cut by max_tokens, as OpenAI reports it: no value claimed
            assert kind in ("schema", "regex", "choice"), (kind, body)
            return
        if kind == "schema":
            jsonschema.validate(json.loads(text), SCHEMA)
        elif kind == "regex":
            assert re.fullmatch("[0-9]{2}-[a-z]{2}", text)
        elif kind == "choice":
            assert text in ("left", "right")
        else:
            raise AssertionError(f"{kind} should have failed: {body}")
    else:
        assert r.status_code in ERROR_STATUSES, (kind, r.status_code, body)
        assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"]
        if kind.startswith("bad") or kind == "too_many_tokens":
            assert r.status_code == 400


def test_load_64_concurrent_clients(rt):
    clients, per_client = 64, 3
    with running_server(rt, max_queue=64, max_batch_size=8, max_wait_ms=10, max_tokens_cap=256) as url:
        async def client(c: int, http: httpx.AsyncClient) -> list[tuple[str, httpx.Response]]:
            out = []
            for k in range(per_client):
                body, kind = _request(c * per_client + k)
                out.append((kind, await http.post("/v1/chat/completions", json=body)))
            return out

        async def main():
            limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
            async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
                return await asyncio.wait_for(asyncio.gather(*[client(c, http) for c in range(clients)]), 60)

        t0 = time.monotonic()
        results = [x for per in asyncio.run(main()) for x in per]
        elapsed = time.monotonic() - t0
        assert len(results) == clients * per_client            # none lost
        for kind, r in results:
            _check(kind, r)
        ok = sum(r.status_code == 200 for _, r in results)
        assert ok >= clients                                    # the valid half mostly succeeds
        health = httpx.get(url + "/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert health.json()["largest_batch"] > 1
        assert elapsed < 60
