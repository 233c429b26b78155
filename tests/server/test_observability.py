"""Operators' view of the server: the probes, ``/metrics`` (Prometheus), request ids, Retry-After,
remembered compile verdicts (in-process and through a shared store), and true per-request stats
and /health counters on every path (continuous, static, streamed)."""
from __future__ import annotations

import json
import logging
import re
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_harness import running_app

import dgemma_struct.server.state as state_mod
from dgemma_struct.errors import ConstraintCompileTimeout
from dgemma_struct.server.edge import Edge
from dgemma_struct.server.lifecycle import Lifecycle
from dgemma_struct.server.metrics import Metrics
from dgemma_struct.server import ServerConfig

CHOICE = {"messages": [{"role": "user", "content": "hi"}], "guided_choice": ["on", "off"], "max_tokens": 8}
JSON = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 32,
        "guided_json": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}


def _samples(text: str) -> dict[tuple, float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.fixture(scope="module")
def served(rt):
    with running_app(rt, max_tokens_cap=128, default_max_tokens=16, api_key="k") as pair:
        yield pair


def _post(url, body, **headers):
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=60,
                      headers={"authorization": "Bearer k", **headers})


def test_probes_answer_without_the_api_key_and_report_the_warm_up(served):
    url, app = served
    assert httpx.get(url + "/health/live").json() == {"status": "alive"}
    ready = httpx.get(url + "/health/ready")
    assert ready.status_code == 200 and ready.json()["status"] == "ok"
    assert ready.json()["warmup_s"] > 0 and ready.json()["warmup_error"] is None
    assert httpx.get(url + "/health").json()["ready"] is True
    assert httpx.get(url + "/v1/models").status_code == 401          # the API still needs the key


def test_not_ready_until_the_warm_up_ran(rt, monkeypatch):
    """/health and /health/ready say warming_up (503) until one generation went through the batcher."""
    import dgemma_struct.server.lifecycle as lc

    real = lc.warm_up

    async def slow(state, lifecycle):
        import asyncio
        await asyncio.sleep(1.0)
        await real(state, lifecycle)
    monkeypatch.setattr("dgemma_struct.server.app.warm_up", slow)
    with running_app(rt, wait_ready=False) as (url, app):
        first = httpx.get(url + "/health/ready")
        assert first.status_code == 503 and first.json()["status"] == "warming_up"
        assert httpx.get(url + "/health").status_code == 503
        assert httpx.get(url + "/health/live").status_code == 200
        t0 = time.monotonic()
        while httpx.get(url + "/health/ready").status_code != 200:
            assert time.monotonic() - t0 < 60
            time.sleep(0.05)
        assert app.state.metrics.warmup_seconds._value.get() >= 1.0
        rows = app.state.dgemma.batcher.counters["continuous_rows"]
        assert rows >= 1   # the warm-up ran through the real batcher


