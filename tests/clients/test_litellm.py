"""litellm against a real uvicorn on 127.0.0.1: ``completion(model="openai/<id>", api_base=...)`` with a
pydantic ``response_format``, a json_schema dict and a vLLM ``guided_choice`` in ``extra_body``.

The conftest sets ``LITELLM_LOCAL_MODEL_COST_MAP=True`` (and telemetry off) before litellm is
imported here, so importing it makes no request; every request goes to 127.0.0.1.
"""
from __future__ import annotations

import json

import jsonschema
import pytest
from pydantic import BaseModel

litellm = pytest.importorskip("litellm")
litellm.telemetry = False
litellm.drop_params = False          # never silently drop n / seed / response_format
litellm.success_callback = []
litellm.failure_callback = []


class Person(BaseModel):
    name: str
    age: int


def _completion(server_url, model_id, **kw):
    kw.setdefault("seed", 0)
    kw.setdefault("max_tokens", 64)
    return litellm.completion(
        model=f"openai/{model_id}", api_base=f"{server_url}/v1", api_key="unused", num_retries=0, timeout=180,
        messages=[{"role": "user", "content": "Extract the name and age as JSON.\nAda Lovelace is 36."}], **kw)


def _texts(resp, n):
    assert len(resp.choices) == n
    out = []
    for choice in resp.choices:
        assert choice.finish_reason == "stop", (choice.finish_reason, choice.message.content)
        out.append(choice.message.content)
    return out


def test_litellm_pydantic_response_format_n2(server_url, model_id):
    resp = _completion(server_url, model_id, response_format=Person, n=2)
    for text in _texts(resp, 2):
        Person.model_validate_json(text)


def test_litellm_json_schema_dict(server_url, model_id):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 150}},
              "required": ["name", "age"], "additionalProperties": False}
    resp = _completion(server_url, model_id, response_format={
        "type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}})
    (text,) = _texts(resp, 1)
    jsonschema.validate(json.loads(text), schema)


def test_litellm_vllm_guided_choice_in_extra_body(server_url, model_id):
    choices = ["positive", "negative", "neutral"]
    resp = _completion(server_url, model_id, max_tokens=8, extra_body={"guided_choice": choices})
    (text,) = _texts(resp, 1)
    assert text in choices
