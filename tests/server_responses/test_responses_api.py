"""``client.responses.create`` / ``.parse`` / ``.stream`` against the server: the bodies are exact
``openai.types.responses.Response`` objects, ``text_format`` gives valid values of ten pydantic models,
the stream is what the SDK's stream helper accumulates into the same final response."""
from __future__ import annotations

import datetime as dt
import json
import re
from enum import Enum
from typing import Literal, Optional

import httpx
import jsonschema
import pytest
from conftest import MODEL
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel, Field, TypeAdapter

PERSON_PROMPT = "Extract the name, age and email as JSON.\nYou can write to Julia Muller (45) at julia68@mail.org."


class Person(BaseModel):
    name: str
    age: int
    email: str


class Contact(BaseModel):
    name: str
    phone: str = Field(pattern=r"^\d{3}-\d{3}-\d{4}$")


class Color(str, Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Flag(BaseModel):
    ok: bool
    color: Color


class Order(BaseModel):
    order_id: str
    quantity: int = Field(ge=0, le=1000)
    price: float = Field(ge=0)
    status: Literal["pending", "shipped", "delivered", "cancelled"]


class Tags(BaseModel):
    tags: list[str] = Field(max_length=4)


class Address(BaseModel):
    city: str
    zip: str = Field(pattern=r"^\d{5}$")


class Employee(BaseModel):
    name: str
    address: Address


class Event(BaseModel):
    title: str
    day: dt.date


class Maybe(BaseModel):
    name: str
    nickname: Optional[str]


class Scores(BaseModel):
    scores: list[int] = Field(min_length=1, max_length=3)
    total: int


MODELS = [Person, Contact, Flag, Order, Tags, Address, Employee, Event, Maybe, Scores]


def test_create_is_an_exact_response_object(server_url, oai):
    body = httpx.post(server_url + "/v1/responses", json={"model": MODEL, "input": "Say hi", "max_output_tokens": 16,
                                                           "metadata": {"k": "v"}, "store": False}, timeout=120).json()
    Response.model_validate(body)                        # every field the SDK's type requires, of its type
    assert body["object"] == "response" and body["status"] in ("completed", "incomplete")
    assert body["metadata"] == {"k": "v"} and body["usage"]["total_tokens"] == (
        body["usage"]["input_tokens"] + body["usage"]["output_tokens"])
    assert "dgemma_stats" in body and body["output_text"] == body["output"][0]["content"][0]["text"]
    r = oai.responses.create(model=MODEL, input=[{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
                             instructions="Answer briefly.", max_output_tokens=16, temperature=0.0)
    assert r.output[0].type == "message" and isinstance(r.output_text, str)
    assert r.instructions == "Answer briefly."


def test_max_output_tokens_makes_an_incomplete_response(oai):
    r = oai.responses.create(model=MODEL, input=PERSON_PROMPT, max_output_tokens=3,
                             text={"format": {"type": "json_schema", "name": "p",
                                              "schema": Person.model_json_schema()}})
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].status == "incomplete"


def test_parse_ten_models_zero_invalid(oai):
    invalid = []
    for model in MODELS:
        prompt = PERSON_PROMPT if model is Person else f"Give a {model.__name__} as JSON."
        r = oai.responses.parse(model=MODEL, input=prompt, text_format=model, max_output_tokens=160, extra_body={"seed": 1})
        assert r.status == "completed", (model.__name__, r.output_text)
        if not isinstance(r.output_parsed, model):
            invalid.append(model.__name__)
        model.model_validate_json(r.output_text)        # the text itself, not only the SDK's parse
    assert invalid == []


def test_json_object_and_seed(oai):
    a = oai.responses.create(model=MODEL, input=PERSON_PROMPT, text={"format": {"type": "json_object"}},
                             max_output_tokens=96, extra_body={"seed": 7})
    b = oai.responses.create(model=MODEL, input=PERSON_PROMPT, text={"format": {"type": "json_object"}},
                             max_output_tokens=96, extra_body={"seed": 7})
    assert isinstance(json.loads(a.output_text), dict) and a.output_text == b.output_text


def test_stream_helper_accumulates_the_same_response(oai):
    kw = dict(model=MODEL, input=PERSON_PROMPT, text_format=Person, max_output_tokens=96, extra_body={"seed": 3})
    with oai.responses.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[-2:] == ["response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text and isinstance(final.output_parsed, Person)
    assert final.output_text == oai.responses.parse(**kw).output_text   # validated text only: as without stream


def test_stream_events_are_the_sdk_types(server_url):
    adapter = TypeAdapter(ResponseStreamEvent)
    with httpx.stream("POST", server_url + "/v1/responses", timeout=120,
                      json={"model": MODEL, "input": "Hi", "stream": True, "max_output_tokens": 12}) as resp:
        lines = [ln for ln in resp.iter_lines() if ln.startswith("data: ")]
    events = [json.loads(ln[6:]) for ln in lines]
    for e in events:
        adapter.validate_python(e)                       # each one an exact SDK event type
    assert events[-1]["type"] in ("response.completed", "response.incomplete")


def test_field_confidence_on_the_output(oai):
    r = oai.responses.create(model=MODEL, input=PERSON_PROMPT, max_output_tokens=96,
                             text={"format": {"type": "json_schema", "name": "p", "schema": Person.model_json_schema(),
                                              "strict": True}},
                             extra_body={"field_confidence": True, "seed": 1})
    conf = r.output[0].model_extra["field_confidence"]
    assert set(conf) == {"/name", "/age", "/email"} and all(0.0 <= p <= 1.0 for p in conf.values())
    jsonschema.validate(json.loads(r.output_text), Person.model_json_schema())


def test_reasoning_maps_to_the_thought_channel(oai):
    r = oai.responses.create(model=MODEL, input=PERSON_PROMPT, reasoning={"effort": "low"}, max_output_tokens=160,
                             text={"format": {"type": "json_schema", "name": "p", "schema": Person.model_json_schema()}})
    kinds = [o.type for o in r.output]
    assert kinds[-1] == "message" and set(kinds) <= {"reasoning", "message"}
    Person.model_validate_json(r.output_text)


@pytest.mark.parametrize("body,param", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"store": True}, "store"),
    ({"background": True}, "background"),
    ({"include": ["reasoning.encrypted_content"]}, "include"),
    ({"max_output_token": 5}, "max_output_token"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strictt": True}}},
     "text.format.strictt"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"tools": [{"type": "custom", "name": "c", "format": {"type": "grammar", "syntax": "regex",
                                                           "definition": "a(("}}]}, "tools.0.format.definition"),
    ({"tools": [{"type": "custom", "name": "c", "format": {"type": "grammar", "syntax": "lark",
                                                           "definition": "start: foo"}}]}, "tools.0.format.definition"),
    ({"tool_choice": {"type": "function", "name": "nope"},
      "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}]}, "tool_choice"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input.0.type"),
    ({"truncation": "auto"}, "truncation"),
])
def test_errors_name_the_field(server_url, body, param):
    resp = httpx.post(server_url + "/v1/responses", timeout=60,
                      json={"model": MODEL, "input": "x", "max_output_tokens": 8, **body})
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["code"], err


def test_chat_constraint_extensions_pass_through(oai):
    r = oai.responses.create(model=MODEL, input="Call 555-867-5309.", max_output_tokens=24,
                             extra_body={"guided_regex": r"\d{3}-\d{3}-\d{4}", "seed": 2})
    assert re.fullmatch(r"\d{3}-\d{3}-\d{4}", r.output_text)
    g = oai.responses.create(model=MODEL, input=PERSON_PROMPT, max_output_tokens=96,
                             text={"format": {"type": "json_schema", "name": "p", "schema": Person.model_json_schema()}},
                             extra_body={"grounding": True, "seed": 1})
    spans = g.output[0].model_extra["grounding"]["spans"]
    assert spans and all(s["text"] in PERSON_PROMPT and s["text"] == s["value"] for s in spans)
