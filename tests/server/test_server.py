"""The OpenAI-compatible server against a real uvicorn on 127.0.0.1, with the ``openai`` client
and httpx: constrained outputs, streaming, every bad-input class, API keys, limits."""
from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import jsonschema
import openai
import pytest

from dgemma_struct.options import GenerateOptions

from server_harness import running_server

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                           "color": {"type": "string", "enum": ["red", "green", "blue"]},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["ok", "color", "n"], "additionalProperties": False}
MSG = [{"role": "user", "content": "Give the answer as JSON."}]


@pytest.fixture()
def oai(server_url):
    return openai.OpenAI(base_url=server_url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_health_and_models(client, oai):
    h = client.get("/health")
    assert h.status_code == 200 and h.json()["status"] == "ok"
    ids = [m.id for m in oai.models.list().data]
    assert ids == ["tiny-random"]
    assert client.get("/v1/models/tiny-random").json()["id"] == "tiny-random"
    r = client.get("/v1/models/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_json_schema_via_openai_client(oai):
    resp = oai.chat.completions.create(
        model="tiny-random", messages=MSG, max_tokens=64, seed=3, temperature=0.7,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}})
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    assert resp.usage.completion_tokens > 0 and resp.usage.prompt_tokens > 0
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    stats = resp.model_extra["dgemma_stats"]
    assert stats["forward_passes"] >= 1 and stats["finish_reason"] == "stop"


def test_json_object(client):
    """An open object: the random model may not close it within budget. Then the answer says so
    (finish_reason "length", or a 422 generation_failed), never "stop" with half a JSON."""
    finishes = []
    for seed in range(6):
        r = client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 64, "seed": seed,
                                                      "response_format": {"type": "json_object"}})
        if r.status_code == 200:
            choice = r.json()["choices"][0]
            finishes.append(choice["finish_reason"])
            if choice["finish_reason"] == "stop":
                assert isinstance(json.loads(choice["message"]["content"]), dict)
        else:
            assert r.status_code == 422 and r.json()["error"]["code"] == "generation_failed"
    assert "stop" in finishes, finishes


def test_max_tokens_below_the_forced_prefix_is_length(client):
    r = client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2, "guided_json": SCHEMA})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("extra,check", [
    ({"structured_outputs": {"regex": r"[0-9]{3}-[0-9]{4}"}}, lambda t: re.fullmatch(r"[0-9]{3}-[0-9]{4}", t)),
    ({"guided_regex": r"(yes|no)!"}, lambda t: t in ("yes!", "no!")),
    ({"structured_outputs": {"choice": ["alpha", "beta", "gamma"]}}, lambda t: t in ("alpha", "beta", "gamma")),
    ({"guided_choice": ["up", "down"]}, lambda t: t in ("up", "down")),
    ({"structured_outputs": {"grammar": 'start: "ab" NUM\nNUM: /[0-9]/'}}, lambda t: re.fullmatch(r"ab[0-9]", t)),
    ({"guided_grammar": "yes_no"}, lambda t: t.strip().lower() in ("yes", "no")),
    ({"structured_outputs": {"json": SCHEMA}}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
    ({"guided_json": json.dumps(SCHEMA)}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
])
def test_regex_choice_grammar_json(oai, extra, check):
    resp = oai.chat.completions.create(model="tiny-random", messages=MSG, max_tokens=48, extra_body=extra)
    text = resp.choices[0].message.content
    assert check(text), text


def test_completions_endpoint_batches_prompts(oai):
    resp = oai.completions.create(model="tiny-random", prompt=["one", "two", "three"], max_tokens=16,
                                  extra_body={"guided_regex": "[a-c]{2}"})
    assert [c.index for c in resp.choices] == [0, 1, 2]
    assert all(re.fullmatch("[a-c]{2}", c.text) for c in resp.choices)


def test_streaming_openai_client(oai):
    stream = oai.chat.completions.create(
        model="tiny-random", messages=MSG, max_tokens=64, stream=True, stream_options={"include_usage": True},
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), SCHEMA)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and finishes.count("stop") == 1
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_streaming_raw_sse_ends_with_done(client):
    body = {"messages": MSG, "max_tokens": 32, "stream": True, "guided_choice": ["red", "green"]}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) in ("red", "green")