def test_metrics_count_requests_rows_and_latencies(served):
    url, _ = served
    assert _post(url, CHOICE).status_code == 200
    assert _post(url, JSON).status_code == 200
    assert _post(url, {"messages": [{"role": "user", "content": "x"}], "guided_regex": "(("}).status_code == 400
    r = httpx.get(url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    m = _samples(r.text)
    assert m[("dgemma_struct_requests_total", (("code", ""), ("status", "200")))] >= 2
    assert m[("dgemma_struct_requests_total", (("code", "invalid_regex"), ("status", "400")))] >= 1
    for name in ("dgemma_struct_queue_seconds_count", "dgemma_struct_generation_seconds_count",
                 "dgemma_struct_compile_seconds_count", "dgemma_struct_tokens_per_forward_count"):
        assert m[(name, ())] >= 2, name
    assert m[("dgemma_struct_mode_choices_total", (("mode", "diffusion"),))] >= 2
    assert sum(v for (n, _), v in m.items() if n == "dgemma_struct_compile_cache_total") >= 2
    for gauge in ("dgemma_struct_queue_depth", "dgemma_struct_running_rows", "vllm:num_requests_waiting",
                  "vllm:gpu_cache_usage_perc", "dgemma_struct_batch_utilization",
                  "dgemma_struct_ready", "dgemma_struct_repairs_total", "dgemma_struct_ar_fallbacks_total"):
        assert (gauge, ()) in m, gauge
    assert m[("dgemma_struct_ready", ())] == 1.0


def test_request_ids_are_echoed_generated_and_logged(served, caplog):
    url, _ = served
    caplog.set_level(logging.DEBUG, logger="dgemma_struct.server.access")
    r = _post(url, CHOICE, **{"x-request-id": "trace-42"})
    assert r.headers["x-request-id"] == "trace-42"
    assert re.fullmatch(r"[0-9a-f]{32}", _post(url, CHOICE).headers["x-request-id"])
    bad = _post(url, CHOICE, **{"x-request-id": "x" * 200})               # too long: replaced
    assert bad.headers["x-request-id"] != "x" * 200
    assert httpx.get(url + "/v1/models").headers["x-request-id"]       # a 401 from the guard has one too
    t0 = time.monotonic()
    while not any(getattr(rec, "request_id", None) == "trace-42" for rec in caplog.records):
        assert time.monotonic() - t0 < 5, [getattr(rec, "request_id", None) for rec in caplog.records]
        time.sleep(0.05)


def test_retry_after_on_429_and_503():
    """The edge adds Retry-After to any 429/503 (queue full, loading, worker down)."""
    from starlette.testclient import TestClient

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        status = int(scope["path"].strip("/"))
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": json.dumps({"error": {"code": "queue_full"}}).encode()})
    edge = Edge(app, ServerConfig(retry_after_s=3), Lifecycle(), metrics := Metrics())
    c = TestClient(edge)   # no lifespan: the stub app has none
    assert c.get("/429").headers["retry-after"] == "3"
    assert c.get("/503").headers["retry-after"] == "3"
    assert "retry-after" not in c.get("/400").headers
    assert metrics.requests.labels(status="429", code="queue_full")._value.get() == 1


def test_drain_refuses_new_work_with_retry_after(rt):
    with running_app(rt) as (url, app):
        app.state.lifecycle.begin_drain()
        r = httpx.post(url + "/v1/chat/completions", json=CHOICE)
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
        assert r.headers["retry-after"] == "1" and r.headers["x-request-id"]
        assert httpx.get(url + "/health/ready").json()["status"] == "draining"
        assert httpx.get(url + "/health").status_code == 503
        assert httpx.get(url + "/health/live").status_code == 200


def test_a_refused_constraint_is_refused_at_once_the_second_time(rt, monkeypatch):
    calls = []

    def slow_refusal(spec, runtime, **knobs):
        calls.append(spec)
        time.sleep(1.0)
        raise ConstraintCompileTimeout("compiling took too long")
    monkeypatch.setattr(state_mod, "constraint_for", slow_refusal)
    with running_app(rt, isolate_compiles=False, warmup=False) as (url, app):
        body = {**JSON, "guided_json": {"type": "object", "title": "slow"}}
        t0 = time.perf_counter()
        first = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
        t1 = time.perf_counter()
        second = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
        t2 = time.perf_counter()
        assert first.status_code == second.status_code == 400
        assert first.json()["error"]["code"] == second.json()["error"]["code"] == "constraint_too_complex"
        assert t1 - t0 >= 1.0 and t2 - t1 < 0.5 and len(calls) == 1
        assert httpx.get(url + "/health").json()["verdicts"]["hits"] == 1


class _DictStore:
    """A shared verdict store as the Ray example's actor behaves (get is awaited, put is fire-and-forget)."""

    def __init__(self):
        self.d = {}

    async def get(self, key):
        return self.d.get(key)

    def put(self, key, verdict):
        self.d[key] = verdict


def test_verdicts_are_shared_between_servers(rt, monkeypatch):
    from dgemma_struct.server.verdicts import Verdicts

    calls = []

    def refusal(spec, runtime, **knobs):
        calls.append(spec)
        raise ConstraintCompileTimeout("compiling took too long")
    monkeypatch.setattr(state_mod, "constraint_for", refusal)
    store = _DictStore()
    body = {**JSON, "guided_json": {"type": "object", "title": "shared"}}
    with running_app(rt, isolate_compiles=False, warmup=False, verdicts=Verdicts(shared=store)) as (a, _):
        assert httpx.post(a + "/v1/chat/completions", json=body, timeout=30).status_code == 400
    with running_app(rt, isolate_compiles=False, warmup=False, verdicts=Verdicts(shared=store)) as (b, _):
        r = httpx.post(b + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["code"] == "constraint_too_complex"
        assert httpx.get(b + "/health").json()["verdicts"]["shared_hits"] == 1
    assert len(calls) == 1


def test_stats_and_counters_are_filled_on_every_path(rt):
    with running_app(rt, max_tokens_cap=64) as (url, _):
        plain = httpx.post(url + "/v1/chat/completions", json=JSON, timeout=60).json()["dgemma_stats"]
        free = httpx.post(url + "/v1/chat/completions", timeout=60,
                          json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}).json()["dgemma_stats"]
        streamed = httpx.post(url + "/v1/chat/completions", json={**JSON, "stream": True}, timeout=60).text
        last = [json.loads(line[6:]) for line in streamed.splitlines()
                if line.startswith("data: {") and "dgemma_stats" in line][-1]["dgemma_stats"]
        for stats in (free, plain, last):
            assert stats["model_s"] > 0 and stats["denoising_steps"] > 0, stats
            assert stats["other_s"] == pytest.approx(max(0.0, stats["wall_s"] - stats["model_s"]), abs=1e-6)
        assert plain["denoising_steps"] > 0 and last["forward_passes"] > 0
        before = httpx.get(url + "/health").json()["errors"]
        assert httpx.post(url + "/v1/chat/completions", json={**JSON, "max_tokens": 100000}).status_code == 400
        assert httpx.get(url + "/health").json()["errors"] == before + 1


def test_a_compiled_spec_is_not_looked_up_in_the_shared_store_again(rt):
    from dgemma_struct.server.verdicts import Verdicts

    class Counting(_DictStore):
        asked = 0

        async def get(self, key):
            Counting.asked += 1
            return await super().get(key)
    with running_app(rt, isolate_compiles=False, warmup=False, verdicts=Verdicts(shared=Counting())) as (url, _):
        for _ in range(3):
            assert httpx.post(url + "/v1/chat/completions", json=CHOICE, timeout=60).status_code == 200
    assert Counting.asked == 1
