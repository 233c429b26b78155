"""OpenAI chat messages -> Gemma 4 chat template messages, checked against the real template."""
import pytest

from dgemma_struct.server.tool_calls import ToolRequestError, chat_prompt, template_messages, tool_request_of

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}

CONVERSATION = [
    {"role": "developer", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo, "}, {"type": "text", "text": "and 2+3?"}]},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 2}'}},
        {"id": "call_b", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
    {"role": "tool", "tool_call_id": "call_b", "content": "5"},
    {"role": "tool", "tool_call_id": "call_a", "content": [{"type": "text", "text": "3 C, rain"}]},
    {"role": "assistant", "content": "3 C and rain; 2+3 is 5."},
    {"role": "user", "content": "And Bergen?"},
]


def test_conversion():
    out = template_messages(CONVERSATION)
    assert out[0] == {"role": "system", "content": "Be brief."}
    assert out[1] == {"role": "user", "content": "Weather in Oslo, and 2+3?"}
    calls = out[2]["tool_calls"]
    assert calls[0] == {"id": "call_a", "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}}
    assert calls[1]["function"]["arguments"] == {"a": 2, "b": 3}
    assert out[3] == {"role": "tool", "tool_call_id": "call_b", "name": "add", "content": "5"}
    assert out[4] == {"role": "tool", "tool_call_id": "call_a", "name": "get_weather", "content": "3 C, rain"}
    assert out[5] == {"role": "assistant", "content": "3 C and rain; 2+3 is 5."}


def test_legacy_function_messages_and_missing_ids():
    out = template_messages([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "function_call": {"name": "add", "arguments": '{"a": 1}'}},
        {"role": "function", "name": "add", "content": "1"}])
    call = out[1]["tool_calls"][0]
    assert call["function"] == {"name": "add", "arguments": {"a": 1}} and call["id"].startswith("call_")
    assert out[2]["role"] == "tool" and out[2]["name"] == "add" and out[2]["tool_call_id"] == call["id"]
    # a tool message with neither id nor name answers the next unanswered call, in order
    out = template_messages([
        {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "x", "arguments": ""}},
                                             {"type": "function", "function": {"name": "y", "arguments": "{}"}}]},
        {"role": "tool", "content": "first"}, {"role": "tool", "content": "second"}])
    assert [m["name"] for m in out[1:]] == ["x", "y"] and out[0]["tool_calls"][0]["function"]["arguments"] == {}


@pytest.mark.parametrize("messages,param,code", [
    ([{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                             "function": {"name": "f", "arguments": "{not json"}}]}],
     "messages.0.tool_calls.0.function.arguments", "invalid_tool_arguments"),
    ([{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "[1, 2]"}}]}],
     "messages.0.tool_calls.0.function.arguments", "invalid_tool_arguments"),
    ([{"role": "assistant", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}],
     "messages.0.tool_calls.0.function.name", "invalid_message"),
    ([{"role": "assistant", "tool_calls": {"id": "c"}}], "messages.0.tool_calls", "invalid_message"),
    ([{"role": "tool", "tool_call_id": "nope", "content": "x"}], "messages.0.tool_call_id", "unknown_tool_call_id"),
    ([{"role": "tool", "content": "x"}], "messages.0.tool_call_id", "invalid_message"),
    ([{"role": "tool", "tool_call_id": 3, "content": "x"}], "messages.0.tool_call_id", "invalid_message"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "messages.0.content.0",
     "unsupported_content"),
    ([{"role": "user", "content": 3}], "messages.0.content", "invalid_message"),
    ([{"role": "user"}], "messages.0.content", "invalid_message"),
    ([{"role": "robot", "content": "x"}], "messages.0.role", "invalid_message"),
    ([{"role": "user", "content": "bad \ud800"}], "messages", "invalid_unicode"),
])
def test_bad_messages(messages, param, code):
    with pytest.raises(ToolRequestError) as info:
        template_messages(messages)
    assert (info.value.param, info.value.code) == (param, code), str(info.value)


def test_server_message_models_are_accepted():
    from dgemma_struct.server.protocol import ChatCompletionRequest

    body = ChatCompletionRequest.model_validate({"messages": CONVERSATION, "tools": [WEATHER, ADD]})
    assert template_messages(body.messages) == template_messages(CONVERSATION)


def test_gemma4_template_renders_a_multi_turn_tool_conversation(gemma4_tokenizer):
    p = chat_prompt(CONVERSATION, tool_request_of({"tools": [WEATHER, ADD]}))
    text = gemma4_tokenizer.apply_chat_template(list(p.messages), tools=list(p.tools), add_generation_prompt=True,
                                                tokenize=False)
    assert "<|tool>declaration:get_weather{description:<|\"|>Current weather<|\"|>" in text
    assert "<|tool>declaration:add{" in text
    assert ('<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>,days:2}<tool_call|>'
            '<|tool_call>call:add{a:2,b:3}<tool_call|>') in text
    # results in the order the client sent them, named through the call ids
    assert ('<|tool_response>response:add{value:<|"|>5<|"|>}<tool_response|>'
            '<|tool_response>response:get_weather{value:<|"|>3 C, rain<|"|>}<tool_response|>') in text
    assert text.endswith("<|turn>user\nAnd Bergen?<turn|>\n<|turn>model\n")
    ids = gemma4_tokenizer.apply_chat_template(list(p.messages), tools=list(p.tools), add_generation_prompt=True,
                                               tokenize=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    # markers are single control tokens, never spelled from ordinary pieces
    assert ids.count(48) == 2 and ids.count(49) == 2 and ids.count(50) == 2 and ids.count(51) == 2
    assert ids.count(46) == 2 and ids.count(47) == 2
