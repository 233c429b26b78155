"""Tool declarations, the native-format grammar and argument validation, on the Gemma 4 tokenizer."""
import json
from typing import Literal, Optional

import pytest
from hypothesis import given, settings, strategies as st
from pydantic import BaseModel

from dgemma_struct.tools import (ToolCallError, as_tool, compile_tool_calls, encode_arguments, normalise_tools,
                                 parse_tool_calls)

STOPS = [1, 106, 50]


class GetWeather(BaseModel):
    """Weather for a city."""
    city: str
    unit: Literal["c", "f"] = "c"
    days: Optional[int] = None


def add(a: int, b: float = 1.0) -> float:
    """Add two numbers."""
    return a + b


SEARCH = {"type": "function", "function": {"name": "search", "description": "Web search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string", "minLength": 1},
                                     "filters": {"type": "object", "properties": {
                                         "site": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}}},
                                     "limit": {"type": "integer", "minimum": 1, "maximum": 10}},
    "required": ["query"]}}}


def call(name, body):
    return f"<|tool_call>call:{name}{body}<tool_call|>"


S = '<|"|>'


@pytest.fixture(scope="module")
def constraint(gemma4_tokenizer):
    return compile_tool_calls([GetWeather, add, SEARCH], gemma4_tokenizer, stop_token_ids=STOPS)


def test_declarations_from_models_functions_and_dicts():
    tools = normalise_tools([GetWeather, add, SEARCH, {"name": "legacy", "parameters": {"type": "object"}}])
    assert [t.name for t in tools] == ["GetWeather", "add", "search", "legacy"]
    assert tools[0].description == "Weather for a city." and tools[0].model is GetWeather
    assert tools[1].parameters["required"] == ["a"] and tools[1].description == "Add two numbers."
    assert tools[2].to_openai()["function"]["parameters"]["required"] == ["query"]


@pytest.mark.parametrize("tools, match", [
    ([GetWeather, GetWeather], "duplicate"),
    ([{"name": "bad name", "parameters": {"type": "object"}}], "identifier"),
    ([{"name": "x", "parameters": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}], "invalid arguments schema"),
    ([{"name": "x", "parameters": {"type": "array"}}], "type 'object'"),
    ([], "empty"),
    ([{"type": "retrieval"}], "unsupported tool type"),
    ([42], "cannot use int"),
    ("GetWeather", "list"),
])
def test_bad_declarations_are_typed_errors(tools, match):
    with pytest.raises(ToolCallError, match=match):
        normalise_tools(tools)


def test_tool_choice_naming_an_unknown_tool(gemma4_tokenizer):
    with pytest.raises(ToolCallError, match="not a declared tool"):
        compile_tool_calls([GetWeather], gemma4_tokenizer, tool_choice={"name": "nope"}, stop_token_ids=STOPS)
    with pytest.raises(ToolCallError, match="tool_choice"):
        compile_tool_calls([GetWeather], gemma4_tokenizer, tool_choice="sometimes", stop_token_ids=STOPS)


def test_a_tokenizer_without_tool_tokens_is_refused():
    from dgemma_struct.testing import gemma3_style_tokenizer

    with pytest.raises(ToolCallError, match="control token"):
        compile_tool_calls([GetWeather], gemma3_style_tokenizer())


@pytest.mark.parametrize("text", [
    call("GetWeather", f'{{city:{S}Paris "x"\n{S},days:3}}'),
    call("GetWeather", f"{{city:{S}Zürich 🌧 \\ back{S},unit:{S}f{S},days:null}}"),
    call("GetWeather", f"{{city:{S}Oslo{S}}}") + call("add", "{a:-1,b:2.5e3}"),
    call("search", f"{{query:{S}diffusion{S},filters:{{site:{S}arxiv.org{S},tags:[{S}ml{S},{S}nlp{S}]}},limit:3}}"),
    "Plain text answer",
])
def test_valid_calls_are_accepted_and_parsed(constraint, text):
    assert constraint.grammar_accepts(text)
    outcome = constraint.validate_text(text)
    assert outcome.ok, outcome.errors
    for c in outcome.value.calls:
        assert json.loads(c.arguments_json) == c.arguments


def test_pydantic_and_function_tools_return_instances(constraint):
    res = constraint.validate_text(call("GetWeather", f"{{city:{S}Oslo{S}}}") + call("add", "{a:2}")).value
    assert isinstance(res.calls[0].value, GetWeather) and res.calls[0].value.unit == "c"
    assert res.calls[1].value.b == 1.0 and res.calls[1].name == "add"


