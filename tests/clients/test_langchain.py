"""langchain-openai against a real uvicorn on 127.0.0.1: ``ChatOpenAI(base_url=...)`` calls.

Covered:

* ``ChatOpenAI.bind_tools([GetWeather], tool_choice="GetWeather").invoke(...)`` (a named
  ``tool_choice``): one tool call whose args validate against the tool's JSON schema,
  ``finish_reason == "tool_calls"``;
* ``bind_tools([GetWeather, GetTime], tool_choice="any").stream(...)`` (``tool_choice: "required"``,
  streamed tool-call deltas merged by langchain): every call names a bound tool, its args validate;
* a second turn on the history ``[HumanMessage, AIMessage(tool_calls), ToolMessage...]`` (the server
  parses langchain's assistant ``tool_calls`` and ``tool`` messages) through
  ``with_structured_output(Report, method="json_schema")``;
* ``with_structured_output(Person, method="function_calling", include_raw=True)``: a validated ``Person``,
  parsed by langchain from the forced tool call, no parsing error;
* ``with_structured_output(Person, method="json_schema", include_raw=True)``: ``response_format`` json_schema
  (strict), a validated ``Person`` from the content, ``finish_reason == "stop"``.

The tiny random model writes noise, so only shapes and validity are asserted, never values. The conftest
turns langsmith tracing off; every request goes to 127.0.0.1.
"""
from __future__ import annotations

from typing import Literal

import jsonschema
import pytest
from pydantic import BaseModel, Field

langchain_openai = pytest.importorskip("langchain_openai")
from langchain_core.messages import AIMessageChunk, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.utils.function_calling import convert_to_openai_tool  # noqa: E402


class GetWeather(BaseModel):
    """Get the current weather in a city."""
    city: str = Field(max_length=20)
    unit: Literal["celsius", "fahrenheit"]


class GetTime(BaseModel):
    """Get the local time in a time zone."""
    timezone: Literal["UTC", "CET", "PST"]


# The tool-call grammar enforces Person's age bounds (docs/tools.md, "Guarantees"); Report goes through
# response_format, whose JSON grammar enforces its bounds.
class Person(BaseModel):
    """A person."""
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=150)
    role: Literal["engineer", "manager", "artist"]


class Report(BaseModel):
    summary: str = Field(max_length=40)
    temperature: int = Field(ge=-50, le=60)


SCHEMAS = {t.__name__: convert_to_openai_tool(t)["function"]["parameters"] for t in (GetWeather, GetTime)}
PERSON_PROMPT = "Extract the person.\nAda Lovelace, 36, is an engineer."


@pytest.fixture(scope="module")
def server_url(embedded_server_url):
    """These clients run against the embedded model (the issue's bar: valid tool arguments on it)."""
    return embedded_server_url


@pytest.fixture(scope="module")
def llm(server_url, model_id):
    return langchain_openai.ChatOpenAI(model=model_id, base_url=f"{server_url}/v1", api_key="unused",
                                       max_retries=0, timeout=180, max_tokens=96, seed=0)


def _check_calls(tool_calls):
    assert tool_calls, "no tool call"
    for call in tool_calls:
        assert call["name"] in SCHEMAS, call
        jsonschema.validate(call["args"], SCHEMAS[call["name"]])
        assert call["id"]


def test_bind_tools_named_tool_choice(llm):
    msg = llm.bind_tools([GetWeather], tool_choice="GetWeather").invoke("What is the weather in Paris?")
    assert msg.response_metadata["finish_reason"] == "tool_calls"
    assert not msg.invalid_tool_calls
    assert [c["name"] for c in msg.tool_calls] == ["GetWeather"]
    _check_calls(msg.tool_calls)
    GetWeather.model_validate(msg.tool_calls[0]["args"])


def test_bind_tools_any_streamed_then_tool_result_round_trip(llm):
    bound = llm.bind_tools([GetWeather, GetTime], tool_choice="any")
    first = HumanMessage("What is the weather in Paris, and the time in CET?")
    merged = None
    for chunk in bound.stream([first]):
        assert isinstance(chunk, AIMessageChunk)
        merged = chunk if merged is None else merged + chunk
    assert merged.response_metadata["finish_reason"] == "tool_calls"
    assert not merged.invalid_tool_calls
    _check_calls(merged.tool_calls)

    # second turn: langchain sends the assistant tool_calls and one tool message per call
    history = [first, merged, *(ToolMessage(content='{"ok": true, "temperature": 18}', tool_call_id=c["id"])
                                for c in merged.tool_calls)]
    out = llm.with_structured_output(Report, method="json_schema", include_raw=True).invoke(history)
    assert out["parsing_error"] is None
    assert isinstance(out["parsed"], Report)
    Report.model_validate(out["parsed"].model_dump())


def test_with_structured_output_function_calling(llm):
    out = llm.with_structured_output(Person, method="function_calling", include_raw=True).invoke(PERSON_PROMPT)
    assert out["parsing_error"] is None
    assert out["raw"].response_metadata["finish_reason"] == "tool_calls"
    assert [c["name"] for c in out["raw"].tool_calls] == ["Person"]
    assert isinstance(out["parsed"], Person)
    Person.model_validate(out["parsed"].model_dump())


def test_with_structured_output_json_schema(llm):
    out = llm.with_structured_output(Person, method="json_schema", include_raw=True).invoke(PERSON_PROMPT)
    assert out["parsing_error"] is None
    assert out["raw"].response_metadata["finish_reason"] == "stop"
    assert not out["raw"].tool_calls
    assert isinstance(out["parsed"], Person)
    Person.model_validate_json(out["raw"].content)
