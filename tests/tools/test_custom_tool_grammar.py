"""Custom tools in the tools layer: declarations of both OpenAI shapes, the call grammar with the
input grammar as an llguidance sub-grammar, the same compile errors as an output constraint, and
``max_calls``."""
from __future__ import annotations

import pytest

from dgemma_struct.errors import GrammarError, RegexError
from dgemma_struct.tools import as_tool, compile_tool_calls, normalise_tools, tool_call_grammar
from dgemma_struct.tools.declarations import ToolCallError

ARITH = 'start: NUM ("+" NUM)*\nNUM: /[0-9]{1,3}/'
CALC = {"type": "custom", "name": "calc", "format": {"type": "grammar", "syntax": "lark", "definition": ARITH}}
DIAL = {"type": "custom", "custom": {"name": "dial", "description": "Dials.",
                                     "format": {"type": "grammar", "syntax": "regex", "definition": r"\d{3}-\d{4}"}}}
NOTE = {"type": "custom", "name": "note"}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _call(name: str, text: str) -> str:
    return f'<|tool_call>call:{name}{{input:<|"|>{text}<|"|>}}<tool_call|>'


def test_declarations_of_both_shapes():
    calc, dial, note = (as_tool(t) for t in (CALC, DIAL, NOTE))
    assert calc.is_custom and calc.grammar == ("lark", ARITH) and dial.grammar == ("regex", r"\d{3}-\d{4}")
    assert note.is_custom and note.grammar is None and dial.description == "Dials."
    assert calc.to_openai()["function"]["parameters"]["required"] == ["input"]
    assert not as_tool(WEATHER).is_custom
    with pytest.raises(ToolCallError):
        as_tool({"type": "custom", "name": "x", "format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}})
    assert "@custom_input_0" in tool_call_grammar(normalise_tools([CALC, WEATHER]))


def test_inputs_follow_their_grammars(gemma4_tokenizer):
    c = compile_tool_calls([CALC, DIAL, NOTE, WEATHER], gemma4_tokenizer, tool_choice="required")
    assert c.matches(_call("calc", "12+30")) and not c.matches(_call("calc", "12+"))
    assert not c.matches(_call("calc", "a"))
    assert c.matches(_call("dial", "555-1234")) and not c.matches(_call("dial", "555-12345"))
    assert c.matches(_call("note", "anything at all, even { and }"))
    assert c.matches(_call("calc", "1+2") + '<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>}<tool_call|>')
    calls, _, issues = c.check_calls(_call("dial", "555-1234"))
    assert not issues and calls[0].custom and calls[0].input == "555-1234" and calls[0].arguments == {"input": "555-1234"}
    assert c.validate_text(_call("calc", "99")).ok and not c.validate_text(_call("dial", "5")).ok


def test_max_calls_and_bad_grammars(gemma4_tokenizer):
    one = compile_tool_calls([CALC], gemma4_tokenizer, tool_choice="required", max_calls=2)
    assert one.matches(_call("calc", "1") * 2) and not one.grammar_accepts(_call("calc", "1") * 3)
    with pytest.raises(RegexError):
        compile_tool_calls([{"type": "custom", "name": "r", "format": {"type": "grammar", "syntax": "regex",
                                                                       "definition": "a(("}}], gemma4_tokenizer)
    with pytest.raises(GrammarError):
        compile_tool_calls([{"type": "custom", "name": "g", "format": {"type": "grammar", "syntax": "lark",
                                                                       "definition": "start: undefined_rule"}}],
                           gemma4_tokenizer)