IMPOSSIBLE = {"guided_regex": "[0-9]{200}", "max_tokens": 16}   # 200 digits never fit in 16 tokens


def test_stream_that_cannot_finish_ends_with_finish_reason_length(client):
    """As OpenAI: an answer that cannot complete within max_tokens streams the text so far and
    ends with finish_reason "length" (never "stop"), then [DONE]."""
    body = {"messages": MSG, "stream": True, **IMPOSSIBLE}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert all("error" not in e for e in events)
    finishes = [e["choices"][0]["finish_reason"] for e in events]
    assert finishes[-1] == "length" and "stop" not in finishes
    content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    assert content.isdigit() or content == ""          # a prefix of the language, never a claimed value


def test_parse_raises_length_finish_reason_error(oai):
    """``.parse()`` of an answer cut by max_tokens raises openai's LengthFinishReasonError."""
    from pydantic import BaseModel

    class Digits(BaseModel):
        a: str
        b: str
        c: str

    with pytest.raises(openai.LengthFinishReasonError):
        oai.chat.completions.parse(model="tiny-random", messages=MSG, max_tokens=3, response_format=Digits)


def test_non_streaming_impossible_output_is_a_200_length(client):
    r = client.post("/v1/chat/completions", json={"messages": MSG, **IMPOSSIBLE})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"].isdigit() or choice["message"]["content"] == ""
    assert "max_new_tokens" not in r.text


