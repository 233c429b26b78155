"""Custom tools (free-form input following a Lark or regex grammar) and function tools, on chat
completions and on the Responses API: every call's input matches its tool's grammar."""
from __future__ import annotations

import json
import re

import httpx
import lark
import pytest
from conftest import MODEL

ARITH = 'start: NUM (("+" | "-") NUM)*\nNUM: /[0-9]{1,3}/'
PHONE = r"\d{3}-\d{4}"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
           "additionalProperties": False}
RESP_TOOLS = [{"type": "custom", "name": "calc", "description": "Adds and subtracts numbers.",
               "format": {"type": "grammar", "syntax": "lark", "definition": ARITH}},
              {"type": "custom", "name": "dial", "description": "Dials a phone number.",
               "format": {"type": "grammar", "syntax": "regex", "definition": PHONE}},
              {"type": "custom", "name": "note", "description": "Writes a note."},
              {"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": True}]
CHAT_TOOLS = [{"type": "custom", "custom": {"name": "calc", "description": "Adds and subtracts numbers.",
                                            "format": {"type": "grammar",
                                                       "grammar": {"syntax": "lark", "definition": ARITH}}}},
              {"type": "custom", "custom": {"name": "dial", "format": {"type": "grammar",
                                                                     "grammar": {"syntax": "regex", "definition": PHONE}}}},
              {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER, "strict": True}}]
_ARITH = lark.Lark(ARITH)


def _check(name: str, text: str) -> None:
    if name == "calc":
        _ARITH.parse(text)                                # raises when the input is outside the grammar
    elif name == "dial":
        assert re.fullmatch(PHONE, text), text
    elif name == "get_weather":
        assert set(json.loads(text)) == {"city"}


@pytest.mark.parametrize("choice", ["calc", "dial", "note", "get_weather"])
def test_responses_named_custom_and_function_tools(oai, choice):
    kind = "function" if choice == "get_weather" else "custom"
    for seed in range(3):
        r = oai.responses.create(model=MODEL, input="What is 12 plus 7? Or call 555-1234. Weather in Paris?",
                                 tools=RESP_TOOLS, tool_choice={"type": kind, "name": choice}, max_output_tokens=48,
                                 extra_body={"seed": seed})
        calls = [o for o in r.output if o.type in ("custom_tool_call", "function_call")]
        assert r.status == "completed" and len(calls) >= 1 and all(c.name == choice for c in calls)
        for c in calls:
            _check(c.name, c.input if c.type == "custom_tool_call" else c.arguments)
            assert c.call_id.startswith("call_")


def test_responses_required_allowed_tools_and_stream(oai):
    for seed in range(3):
        r = oai.responses.create(model=MODEL, input="Compute 3+4.", tools=RESP_TOOLS, extra_body={"seed": seed},
                                 tool_choice={"type": "allowed_tools", "mode": "required",
                                              "tools": [{"type": "custom", "name": "calc"},
                                                        {"type": "custom", "name": "dial"}]}, max_output_tokens=48)
        calls = [o for o in r.output if o.type == "custom_tool_call"]
        assert calls and all(c.name in ("calc", "dial") for c in calls)
        for c in calls:
            _check(c.name, c.input)
    with oai.responses.stream(model=MODEL, input="Compute 3+4.", tools=RESP_TOOLS, max_output_tokens=48,
                              tool_choice={"type": "custom", "name": "calc"}, extra_body={"seed": 1}) as stream:
        events = list(stream)
        final = stream.get_final_response()
    call = final.output[0]
    assert call.type == "custom_tool_call"
    assert "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta") == call.input
    _check("calc", call.input)


def test_responses_tool_round_trip_and_max_tool_calls(oai):
    first = oai.responses.create(model=MODEL, input="Weather in Paris?", tools=RESP_TOOLS, max_output_tokens=48,
                                 tool_choice={"type": "function", "name": "get_weather"}, max_tool_calls=1)
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1
    history = [{"role": "user", "content": "Weather in Paris?"}, calls[0].model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C"}]
    second = oai.responses.create(model=MODEL, input=history, tools=RESP_TOOLS, tool_choice="none",
                                  max_output_tokens=24)
    assert [o.type for o in second.output] == ["message"]


@pytest.mark.parametrize("choice", ["calc", "dial"])
def test_chat_custom_tools(oai, choice):
    for seed in range(3):
        resp = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Compute 2+2."}],
                                           tools=CHAT_TOOLS, tool_choice={"type": "custom", "custom": {"name": choice}},
                                           max_tokens=48, seed=seed)
        msg = resp.choices[0].message
        assert resp.choices[0].finish_reason == "tool_calls"
        for call in msg.tool_calls:
            assert call.type == "custom" and call.custom.name == choice
            _check(choice, call.custom.input)


def test_chat_custom_tool_stream_and_history(server_url):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Compute 2+2."}], "tools": CHAT_TOOLS,
            "tool_choice": {"type": "custom", "custom": {"name": "calc"}}, "max_tokens": 48, "seed": 2}
    plain = httpx.post(server_url + "/v1/chat/completions", json=body, timeout=120).json()
    call = plain["choices"][0]["message"]["tool_calls"][0]
    assert call["type"] == "custom" and "function" not in call
    with httpx.stream("POST", server_url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120) as r:
        chunks = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
    streamed = "".join(tc["custom"].get("input", "") for c in chunks for tc in c["choices"][0]["delta"].get(
        "tool_calls") or [])
    assert streamed == call["custom"]["input"]
    history = body["messages"] + [{"role": "assistant", "content": None, "tool_calls": [call]},
                                  {"role": "tool", "tool_call_id": call["id"], "content": "4"}]
    again = httpx.post(server_url + "/v1/chat/completions", timeout=120,
                       json={**body, "messages": history, "tool_choice": "none", "max_tokens": 16})
    assert again.status_code == 200, again.text


@pytest.mark.parametrize("tool,code,param", [
    ({"type": "custom", "custom": {"name": "c", "format": {"type": "grammar",
                                                          "grammar": {"syntax": "regex", "definition": "a(("}}}},
     "invalid_regex", "tools.0.custom.format.grammar.definition"),
    ({"type": "custom", "custom": {"name": "c", "format": {"type": "grammar",
                                                          "grammar": {"syntax": "lark", "definition": "start: x"}}}},
     "invalid_grammar", "tools.0.custom.format.grammar.definition"),
    ({"type": "custom", "custom": {"name": "c", "format": {"type": "grammar",
                                                          "grammar": {"syntax": "ebnf", "definition": "x"}}}},
     "invalid_tools", "tools.0.custom.format.grammar.syntax"),
])
def test_chat_custom_tool_errors(server_url, tool, code, param):
    resp = httpx.post(server_url + "/v1/chat/completions", timeout=60,
                      json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": [tool],
                            "max_tokens": 8})
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert (err["code"], err["param"]) == (code, param)
    # the same grammar as a response_format-style constraint gives the same code
    g = tool["custom"]["format"]["grammar"]
    if g["syntax"] in ("regex", "lark"):
        key = "guided_regex" if g["syntax"] == "regex" else "guided_grammar"
        same = httpx.post(server_url + "/v1/chat/completions", timeout=60,
                          json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], key: g["definition"],
                                "max_tokens": 8})
        assert same.json()["error"]["code"] == code
