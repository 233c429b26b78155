"""instructor against a real uvicorn on 127.0.0.1, and the request bodies instructor sends.

instructor itself (``Mode.TOOLS``, ``Mode.TOOLS_STRICT``, ``Mode.JSON_SCHEMA`` and its ``create_partial``
stream, ``Mode.JSON``) runs against the server; it needs ``jiter<0.15``, which is why the lock pins openai
3.3.0. The wire-shape tests send exactly what instructor sends, with the openai SDK (``n=2`` too):

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
    import instructor

    return instructor


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


def _tool_person(instructor_mod, server_url, model_id, mode):
    client = _client(instructor_mod, server_url, mode)
    person, completion = client.chat.completions.create_with_completion(
        model=model_id, response_model=Person, messages=_messages(), max_tokens=64, max_retries=0, seed=0)
    return person, completion


def test_instructor_mode_tools(instructor_mod, server_url, model_id):
    # Mode.TOOLS: tools=[Person as a function] with tool_choice naming it; instructor parses the call's
    # JSON-string arguments with pydantic (age bounds and the Literal come from the tool-call grammar)
    person, completion = _tool_person(instructor_mod, server_url, model_id, instructor_mod.Mode.TOOLS)
    assert isinstance(person, Person)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [c.function.name for c in choice.message.tool_calls] == ["Person"]
    Person.model_validate_json(choice.message.tool_calls[0].function.arguments)


def test_instructor_mode_tools_strict(instructor_mod, server_url, model_id):
    # Mode.TOOLS_STRICT sends "strict": true and an additionalProperties: false schema
    person, completion = _tool_person(instructor_mod, server_url, model_id, instructor_mod.Mode.TOOLS_STRICT)
    assert isinstance(person, Person)
    assert completion.choices[0].finish_reason == "tool_calls"
    args = completion.choices[0].message.tool_calls[0].function.arguments
    assert set(Person.model_validate_json(args).model_dump()) == set(json.loads(args))


def test_instructor_partial_stream_json_schema(instructor_mod, server_url, model_id):
    # create_partial streams: every yielded object is a partial Person built from a valid JSON prefix; the
    # last one is the whole, validated answer
    client = _client(instructor_mod, server_url, instructor_mod.Mode.JSON_SCHEMA)
    parts = list(client.chat.completions.create_partial(
        model=model_id, response_model=Person, messages=_messages(), max_tokens=64, max_retries=0, seed=0))
    assert parts
    Person.model_validate(parts[-1].model_dump())
