"""pydantic-ai against a real uvicorn on 127.0.0.1: ``Agent(OpenAIChatModel(id,
provider=OpenAIProvider(base_url=..., api_key=...)), output_type=...)``.

Covered:

* ``Agent(model, output_type=Person).run_sync(...)``, pydantic-ai's default *tool output* mode: it sends
  ``tools=[final_result (strict)]`` with ``tool_choice="required"``; the output is a validated
  ``Person``, from a ``final_result`` tool call with ``finish_reason`` ``tool_call``;
* ``output_type=[Person, Pet]``: two output tools (``final_result_Person``, ``final_result_Pet``), one of
  them called, the output an instance of that class;
* ``run_sync(..., message_history=first.all_messages())``: the second request carries the assistant
  ``tool_calls`` and the ``tool`` message of the first run, and still ends in a validated ``Person``;
* ``run_stream_sync(...)`` in tool output mode: streamed tool-call deltas, ``get_output()`` a ``Person``;
* ``output_type=NativeOutput(Person)``: ``response_format`` json_schema (strict), a validated ``Person``
  from the text.

The tiny random model writes noise, so only shapes and validity are asserted, never values. pydantic-ai
sends no telemetry without logfire installed; every request goes to 127.0.0.1.
"""
from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, Field

pydantic_ai = pytest.importorskip("pydantic_ai")
from pydantic_ai import Agent, NativeOutput  # noqa: E402
from pydantic_ai.messages import ModelResponse, ToolCallPart  # noqa: E402
from pydantic_ai.models.openai import OpenAIChatModel  # noqa: E402
from pydantic_ai.providers.openai import OpenAIProvider  # noqa: E402

PROMPT = "Ada Lovelace, 36, is an engineer."
SETTINGS = {"max_tokens": 96, "seed": 0, "timeout": 180}


# No numeric bounds (ge/le) in the output models: the tool-call grammar does not express
# minimum/maximum (docs/tools.md, "Guarantees"), repair has to, and the random model fails it. Lengths,
# enums and Literal ints are in the grammar.
class Person(BaseModel):
    """A person."""
    name: str = Field(max_length=24)
    age: int
    role: Literal["engineer", "manager", "artist"]


class Pet(BaseModel):
    """A pet."""
    species: Literal["cat", "dog"]
    legs: Literal[0, 2, 4]


@pytest.fixture(scope="module")
def server_url(embedded_server_url):
    """These clients run against the embedded model (the issue's bar: valid tool arguments on it)."""
    return embedded_server_url


@pytest.fixture(scope="module")
def model(server_url, model_id):
    return OpenAIChatModel(model_id, provider=OpenAIProvider(base_url=f"{server_url}/v1", api_key="unused"))


def _agent(model, output_type):
    return Agent(model, output_type=output_type, model_settings=SETTINGS, retries=0)


def _last_response(result) -> ModelResponse:
    responses = [m for m in result.all_messages() if isinstance(m, ModelResponse)]
    assert responses
    return responses[-1]


def _final_tool_call(result) -> ToolCallPart:
    response = _last_response(result)
    assert response.finish_reason == "tool_call"
    calls = [p for p in response.parts if isinstance(p, ToolCallPart)]
    assert len(calls) == 1, response.parts
    return calls[0]


def test_tool_output_default_mode(model):
    result = _agent(model, Person).run_sync(PROMPT)
    assert isinstance(result.output, Person)
    Person.model_validate(result.output.model_dump())
    call = _final_tool_call(result)
    assert call.tool_name == "final_result"
    assert Person.model_validate(call.args_as_dict()) == result.output


def test_tool_output_union_two_output_tools(model):
    result = _agent(model, [Person, Pet]).run_sync("Rex is a dog with four legs.")
    assert isinstance(result.output, (Person, Pet))
    call = _final_tool_call(result)
    assert call.tool_name == f"final_result_{type(result.output).__name__}"
    type(result.output).model_validate(call.args_as_dict())


def test_tool_output_with_message_history(model):
    agent = _agent(model, Person)
    first = agent.run_sync(PROMPT)
    second = agent.run_sync("And Grace Hopper, 85, a manager?", message_history=first.all_messages())
    assert isinstance(second.output, Person)
    assert _final_tool_call(second).tool_name == "final_result"
    assert len(second.all_messages()) > len(first.all_messages())


def test_tool_output_streamed(model):
    result = _agent(model, Person).run_stream_sync(PROMPT)
    out = result.get_output()
    assert isinstance(out, Person)
    Person.model_validate(out.model_dump())
    assert result.response.finish_reason == "tool_call"


def test_native_output(model):
    result = _agent(model, NativeOutput(Person)).run_sync(PROMPT)
    assert isinstance(result.output, Person)
    response = _last_response(result)
    assert response.finish_reason == "stop"
    assert not [p for p in response.parts if isinstance(p, ToolCallPart)]
    Person.model_validate(result.output.model_dump())
