"""instructor against a real uvicorn on 127.0.0.1, and the request bodies instructor sends.

instructor itself cannot be installed with this project's lock today: every instructor release
requires ``jiter<0.15`` (constraints.txt pins ``jiter==0.19.0``, openai's), and 1.17.0 also
``rich<15`` (pinned ``rich==15.0.0``). The tests that import it skip until the lock admits it. The
wire-shape tests below send exactly what instructor sends, with the openai SDK, so the server side
is covered now:

* instructor >= 1.4 ``Mode.JSON_SCHEMA``: ``response_format={"type": "json_schema", "json_schema":
  {"name": Model.__name__, "schema": Model.model_json_schema()}}``;
* instructor 1.3.x ``Mode.JSON_SCHEMA``: ``response_format={"type": "json_object", "schema": ...}``;
* ``Mode.JSON`` (all 1.x): ``response_format={"type": "json_object"}`` with the schema only in a
  system message - the server can only guarantee *a JSON object* there.
"""
from __future__ import annotations

import json
from typing import Literal

import pytest
from pydantic import BaseModel, Field

PROMPT = "Extract the name, age and role as JSON.\nAda Lovelace, 36, is an engineer."


class Person(BaseModel):
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=150)
    role: Literal["engineer", "manager", "artist"]


def _messages():
    return [{"role": "user", "content": PROMPT}]


# ------------------------------------------------------------------ wire shapes (openai SDK)
def test_instructor_json_schema_wire_shape_n2(oai, model_id):
    resp = oai.chat.completions.create(
        model=model_id, messages=_messages(), max_tokens=64, n=2, seed=0,
        response_format={"type": "json_schema",
                         "json_schema": {"name": Person.__name__, "schema": Person.model_json_schema()}})
    assert len(resp.choices) == 2
    for choice in resp.choices:
        assert choice.finish_reason == "stop"
        Person.model_validate_json(choice.message.content)


def test_instructor_legacy_json_object_with_schema_wire_shape(oai, model_id):
    resp = oai.chat.completions.create(
        model=model_id, messages=_messages(), max_tokens=64, seed=0,
        response_format={"type": "json_object", "schema": Person.model_json_schema()})
    assert resp.choices[0].finish_reason == "stop"
    Person.model_validate_json(resp.choices[0].message.content)


def test_instructor_json_mode_wire_shape_is_a_json_object(oai, model_id):
    system = "Return JSON that matches this json_schema:\n" + json.dumps(Person.model_json_schema())
    resp = oai.chat.completions.create(
        model=model_id, messages=[{"role": "system", "content": system}, *_messages()], max_tokens=64, seed=0,
        response_format={"type": "json_object"})
    assert resp.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(resp.choices[0].message.content), dict)


# ------------------------------------------------------------------ instructor itself
@pytest.fixture(scope="module")
def instructor_mod():
    return pytest.importorskip("instructor", reason="instructor is not installable with constraints.txt "
                               "(jiter<0.15 vs jiter==0.19.0; rich<15 vs rich==15.0.0)")


def _client(instructor_mod, server_url, mode):
    from openai import OpenAI

    return instructor_mod.from_openai(OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0,
                                             timeout=180), mode=mode)


def test_instructor_mode_json_schema(instructor_mod, server_url, model_id):
    client = _client(instructor_mod, server_url, instructor_mod.Mode.JSON_SCHEMA)
    person = client.chat.completions.create(model=model_id, response_model=Person, messages=_messages(),
                                            max_tokens=64, max_retries=0, seed=0)
    assert isinstance(person, Person)
    Person.model_validate(person.model_dump())


@pytest.mark.xfail(strict=False, reason=(
    "not the server's: instructor >= 1.4 Mode.JSON sends json_object with the schema only in a system "
    "message, so the server guarantees a JSON object, not a Person; the tiny random model cannot follow "
    "the prompt (passes with a real checkpoint, or with instructor 1.3.x, which sent the schema)"))
def test_instructor_mode_json(instructor_mod, server_url, model_id):
    client = _client(instructor_mod, server_url, instructor_mod.Mode.JSON)
    person = client.chat.completions.create(model=model_id, response_model=Person, messages=_messages(),
                                            max_tokens=64, max_retries=0, seed=0)
    assert isinstance(person, Person)
