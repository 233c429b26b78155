"""Tool calls end to end on a random-weight DiffusionGemma of the real shape (vocab 262,144, canvas
256, 5:1 sliding/full layers) with the Gemma 4 tokenizer: random weights write nonsense, so every
call being a declared tool with schema-valid arguments is the constraint's doing."""
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from dgemma_struct.errors import LengthError
from dgemma_struct.tools import ToolCall, generate_tool_calls


class GetWeather(BaseModel):
    city: str = Field(max_length=6)
    unit: Literal["c", "f"] = "c"


def add(a: int, b: int = 0) -> int:
    """Add two integers."""
    return a + b


@pytest.fixture(scope="module")
def runtime(gemma4_random_runtime):
    return gemma4_random_runtime


@pytest.mark.parametrize("mode", ["diffusion", "ar"])
def test_required_call_is_valid(runtime, mode):
    res = generate_tool_calls("Weather in Oslo?", [GetWeather], tool_choice="required", runtime=runtime,
                              max_new_tokens=24, mode=mode, max_repairs=1)
    assert res.calls and res.finish_reason == "tool_calls"
    for c in res.calls:
        assert isinstance(c, ToolCall) and c.name == "GetWeather" and isinstance(c.value, GetWeather)
        assert GetWeather.model_validate(c.arguments) == c.value
    assert res.text.startswith("<|tool_call>call:GetWeather{") and "<|tool_response>" not in res.text


def test_named_function_tool_in_a_multi_turn_conversation(runtime):
    messages = [{"role": "user", "content": "Weather in Oslo, then add 2 and 3"},
                {"role": "assistant", "tool_calls": [{"type": "function", "function": {
                    "name": "GetWeather", "arguments": {"city": "Oslo"}}}]},
                {"role": "tool", "name": "GetWeather", "content": '{"temp": 3}'}]
    res = generate_tool_calls(messages, [GetWeather, add], tool_choice={"name": "add"}, runtime=runtime,
                              max_new_tokens=24, mode="ar", max_repairs=1)
    assert [c.name for c in res.calls] == ["add"] * len(res.calls) and res.calls
    assert all(isinstance(c.arguments["a"], int) for c in res.calls)


def test_budget_too_small_for_any_call_is_a_length_error(runtime):
    with pytest.raises(LengthError):
        generate_tool_calls("Weather?", [GetWeather], tool_choice="required", runtime=runtime, max_new_tokens=4,
                            mode="ar")


def test_thinking_then_json(runtime):
    """thinking=True: a thought block first (returned as .reasoning, never validated), then the value."""
    from dgemma_struct import generate

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    res = generate("Is 2+2=4? Answer as JSON.", schema, runtime=runtime, max_new_tokens=24, thinking=True,
                   max_thinking_tokens=4, return_details=True, max_repairs=1)
    assert res.reasoning is not None and len(res.reasoning) <= 16
    assert isinstance(res.value["ok"], bool) and "<|channel>" not in res.text and "<channel|>" not in res.text
    import json
    assert json.loads(res.text) == res.value
