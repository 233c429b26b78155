"""The chat endpoint's tool path without HTTP, on a saved random-weight real-shape checkpoint
loaded with ``DiffusionRuntime.from_pretrained`` (what ``dgemma-struct serve --model DIR`` does):
request -> tools -> template messages -> constraint -> generation -> response, parsed by the
openai SDK. Random weights write nonsense: valid calls are the constraint's doing."""
import json

import jsonschema
import pytest
from openai.types.chat import ChatCompletion

from dgemma_struct.api import generate
from dgemma_struct.server.tool_calls import (ToolRequestError, chat_choice, chat_prompt, check_context, compile_for,
                                             stream_chunks, tool_request_of)

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer",
                                                                                         "minimum": 1}},
    "required": ["city", "days"], "additionalProperties": False}, "strict": True}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}}, "required": ["a"]}}}


def test_checkpoint_layout(real_shape_dir, real_shape_runtime):
    names = {p.name for p in real_shape_dir.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "chat_template.jinja"} <= names
    gc = json.loads((real_shape_dir / "generation_config.json").read_text())
    assert gc["eos_token_id"] == [1, 106, 50] and gc["pad_token_id"] == 0
    rt = real_shape_runtime
    assert rt.eos_token_ids == [1, 106, 50] and rt.model.config.text_config.vocab_size == 262_144
    assert rt.tokenizer.convert_tokens_to_ids(["<|tool_call>", "<tool_call|>", '<|"|>']) == [48, 49, 52]
    assert "<|tool_call>" in rt.tokenizer.chat_template


def _serve(rt, body, **opts):
    tr = tool_request_of(body)
    prompt = chat_prompt(body["messages"], tr)
    n_prompt = len(rt.encode_prompt(prompt))
    check_context(n_prompt, opts["max_new_tokens"], rt.max_context, tr)
    res = generate(prompt, compile_for(tr, rt), runtime=rt, return_details=True, **opts)
    body = {"id": "chatcmpl-x", "object": "chat.completion", "created": 0, "model": rt.name,
            "choices": [chat_choice(0, res, tr)]}
    return tr, res, ChatCompletion.model_validate(body)


def test_required_multi_turn_call_is_valid(real_shape_runtime):
    messages = [{"role": "user", "content": "Weather in Oslo for 2 days?"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                    "name": "add", "arguments": '{"a": 1}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "1"}]
    tr, res, c = _serve(real_shape_runtime, {"messages": messages, "tools": [WEATHER, ADD], "tool_choice": "required"},
                        max_new_tokens=32, mode="ar", max_repairs=1, seed=0)
    ch = c.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None and ch.message.tool_calls
    schemas = {"get_weather": WEATHER["function"]["parameters"], "add": ADD["function"]["parameters"]}
    for call in ch.message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
        assert call.id.startswith("call_")
    assert res.value.text.startswith("<|tool_call>call:")
    chunks = stream_chunks(res, tr, rid="chatcmpl-x", model="m", created=0)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_legacy_named_function(real_shape_runtime):
    body = {"messages": [{"role": "user", "content": "add 2"}], "functions": [WEATHER["function"], ADD["function"]],
            "function_call": {"name": "add"}}
    _, _, c = _serve(real_shape_runtime, body, max_new_tokens=24, mode="ar", max_repairs=1, seed=1)
    ch = c.choices[0]
    assert ch.finish_reason == "function_call" and ch.message.function_call.name == "add"
    jsonschema.validate(json.loads(ch.message.function_call.arguments), ADD["function"]["parameters"])


def test_a_model_without_tool_tokens_is_a_400(tiny_gemma3_runtime):
    tr = tool_request_of({"tools": [ADD]})
    with pytest.raises(ToolRequestError) as info:
        compile_for(tr, tiny_gemma3_runtime)
    assert (info.value.param, info.value.code) == ("tools", "tools_unsupported_by_model")


def test_too_many_tools_for_the_context(real_shape_runtime):
    big = [{"type": "function", "function": {"name": f"tool_{i}", "description": "word " * 60, "parameters": {
        "type": "object", "properties": {f"field_{k}": {"type": "string", "description": "x " * 10}
                                         for k in range(8)}}}} for i in range(100)]
    tr = tool_request_of({"tools": big})
    n_prompt = len(real_shape_runtime.encode_prompt(chat_prompt([{"role": "user", "content": "hi"}], tr)))
    assert n_prompt > real_shape_runtime.max_context
    from dgemma_struct.errors import PromptTooLongError

    with pytest.raises(PromptTooLongError, match="100 tool declarations"):
        check_context(n_prompt, 16, real_shape_runtime.max_context, tr)


@pytest.mark.parametrize("choice", ["none", "auto"])
def test_none_and_auto(real_shape_runtime, choice):
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER, ADD], "tool_choice": choice}
    _, res, c = _serve(real_shape_runtime, body, max_new_tokens=16, mode="ar", max_repairs=1, seed=2)
    ch = c.choices[0]
    if choice == "none" or not ch.message.tool_calls:
        assert ch.finish_reason in ("stop", "length") and isinstance(ch.message.content, str)
        for marker in ("<|tool_call>", "<tool_call|>", '<|"|>', "<|tool_response>"):
            assert marker not in ch.message.content
        if choice == "none":
            assert res.value.calls == []
    else:
        assert ch.finish_reason == "tool_calls"
        for call in ch.message.tool_calls:
            assert call.function.name in ("get_weather", "add")
