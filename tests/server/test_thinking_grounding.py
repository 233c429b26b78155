"""Thinking and grounding over the server, against a real uvicorn on loopback.

Thinking runs on a random-weight real-shape DiffusionGemma with the Gemma 4 tokenizer (the
checkpoint writer of tests/server_tools) and on the embedded model (which speaks Gemma 4's dialect);
on a model whose tokenizer has no thought-channel tokens a thinking request is a 400. Grounding runs
on the embedded model."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import httpx
import jsonschema
import pytest
from server_harness import running_server

_TOOLS_CONFTEST = Path(__file__).resolve().parents[1] / "server_tools" / "conftest.py"


def _tools_conftest():
    spec = importlib.util.spec_from_file_location("server_tools_fixtures", _TOOLS_CONFTEST)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "city": {"type": "string"}},
          "required": ["name", "city"], "additionalProperties": False}
SOURCE_PROMPT = "Extract the name and city as JSON.\nTara Zhang lives in Oslo and works as a baker."


# ---------------------------------------------------------------------------------------------- embedded
@pytest.fixture(scope="module")
def embedded_url():
    from dgemma_struct.runtime import DiffusionRuntime

    with running_server(DiffusionRuntime.default(), max_tokens_cap=256, default_max_tokens=64,
                        isolate_compiles=False) as url:
        yield url


@pytest.fixture()
def eclient(embedded_url):
    with httpx.Client(base_url=embedded_url, timeout=120) as c:
        yield c


def _chat(prompt: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": prompt}], "max_tokens": 48, "seed": 0, **extra}


@pytest.fixture(scope="module")
def gemma3_client(tiny_gemma3_runtime):
    with running_server(tiny_gemma3_runtime, max_tokens_cap=64, default_max_tokens=16,
                        isolate_compiles=False) as url, httpx.Client(base_url=url, timeout=120) as c:
        yield c


@pytest.mark.parametrize("extra,param", [
    ({"chat_template_kwargs": {"enable_thinking": True}}, "chat_template_kwargs.enable_thinking"),
    ({"thinking": "optional"}, "thinking"),
])
def test_thinking_on_a_model_without_channel_tokens_is_a_precise_400(gemma3_client, extra, param):
    r = gemma3_client.post("/v1/chat/completions", json=_chat("Is the sky blue?", response_format={
        "type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}, **extra))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "thinking_unsupported" and err["param"] == param
    assert "<|channel>" in err["message"]
    # the server is unharmed: the same request without thinking is served
    ok = gemma3_client.post("/v1/chat/completions", json=_chat("Is the sky blue?", response_format={
        "type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
        chat_template_kwargs={"enable_thinking": False}))
    assert ok.status_code == 200, ok.text
    msg = ok.json()["choices"][0]["message"]
    assert "reasoning_content" not in msg
    jsonschema.validate(json.loads(msg["content"]), SCHEMA)


def test_tools_on_a_model_without_tool_tokens_is_a_precise_400(gemma3_client):
    r = gemma3_client.post("/v1/chat/completions", json=_chat("hi", tools=[
        {"type": "function", "function": {"name": "f"}}]))
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == ("tools", "tools_unsupported_by_model")


def test_thinking_then_json_on_the_embedded_model(eclient):
    """The embedded model speaks Gemma 4's dialect: with thinking on it writes a thought, then the
    constrained answer; the thought comes back as ``reasoning_content``, never in ``content``."""
    r = eclient.post("/v1/chat/completions", json=_chat(SOURCE_PROMPT, max_tokens=96, response_format={
        "type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
        chat_template_kwargs={"enable_thinking": True}))
    assert r.status_code == 200, r.text
    msg = r.json()["choices"][0]["message"]
    value = json.loads(msg["content"])
    jsonschema.validate(value, PERSON)
    assert msg.get("reasoning_content") and "<|channel>" not in msg["reasoning_content"]
    assert "<channel|>" not in msg["content"] and "thought" not in msg["content"]


def test_bad_enable_thinking_value_is_400(eclient):
    r = eclient.post("/v1/chat/completions", json=_chat("hi", chat_template_kwargs={"enable_thinking": "yes"}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs.enable_thinking"


def _document(prompt: str) -> str:
    """The default grounding source of an instruction-then-document prompt: its document part."""
    return prompt.split("\n", 1)[1]


def _assert_grounded(choice: dict, content: str, source: str) -> None:
    value = json.loads(content)
    jsonschema.validate(value, PERSON)
    spans, docs = choice["grounding"]["spans"], choice["grounding"]["sources"]
    assert docs == [source], docs
    assert sorted(s["pointer"] for s in spans) == ["/city", "/name"], spans
    for s in spans:   # every grounded value is verbatim the source at its offsets
        assert s["doc"] == 0 and docs[0][s["start"]:s["end"]] == s["text"] == value[s["path"][0]], s


def test_grounding_request_field(eclient):
    r = eclient.post("/v1/chat/completions", json=_chat(SOURCE_PROMPT, grounding=True, response_format={
        "type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}))
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    content = choice["message"]["content"]
    value = json.loads(content)
    assert value["name"] in SOURCE_PROMPT and value["city"] in SOURCE_PROMPT
    _assert_grounded(choice, content, _document(SOURCE_PROMPT))


def test_grounding_schema_marker_and_explicit_source_on_completions(eclient):
    doc = "Ada Lovelace was born in London."
    schema = {"type": "object", "properties": {"name": {"type": "string", "x-grounded": True},
                                               "city": {"type": "string", "x-grounded": True}},
              "required": ["name", "city"], "additionalProperties": False}
    r = eclient.post("/v1/completions", json={"prompt": "Extract the name and city as JSON.", "max_tokens": 48,
                                              "seed": 1, "guided_json": schema, "grounding": {"source": doc}})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    value = json.loads(choice["text"])
    assert value["name"] in doc and value["city"] in doc
    _assert_grounded(choice, choice["text"], doc)


def test_grounding_streams_spans_on_the_final_chunk(eclient):
    body = _chat(SOURCE_PROMPT, grounding={"ground": "strings"}, stream=True,
                 response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}})
    with eclient.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ") and
                  line != "data: [DONE]"]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    final = events[-1]["choices"][0]
    assert final["finish_reason"] == "stop"
    _assert_grounded(final, text, _document(SOURCE_PROMPT))


@pytest.mark.parametrize("extra,code", [
    ({"grounding": {"ground": "everything"}}, "invalid_grounding"),
    ({"grounding": {"source": ""}}, "invalid_grounding"),
    ({"grounding": {"nope": 1}}, "invalid_grounding"),
])
def test_bad_grounding_is_400(eclient, extra, code):
    r = eclient.post("/v1/chat/completions", json=_chat(SOURCE_PROMPT, response_format={
        "type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}, **extra))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == code and r.json()["error"]["param"] == "grounding"


def test_grounding_without_a_schema_is_400(eclient):
    r = eclient.post("/v1/chat/completions", json=_chat(SOURCE_PROMPT, grounding=True,
                                                        structured_outputs={"regex": "[a-z]+"}))
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_grounding"


def test_unsatisfiable_grounded_field_is_400(eclient):
    schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[0-9]{9}$"}},
              "required": ["name"], "additionalProperties": False}
    r = eclient.post("/v1/chat/completions", json=_chat(SOURCE_PROMPT, grounding=True, response_format={
        "type": "json_schema", "json_schema": {"name": "p", "schema": schema}}))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_grounding"


# ---------------------------------------------------------------------------------------------- real shape
@pytest.fixture(scope="module")
def real_url(tmp_path_factory):
    mod = _tools_conftest()
    mod._need_gemma4()
    from dgemma_struct.runtime import DiffusionRuntime

    ckpt = mod.write_real_shape_checkpoint(tmp_path_factory.mktemp("b2_real_shape"))
    rt = DiffusionRuntime.from_pretrained(ckpt)
    with running_server(rt, max_tokens_cap=256, default_max_tokens=64, isolate_compiles=False,
                        request_timeout_s=300) as url:
        yield url


@pytest.fixture()
def rclient(real_url):
    with httpx.Client(base_url=real_url, timeout=600) as c:
        yield c


def test_thinking_then_json_on_real_shape(rclient):
    body = {"messages": [{"role": "user", "content": "Is it raining?"}], "max_tokens": 48, "seed": 0,
            "chat_template_kwargs": {"enable_thinking": True}, "max_thinking_tokens": 8,
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}}
    r = rclient.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    msg = r.json()["choices"][0]["message"]
    jsonschema.validate(json.loads(msg["content"]), SCHEMA)   # the answer alone: no thought, no stop token
    assert isinstance(msg["reasoning_content"], str)           # required: a thought block was written
    for marker in ("<|channel>", "<channel|>", "<turn|>"):
        assert marker not in msg["content"] and marker not in msg["reasoning_content"]

    # streamed: reasoning deltas first, then content; the same texts as the plain response
    with rclient.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as s:
        assert s.status_code == 200
        deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in s.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    kinds = [("r" if "reasoning_content" in d else "c") for d in deltas if d.get("reasoning_content") or d.get("content")]
    assert kinds == sorted(kinds, key=lambda k: k != "r")   # every reasoning delta before any content
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == msg["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == msg["content"]


def test_thinking_optional_free_text_on_real_shape(rclient):
    r = rclient.post("/v1/completions", json={"prompt": "Say hi.", "max_tokens": 16, "seed": 3,
                                              "thinking": "optional", "max_thinking_tokens": 4})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert "reasoning_content" in choice
    assert "<|channel>" not in choice["text"] and "<channel|>" not in choice["text"]


def test_grounding_per_prompt_sources_and_n(eclient):
    prompts = ["Extract the name and city as JSON.\nTara Zhang lives in Oslo.",
               "Extract the name and city as JSON.\nOmar Haddad moved to Lima last year."]
    r = eclient.post("/v1/completions", json={"prompt": prompts, "n": 2, "max_tokens": 48, "seed": 5,
                                              "grounding": True, "guided_json": PERSON})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert len(choices) == 4
    for i, choice in enumerate(choices):   # choice i*n + j is sample j of prompt i, grounded in prompt i
        _assert_grounded(choice, choice["text"], _document(prompts[i // 2]))


def test_thinking_and_plain_rows_in_one_batch_on_real_shape(rclient):
    from concurrent.futures import ThreadPoolExecutor

    rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    bodies = [{"messages": [{"role": "user", "content": "Yes or no?"}], "max_tokens": 32, "seed": 1,
               "response_format": rf, **extra}
              for extra in ({"thinking": True, "max_thinking_tokens": 4}, {})]
    with ThreadPoolExecutor(2) as ex:
        rs = list(ex.map(lambda b: rclient.post("/v1/chat/completions", json=b), bodies))
    assert [r.status_code for r in rs] == [200, 200], [r.text for r in rs]
    think, plain = (r.json()["choices"][0]["message"] for r in rs)
    assert isinstance(think["reasoning_content"], str) and "reasoning_content" not in plain
    for m in (think, plain):
        jsonschema.validate(json.loads(m["content"]), SCHEMA)
