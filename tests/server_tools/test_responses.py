"""Results -> response bodies and SSE chunks, parsed by the openai SDK's own types (and its
stream accumulator), so what the server sends is what OpenAI clients read."""
import json

import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import BaseModel, Field

from dgemma_struct.results import GenerationStats
from dgemma_struct.server.tool_calls import (chat_choice, chat_message, new_call_id, stream_chunks, tool_request_of,
                                             tool_result_of)
from dgemma_struct.tools import ToolCall, ToolCallResult

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}
TOOLS = tool_request_of({"tools": [WEATHER, ADD]})
LEGACY = tool_request_of({"functions": [WEATHER["function"], ADD["function"]]})


def result(*calls, content=None, finish="stop") -> ToolCallResult:
    return ToolCallResult(calls=[ToolCall(name=n, arguments=a) for n, a in calls], content=content, text="",
                          stats=GenerationStats(finish_reason=finish))


TWO = result(("get_weather", {"city": "Zürich \"Nord\" <x>"}), ("add", {"a": 2, "b": -3}))


def completion(choices) -> ChatCompletion:
    return ChatCompletion.model_validate({"id": "chatcmpl-1", "object": "chat.completion", "created": 1,
                                          "model": "m", "choices": choices,
                                          "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}})


def test_call_ids():
    ids = {new_call_id() for _ in range(100)}
    assert len(ids) == 100 and all(i.startswith("call_") and len(i) == 29 for i in ids)


def test_tool_calls_message_through_the_sdk():
    c = completion([chat_choice(0, TWO, TOOLS)])
    ch = c.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    tc = ch.message.tool_calls
    assert [t.function.name for t in tc] == ["get_weather", "add"] and [t.type for t in tc] == ["function"] * 2
    assert json.loads(tc[0].function.arguments) == {"city": "Zürich \"Nord\" <x>"}
    assert json.loads(tc[1].function.arguments) == {"a": 2, "b": -3}
    assert tc[0].id == TWO.calls[0].id and tc[0].id != tc[1].id


def test_text_answer_when_the_model_does_not_call():
    msg, finish = chat_message(result(content="It is sunny."), TOOLS)
    assert finish == "stop" and msg["content"] == "It is sunny." and "tool_calls" not in msg
    c = completion([chat_choice(0, result(content="cut", finish="length"), TOOLS)])
    assert c.choices[0].finish_reason == "length" and c.choices[0].message.tool_calls is None


def test_legacy_function_call_through_the_sdk():
    c = completion([chat_choice(0, TWO, LEGACY)])
    ch = c.choices[0]
    assert ch.finish_reason == "function_call" and ch.message.tool_calls is None
    assert ch.message.function_call.name == "get_weather"
    assert json.loads(ch.message.function_call.arguments) == {"city": "Zürich \"Nord\" <x>"}


def test_result_objects_with_a_value_are_accepted():
    class Row:
        value = TWO
    assert tool_result_of(Row()) is TWO
    with pytest.raises(TypeError):
        tool_result_of(object())


def _accumulate(chunks):
    """What openai's ChatCompletionStreamState (used by client.chat.completions.stream) builds."""
    from openai.lib.streaming.chat import ChatCompletionStreamState

    state = ChatCompletionStreamState()
    for ch in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(ch))
    return state.get_final_completion()


def test_stream_chunks_sequence():
    chunks = stream_chunks(TWO, TOOLS, rid="chatcmpl-1", model="m", created=1, fragment_chars=5)
    parsed = [ChatCompletionChunk.model_validate(c) for c in chunks]
    assert parsed[0].choices[0].delta.role == "assistant"
    first = parsed[1].choices[0].delta.tool_calls[0]
    assert (first.index, first.id, first.type, first.function.name, first.function.arguments) == (
        0, TWO.calls[0].id, "function", "get_weather", "")
    frags = [p.choices[0].delta.tool_calls[0] for p in parsed[2:-1] if p.choices[0].delta.tool_calls]
    assert all(f.function.name is None or f.id is not None for f in frags)
    args0 = "".join(f.function.arguments for f in frags if f.index == 0 and f.id is None)
    assert json.loads(args0) == TWO.calls[0].arguments
    assert all(len(f.function.arguments) <= 5 for f in frags)
    assert parsed[-1].choices[0].finish_reason == "tool_calls" and parsed[-1].choices[0].delta.tool_calls is None
    assert all(p.choices[0].finish_reason is None for p in parsed[:-1])
    final = _accumulate(chunks)
    tc = final.choices[0].message.tool_calls
    assert [t.function.name for t in tc] == ["get_weather", "add"]
    assert [json.loads(t.function.arguments) for t in tc] == [c.arguments for c in TWO.calls]
    assert final.choices[0].finish_reason == "tool_calls"


def test_stream_legacy_and_text():
    chunks = stream_chunks(TWO, LEGACY, rid="r", model="m", created=1, fragment_chars=4)
    parsed = [ChatCompletionChunk.model_validate(c) for c in chunks]
    assert parsed[1].choices[0].delta.function_call.name == "get_weather"
    assert parsed[1].choices[0].delta.function_call.arguments == ""
    args = "".join(p.choices[0].delta.function_call.arguments for p in parsed[2:-1])
    assert json.loads(args) == TWO.calls[0].arguments and parsed[-1].choices[0].finish_reason == "function_call"
    text = stream_chunks(result(content="Hello there"), TOOLS, rid="r", model="m", created=1)
    final = _accumulate(text)
    assert final.choices[0].message.content == "Hello there" and final.choices[0].finish_reason == "stop"
    second = stream_chunks(TWO, TOOLS, rid="r", model="m", created=1, index=2)
    assert all(c["choices"][0]["index"] == 2 for c in second)


class Forecast(BaseModel):
    """Get the forecast."""
    city: str = Field(description="City name")
    days: int


def test_pydantic_function_tool_is_accepted_and_parsed_back():
    decl = openai.pydantic_function_tool(Forecast)
    assert decl["function"]["strict"] is True
    tr = tool_request_of({"tools": [decl], "tool_choice": {"type": "function", "function": {"name": "Forecast"}}})
    assert tr.tools[0].strict and tr.tool_choice == {"name": "Forecast"}
    res = result(("Forecast", {"city": "Oslo", "days": 3}))
    body = completion([chat_choice(0, res, tr)]).model_dump()
    # what client.chat.completions.parse(tools=[pydantic_function_tool(Forecast)]) does with the answer
    from openai.lib._parsing._completions import parse_chat_completion

    parsed = parse_chat_completion(response_format=openai.NOT_GIVEN, input_tools=[decl],
                                   chat_completion=ChatCompletion.model_validate(body))
    call = parsed.choices[0].message.tool_calls[0]
    assert call.function.parsed_arguments == Forecast(city="Oslo", days=3)


def test_strict_schema_of_openai_helper_for_nested_models():
    from openai.lib._pydantic import to_strict_json_schema

    class Place(BaseModel):
        city: str
        country: str | None = None

    class Trip(BaseModel):
        stops: list[Place]

    schema = to_strict_json_schema(Trip)
    tr = tool_request_of({"tools": [{"type": "function", "function": {"name": "plan", "strict": True,
                                                                      "parameters": schema}}]})
    assert tr.tools[0].parameters == schema


def test_length_error_rows():
    from dgemma_struct.errors import LengthError

    half = LengthError("out of max_tokens", partial_text='<|tool_call>call:add{a:<|"|>')
    c = completion([chat_choice(0, half, TOOLS)])
    assert c.choices[0].finish_reason == "length" and c.choices[0].message.content is None
    assert c.choices[0].message.tool_calls is None
    text = LengthError("out of max_tokens", partial_text="The weather")
    assert chat_message(text, TOOLS) == ({"role": "assistant", "content": "The weather", "refusal": None}, "length")
    with pytest.raises(openai.LengthFinishReasonError):   # what the SDK's stream helpers raise, as for OpenAI
        _accumulate(stream_chunks(half, TOOLS, rid="r", model="m", created=1))


def test_completion_body_and_sse_events():
    from dgemma_struct.errors import LengthError
    from dgemma_struct.server.tool_calls import completion_body, row_tokens, sse_events

    class Row:
        value = TWO
        token_ids = [1, 2, 3]
    half = LengthError("x", partial_text="abc")
    assert row_tokens(Row(), len) == 3 and row_tokens(half, len) == 3
    body = completion_body([Row(), half], TOOLS, rid="chatcmpl-9", model="m", created=5, prompt_tokens=10,
                           completion_tokens=6)
    c = ChatCompletion.model_validate(body)
    assert [ch.finish_reason for ch in c.choices] == ["tool_calls", "length"] and c.usage.total_tokens == 16
    events = list(sse_events([Row()], TOOLS, rid="chatcmpl-9", model="m", created=5,
                             usage={"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}))
    assert events[-1] == "data: [DONE]\n\n" and all(e.startswith("data: ") and e.endswith("\n\n") for e in events)
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert ChatCompletionChunk.model_validate(chunks[-1]).usage.total_tokens == 3
    final = _accumulate(chunks)
    assert [json.loads(t.function.arguments) for t in final.choices[0].message.tool_calls] == \
        [x.arguments for x in TWO.calls]
