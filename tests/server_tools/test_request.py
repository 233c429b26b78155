"""Request -> tools: OpenAI ``tools`` / ``tool_choice`` / ``parallel_tool_calls``, the legacy
``functions`` / ``function_call``, and every bad input as a ToolRequestError with param and code."""
import pytest

from dgemma_struct.errors import ConstraintError, PromptTooLongError
from dgemma_struct.server.http_errors import api_error_for
from dgemma_struct.server.tool_calls import ToolRequestError, api_error, check_context, tool_request_of
from dgemma_struct.tools import ToolCallError

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                   "required": ["city"]}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"],
    "additionalProperties": False}, "strict": True}}


def err(body, **kw) -> ToolRequestError:
    with pytest.raises(ToolRequestError) as info:
        tool_request_of(body, **kw)
    return info.value


def test_no_tools_is_none():
    assert tool_request_of({"messages": []}) is None
    assert tool_request_of({"tool_choice": "none"}) is None   # harmless: OpenAI accepts it too


def test_tools_defaults():
    tr = tool_request_of({"tools": [WEATHER, ADD]})
    assert [t.name for t in tr.tools] == ["get_weather", "add"]
    assert tr.tool_choice == "auto" and tr.parallel_tool_calls is True and not tr.legacy and tr.calls_possible
    assert tr.tools[1].strict and not tr.tools[0].strict
    assert tr.tools[0].description == "Current weather"
    assert tr.openai_tools()[0]["function"]["parameters"]["required"] == ["city"]


@pytest.mark.parametrize("choice,expected", [
    ("auto", "auto"), ("required", "required"), ("none", "none"),
    ({"type": "function", "function": {"name": "add"}}, {"name": "add"})])
def test_tool_choice_forms(choice, expected):
    tr = tool_request_of({"tools": [WEATHER, ADD], "tool_choice": choice, "parallel_tool_calls": False})
    assert tr.tool_choice == expected and tr.parallel_tool_calls is False
    assert tr.calls_possible == (choice != "none")


def test_legacy_functions():
    tr = tool_request_of({"functions": [WEATHER["function"]], "function_call": {"name": "get_weather"}})
    assert tr.legacy and tr.tool_choice == {"name": "get_weather"} and tr.parallel_tool_calls is False
    assert tool_request_of({"functions": [WEATHER["function"]], "function_call": "none"}).tool_choice == "none"
    assert tool_request_of({"functions": [WEATHER["function"]]}).tool_choice == "auto"


def test_pydantic_model_request_with_extra_fields():
    from dgemma_struct.server.protocol import ChatCompletionRequest

    body = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER],
                                                 "tool_choice": "required", "parallel_tool_calls": False})
    tr = tool_request_of(body)
    assert tr.tool_choice == "required" and tr.parallel_tool_calls is False
    legacy = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}],
                                                   "functions": [ADD["function"]], "function_call": "auto"})
    assert tool_request_of(legacy).legacy


@pytest.mark.parametrize("body,param,code", [
    ({"tools": {}}, "tools", "invalid_tools"),
    ({"tools": []}, "tools", "invalid_tools"),
    ({"tools": ["x"]}, "tools.0", "invalid_tools"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools.0.type", "unsupported_tool_type"),
    ({"tools": [{"type": "function"}]}, "tools.0.function", "invalid_tools"),
    ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools.0.function.name", "invalid_tool_name"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools", "invalid_tool_name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": 3}}]}, "tools.0.function.description",
     "invalid_tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "tools.0.function.parameters",
     "invalid_tool_schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "nope"}}}}}]}, "tools", "invalid_tool_schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]}, "tools",
     "invalid_tool_schema"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "duplicate_tool_name"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]}, "tools", "too_many_tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]}, "tools.0.function.strict",
     "invalid_tools"),
    ({"tools": [{"type": "function", "function": {**WEATHER["function"], "strict": True}}]},
     "tools.0.function.parameters", "invalid_tool_schema"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice", "invalid_tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "unknown_tool"),
    ({"tools": [WEATHER], "tool_choice": {"name": "get_weather"}}, "tool_choice", "invalid_tool_choice"),
    ({"tools": [WEATHER], "tool_choice": 3}, "tool_choice", "invalid_tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "invalid_request"),
    ({"tools": [WEATHER], "functions": [WEATHER["function"]]}, "functions", "invalid_tools"),
    ({"tool_choice": "required"}, "tool_choice", "invalid_tool_choice"),
    ({"function_call": {"name": "f"}}, "function_call", "invalid_tool_choice"),
    ({"functions": [WEATHER["function"]], "function_call": "required"}, "function_call", "invalid_tool_choice"),
    ({"functions": [WEATHER["function"]], "function_call": {"name": "nope"}}, "function_call", "unknown_tool"),
    ({"functions": [WEATHER["function"]], "tool_choice": "auto"}, "tool_choice", "invalid_tool_choice"),
    ({"tools": [WEATHER], "function_call": "auto"}, "function_call", "invalid_tool_choice"),
])
def test_bad_requests(body, param, code):
    e = err(body)
    assert (e.param, e.code) == (param, code), str(e)
    assert isinstance(e, ToolCallError) and isinstance(e, ConstraintError) and str(e)
    a = api_error(e)
    assert a.status == 400 and a.body()["error"] == {"message": str(e), "type": "invalid_request_error",
                                                     "param": param, "code": code}


def test_generic_mapping_is_still_a_400():
    """Wired without api_error, the server's own table still answers 400 for a ToolCallError."""
    a = api_error_for(err({"tools": [WEATHER, WEATHER]}), param="tools")
    assert a.status == 400 and a.param == "tools"


def test_strict_schema_checks_nested_objects():
    nested = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "additionalProperties": False, "required": ["p"],
        "properties": {"p": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}}}
    e = err({"tools": [nested]})
    assert e.code == "invalid_tool_schema" and "properties.p" in str(e)
    nested["function"]["parameters"]["properties"]["p"]["additionalProperties"] = False
    assert tool_request_of({"tools": [nested]}).tools[0].strict


def test_tools_with_response_format():
    e = err({"tools": [WEATHER]}, output_constraint="response_format")
    assert (e.param, e.code) == ("response_format", "tools_with_response_format")
    assert err({"tools": [WEATHER], "tool_choice": "required"}, output_constraint="guided_json").param == "guided_json"
    tr = tool_request_of({"tools": [WEATHER], "tool_choice": "none"}, output_constraint="response_format")
    assert tr.tool_choice == "none" and not tr.calls_possible


def test_context_check():
    tr = tool_request_of({"tools": [WEATHER]})
    check_context(100, 100, 8192, tr)
    with pytest.raises(PromptTooLongError, match="1 tool declarations"):
        check_context(8000, 256, 8192, tr)
    a = api_error_for(PromptTooLongError("x max_tokens"))
    assert a.status == 400 and a.code == "context_length_exceeded"
