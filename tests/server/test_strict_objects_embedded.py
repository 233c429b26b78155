"""Strict objects with the embedded model: outputs for pydantic models carry no undeclared keys in
``.text``, in streams and in the server's ``content`` (``strict: true``), across seeds (issue 23)."""
from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from dgemma_struct.testing import embedded_model_available

pytestmark = pytest.mark.skipif(not embedded_model_available(),
                                reason="src/dgemma_struct/embedded/model.safetensors is missing")


class Person(BaseModel):
    name: str
    age: int
    email: str


class City(BaseModel):
    city: str
    country: str


class Trip(BaseModel):
    traveller: str
    to: City


CASES = [(Person, "Extract the person as JSON.\nAda Lovelace, 36, writes from ada@example.com."),
         (City, "Extract the city as JSON.\nWe met in Lyon, France."),
         (Trip, "Extract the trip as JSON.\nBob flies to Osaka in Japan next week.")]
SEEDS = range(8)


def _undeclared(value, model) -> list[str]:
    """Keys of ``value`` (a parsed output) that ``model`` does not declare, recursively."""
    bad = [k for k in value if k not in model.model_fields]
    for name, f in model.model_fields.items():
        sub = f.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel) and isinstance(value.get(name), dict):
            bad += [f"{name}.{k}" for k in _undeclared(value[name], sub)]
    return bad


@pytest.fixture(scope="module")
def rt():
    from dgemma_struct import DiffusionRuntime
    return DiffusionRuntime.default(device="cpu")


def _text_of(pairs):
    out = []
    for model, text in pairs:
        try:
            out.append((model, json.loads(text)))
        except ValueError:
            pass  # a failed generation has no keys to check
    return out


def test_generate_and_stream_text_have_no_undeclared_keys(rt):
    from dgemma_struct import generate_json, stream
    from dgemma_struct.errors import DgemmaStructError
    texts = []
    for model, prompt in CASES:
        for seed in SEEDS:
            try:
                r = generate_json(prompt, model, runtime=rt, seed=seed, max_new_tokens=48, return_details=True)
                texts.append((model, r.text))
            except DgemmaStructError as e:
                texts.append((model, getattr(e, "partial_text", "") or ""))
        try:
            *_, last = stream(prompt, model, runtime=rt, seed=0, max_new_tokens=48)
            texts.append((model, last.text))
        except DgemmaStructError:
            pass
    parsed = _text_of(texts)
    assert len(parsed) >= len(CASES) * len(SEEDS) // 2
    assert [(m.__name__, v) for m, v in parsed if _undeclared(v, m)] == []


def test_server_content_strict_has_no_undeclared_keys(rt):
    import openai
    from server_harness import running_server
    with running_server(rt) as url:
        oai = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        texts = []
        for model, prompt in CASES:
            for seed in SEEDS[:2]:
                resp = oai.chat.completions.create(
                    model="dgemma-struct-embedded", messages=[{"role": "user", "content": prompt}], max_tokens=48, seed=seed,
                    response_format={"type": "json_schema", "json_schema": {
                        "name": model.__name__, "schema": model.model_json_schema(), "strict": True}})
                texts.append((model, resp.choices[0].message.content or ""))
    parsed = _text_of(texts)
    assert parsed and [(m.__name__, v) for m, v in parsed if _undeclared(v, m)] == []