@pytest.mark.parametrize("text", [
    call("Nope", "{}"),                                      # undeclared tool
    call("GetWeather", f"{{unit:{S}f{S}}}"),                 # missing required
    call("GetWeather", f"{{city:{S}Oslo{S},unit:{S}k{S}}}"),  # not in the enum
    call("add", f"{{a:{S}1{S}}}"),                           # wrong type
    call("add", "{a:1.5}"),                                  # integer
    call("GetWeather", f"{{days:3,city:{S}Oslo{S}}}"),       # declared order only
    call("GetWeather", f"{{city:{S}a<|b{S}}}"),              # a spelled control token inside a string
    f"<|tool_call>call:GetWeather{{city:{S}Oslo{S}}}",       # unterminated
])
def test_invalid_calls_are_rejected_by_the_grammar(constraint, text):
    assert not constraint.grammar_accepts(text)


def test_semantic_keywords_are_checked_by_validation(constraint):
    bad = call("search", f"{{query:{S}q{S},limit:11}}")  # the grammar enforces the maximum, validation too
    assert not constraint.grammar_accepts(bad)
    assert constraint.grammar_accepts(call("search", f"{{query:{S}q{S},limit:10}}"))
    outcome = constraint.validate_text(bad)
    assert not outcome.ok and "arguments" in str(outcome.errors[0])


def test_tool_choice_modes(gemma4_tokenizer):
    one = call("GetWeather", f"{{city:{S}Oslo{S}}}")
    two = one + call("add", "{a:1}")
    req = compile_tool_calls([GetWeather, add], gemma4_tokenizer, tool_choice="required", stop_token_ids=STOPS)
    assert req.grammar_accepts(one) and not req.grammar_accepts("text")
    none = compile_tool_calls([GetWeather, add], gemma4_tokenizer, tool_choice="none", stop_token_ids=STOPS)
    assert none.grammar_accepts("text") and not none.grammar_accepts(one)
    named = compile_tool_calls([GetWeather, add], gemma4_tokenizer, tool_choice={"type": "function", "function": {"name": "add"}},
                               stop_token_ids=STOPS)
    assert named.grammar_accepts(call("add", "{a:1}")) and not named.grammar_accepts(one)
    single = compile_tool_calls([GetWeather, add], gemma4_tokenizer, parallel_tool_calls=False, stop_token_ids=STOPS)
    assert single.grammar_accepts(one) and not single.grammar_accepts(two)


def test_markers_are_single_control_tokens(constraint, gemma4_tokenizer):
    """The mask allows the marker ids and never the ordinary pieces that would spell them."""
    w = constraint.canvas_walker()
    req = compile_tool_calls([GetWeather], gemma4_tokenizer, tool_choice="required", stop_token_ids=STOPS)
    forced = req.canvas_walker().forced_tokens(64)
    assert forced[0] == 48  # <|tool_call>
    text = gemma4_tokenizer.decode(forced, skip_special_tokens=False)
    assert text.startswith("<|tool_call>call:GetWeather{city:")
    # at the start of an answer both the marker id and plain text are allowed, '<' pieces that spell one are not
    res = w.walk([48])
    assert res.n_valid == 1


def test_past_calls_render_like_the_chat_template(gemma4_tokenizer):
    args = {"city": "Paris", "days": 3, "flags": [True, None], "nested": {"k": 1.5}}
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "GetWeather", "arguments": args}}]}]
    rendered = gemma4_tokenizer.apply_chat_template(msgs, tokenize=False)
    assert f"call:GetWeather{encode_arguments(args)}" in rendered


_keys = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
_strs = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12).filter(lambda s: "<|" not in s and '"|>' not in s)
_vals = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | _strs
                     | st.floats(allow_nan=False, allow_infinity=False, width=32).map(lambda f: float(f) + 0.5),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=3), max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(_keys, _vals, max_size=4))
def test_encode_parse_round_trip(args):
    """Any JSON object (strings without '<|') survives the native format unchanged."""
    (name, parsed), = parse_tool_calls(call("f", encode_arguments(args)))
    assert name == "f" and parsed == args


def test_parser_rejects_non_calls():
    for text in ["hello", call("f", "{a:}"), call("f", "{a:1") , "<|tool_call>call:{}<tool_call|>"]:
        with pytest.raises(ValueError):
            parse_tool_calls(text)
    assert parse_tool_calls(call("f", "{}") + "<|tool_response>") == [("f", {})]


def test_unicode_property_patterns_in_tool_arguments(gemma4_tokenizer):
    # the tool path checks a declaration with the JSON surface's checks, so `\p{..}` is one dialect on both
    word = {"name": "word", "parameters": {"type": "object", "required": ["w"],
                                           "properties": {"w": {"type": "string", "pattern": r"^\p{Letter}+$"}}}}
    c = compile_tool_calls([word], gemma4_tokenizer, stop_token_ids=STOPS)
    good, bad = call("word", f"{{w:{S}Ωμέγα{S}}}"), call("word", f"{{w:{S}h3llo{S}}}")
    assert c.grammar_accepts(good) and c.validate_text(good).ok
    assert not c.grammar_accepts(bad) and not c.validate_text(bad).ok
    with pytest.raises(ToolCallError, match="not a 'regex'"):
        normalise_tools([{"name": "x", "parameters": {"type": "object", "properties": {"a": {"pattern": "[a-"}}}}])