LONG = "lorem ipsum dolor " * 1500
BAD = [
    ("empty messages", {"messages": []}, 400, "invalid_request_body"),
    ("messages not a list", {"messages": "hi"}, 400, "invalid_request_body"),
    ("bad role", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "invalid_request_body"),
    ("max_tokens 0", {"messages": MSG, "max_tokens": 0}, 400, "invalid_request_body"),
    ("max_tokens string", {"messages": MSG, "max_tokens": "many"}, 400, "invalid_request_body"),
    ("max_tokens over cap", {"messages": MSG, "max_tokens": 100_000}, 400, "max_tokens_too_large"),
    ("temperature out of range", {"messages": MSG, "temperature": 7}, 400, "invalid_request_body"),
    ("bad regex", {"messages": MSG, "guided_regex": "(("}, 400, "invalid_regex"),
    ("bad schema", {"messages": MSG, "guided_json": {"type": "nonsense"}}, 400, "invalid_schema"),
    ("schema not JSON", {"messages": MSG, "guided_json": "{not json"}, 400, "invalid_schema"),
    ("dangling ref", {"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"$ref": "#/$defs/missing"}}}}, 400, "invalid_schema"),
    ("json_schema without schema", {"messages": MSG, "response_format": {"type": "json_schema",
                                                                         "json_schema": {"name": "x"}}},
     400, "invalid_schema"),
    ("unknown response_format type", {"messages": MSG, "response_format": {"type": "xml"}}, 400,
     "invalid_request_body"),
    ("bad grammar", {"messages": MSG, "guided_grammar": "start: ("}, 400, "invalid_grammar"),
    ("grammar file path", {"messages": MSG, "guided_grammar": "/etc/x.lark"}, 400, "invalid_grammar"),
    ("empty choice", {"messages": MSG, "guided_choice": []}, 400, "invalid_choice"),
    ("non-string choice", {"messages": MSG, "structured_outputs": {"choice": [1, {}]}}, 400, "invalid_request_body"),
    ("two constraints", {"messages": MSG, "guided_regex": "a", "guided_choice": ["b"]}, 400, "invalid_constraint"),
    ("empty structured_outputs", {"messages": MSG, "structured_outputs": {}}, 400, "invalid_constraint"),
    ("n over the limit", {"messages": MSG, "n": 99}, 400, "n_too_large"),
    ("too many stops", {"messages": MSG, "stop": ["a"] * 17}, 400, "invalid_stop"),
    ("empty stop", {"messages": MSG, "stop": [""]}, 400, "invalid_stop"),
    ("bad GBNF", {"messages": MSG, "guided_grammar": 'root ::= ("a"'}, 400, "invalid_grammar"),
    ("image part", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 400,
     "unsupported_content"),
    ("unknown model", {"model": "gpt-9", "messages": MSG}, 404, "model_not_found"),
    ("prompt too long", {"messages": [{"role": "user", "content": LONG}], "max_tokens": 16,
                         "guided_choice": ["a"]}, 400, "context_length_exceeded"),
]


@pytest.mark.parametrize("name,body,status,code", BAD, ids=[b[0] for b in BAD])
def test_bad_requests_get_openai_errors(client, name, body, status, code):
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["message"] and set(err) == {"message", "type", "param", "code"}


def test_malformed_bodies(client, server_url):
    r = client.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = client.post("/v1/chat/completions", content=b"[1,2]", headers={"content-type": "application/json"})
    assert r.status_code == 400
    r = client.post("/v1/completions", json={"prompt": []})
    assert r.status_code == 400
    r = client.get("/v1/chat/completions")
    assert r.status_code == 405 and "error" in r.json()
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()


def test_body_size_limit(client):
    big = {"messages": [{"role": "user", "content": "x" * 1_100_000}]}
    r = client.post("/v1/chat/completions", json=big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunks():
        for _ in range(12):
            yield b" " * 100_000
    r = client.post("/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_api_key(rt):
    with running_server(rt, api_key="s3cret") as url:
        with httpx.Client(base_url=url, timeout=30) as c:
            assert c.get("/health").status_code == 200            # health stays open
            r = c.get("/v1/models")
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
            assert c.get("/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401
            assert c.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
        ok = openai.OpenAI(base_url=url + "/v1", api_key="s3cret", max_retries=0).chat.completions.create(
            model="tiny-random", messages=MSG, max_tokens=16, extra_body={"guided_choice": ["a", "b"]})
        assert ok.choices[0].message.content in ("a", "b")


def test_request_timeout_gives_504(rt):
    with running_server(rt, request_timeout_s=0.001) as url:
        with httpx.Client(base_url=url, timeout=30) as c:
            r = c.post("/v1/chat/completions", json={"messages": MSG, "guided_json": SCHEMA, "max_tokens": 64})
            assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
            assert c.get("/health").status_code == 200


def test_full_queue_gives_429_and_nothing_is_lost(rt):
    with running_server(rt, max_queue=1, max_batch_size=1, max_wait_ms=0) as url:
        async def go():
            async with httpx.AsyncClient(base_url=url, timeout=60) as c:
                body = {"messages": MSG, "guided_json": SCHEMA, "max_tokens": 64}
                return await asyncio.gather(*[c.post("/v1/chat/completions", json=body) for _ in range(12)])
        rs = asyncio.run(go())
        codes = [r.status_code for r in rs]
        assert len(rs) == 12 and set(codes) <= {200, 429} and 429 in codes and 200 in codes
        for r in rs:
            if r.status_code == 429:
                assert r.json()["error"]["type"] == "rate_limit_error"
            else:
                jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), SCHEMA)
        assert httpx.get(url + "/health").status_code == 200


def test_client_disconnect_mid_stream_keeps_the_worker(client, server_url):
    body = {"messages": MSG, "max_tokens": 64, "stream": True, "response_format": {"type": "json_object"}}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        for _ in r.iter_lines():
            break                                 # hang up after the first chunk
    r = client.post("/v1/chat/completions", json={"messages": MSG, "guided_choice": ["x", "y"], "max_tokens": 8})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] in ("x", "y")
    assert client.get("/health").json()["status"] == "ok"


def test_concurrent_requests_are_batched(server_url):
    async def go():
        async with httpx.AsyncClient(base_url=server_url, timeout=60) as c:
            body = {"messages": MSG, "guided_json": SCHEMA, "max_tokens": 48}
            return await asyncio.gather(*[c.post("/v1/chat/completions", json=body) for _ in range(8)])
    rs = asyncio.run(go())
    assert all(r.status_code == 200 for r in rs)
    h = httpx.get(server_url + "/health").json()
    assert h["largest_batch"] > 1, h


def test_free_text_and_prompt_limits(client, oai):
    resp = oai.chat.completions.create(model="tiny-random", messages=MSG, max_tokens=12,
                                       response_format={"type": "text"})
    assert isinstance(resp.choices[0].message.content, str)
    assert resp.choices[0].finish_reason in ("stop", "length")
    r = client.post("/v1/completions", json={"prompt": ["x"] * 17, "guided_choice": ["a"]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_prompts"


def test_openai_parse_with_a_pydantic_model(oai):
    """The openai client's ``parse`` helper sends a strict schema and parses the reply."""
    from typing import Literal

    from pydantic import BaseModel

    class Light(BaseModel):
        on: bool
        color: Literal["red", "green"]

    resp = oai.chat.completions.parse(model="tiny-random", messages=MSG, max_tokens=48, response_format=Light)
    parsed = resp.choices[0].message.parsed
    assert isinstance(parsed, Light)


def test_client_giving_up_does_not_hurt_the_server(client, server_url):
    body = {"messages": MSG, "response_format": {"type": "json_object"}, "max_tokens": 200}
    gave_up = False
    for timeout in (0.05, 0.01, 0.002, 0.0005):   # a warm tiny model can answer inside 50 ms
        try:
            httpx.post(server_url + "/v1/chat/completions", json=body, timeout=timeout)
        except httpx.TimeoutException:
            gave_up = True
            break
    assert gave_up, "every request finished before its client's timeout"
    r = client.post("/v1/chat/completions", json={"messages": MSG, "guided_choice": ["x", "y"], "max_tokens": 8})
    assert r.status_code == 200
    assert client.get("/health").json()["status"] == "ok"


def test_a_cancelled_row_leaves_a_running_batch():
    """The batcher passes row_stop: a row past its deadline is dropped mid-batch (a typed timeout
    in its place) while its batch-mates finish normally."""
    import asyncio

    from dgemma_struct.errors import GenerationTimeout
    from dgemma_struct.server.batcher import Batcher
    from dgemma_struct.server.jobs import Job
    from dgemma_struct.testing import tiny_runtime

    rt = tiny_runtime()
    b = Batcher(rt, max_batch_size=4, max_wait_ms=1)
    loop = asyncio.new_event_loop()
    try:
        schema = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}
        from dgemma_struct.api import constraint_for

        c = constraint_for(schema, rt)
        jobs = [Job(p, c, GenerateOptions(max_new_tokens=48), time.monotonic() + 60, loop, future=loop.create_future()) for p in ("a", "b")]
        jobs[1].deadline = time.monotonic()  # its deadline passes as the batch starts
        got = {}
        for j in jobs:
            j.resolve = lambda v, j=j: got.__setitem__(j.prompt, v)  # capture what the worker hands back
        b.run_jobs(jobs)
        assert isinstance(got["b"], GenerationTimeout)
        assert not isinstance(got["a"], Exception)
    finally:
        loop.close()


def test_a_job_carries_one_options_object_to_its_row():
    """HTTP fields become a GenerateOptions once; the job carries it and the scheduler row is built
    from it (no knob is passed through the server's signatures one by one)."""
    from types import SimpleNamespace

    from dgemma_struct.server.batcher import Batcher
    from dgemma_struct.server.generation import row_request
    from dgemma_struct.server.protocol import generation_options
    from dgemma_struct.testing import tiny_runtime

    rt = tiny_runtime()
    req = SimpleNamespace(seed=-1, temperature=0.7, top_p=0.9, max_thinking_tokens=None)
    opts = generation_options(req, max_tokens=12, logprobs=2)
    assert (opts.max_new_tokens, opts.seed, opts.temperature, opts.top_p, opts.logprobs) == (12, 2 ** 63 - 1, 0.7, 0.9, 2)
    b = Batcher(rt, max_batch_size=2)

    async def make():
        return b._job("hi", None, opts, {"max_new_tokens": 8}, 30.0)
    job = asyncio.run(make())
    assert job.options.max_new_tokens == 8 and job.options.logprobs == 2
    row = row_request(rt, job, max_repairs=1)
    assert (row.max_new_tokens, row.seed, row.temperature, row.top_p, row.logprobs) == (8, 2 ** 63 - 1, 0.7, 0.9, 2)
    with pytest.raises(TypeError, match="max_repairs"):
        asyncio.run(b.submit("hi", None, max_repairs=3))
