"""The ``response`` object of ``POST /v1/responses`` (OpenAI's Responses API shape; the tests check
it against the ``openai`` package's own ``openai.types.responses.Response``) from a request's finished
rows: a ``reasoning`` item for the thought, then a ``message`` with one ``output_text`` part, or one
``function_call`` / ``custom_tool_call`` item per call; ``status: "incomplete"`` with
``incomplete_details.reason: "max_output_tokens"`` when the answer ran out of budget."""
from __future__ import annotations

import secrets
import time
from typing import Any

from dgemma_struct.errors import LengthError
from dgemma_struct.tools import MARKER_TOKENS

from .completions import Ran, row_of, spans_of
from .state import ServerState
from .tool_calls import row_tokens, tool_result_of


def item_id(prefix: str) -> str:
    """An id in OpenAI's style for an output item (``msg``, ``fc``, ``ctc``, ``rs``) or a response (``resp``).

    >>> item_id("msg").startswith("msg_"), len(item_id("fc"))
    (True, 51)
    """
    return f"{prefix}_" + secrets.token_hex(24)


def message_item(text: str, status: str = "completed", **extra: Any) -> dict[str, Any]:
    """An assistant ``message`` output item holding ``text`` as one ``output_text`` part.

    >>> message_item("hi")["content"]
    [{'type': 'output_text', 'text': 'hi', 'annotations': [], 'logprobs': []}]
    """
    return {"id": item_id("msg"), "type": "message", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}], **extra}


def _reasoning_item(thought: str) -> dict[str, Any]:
    return {"id": item_id("rs"), "type": "reasoning", "summary": [], "status": "completed",
            "content": [{"type": "reasoning_text", "text": thought}]}


def _call_item(call: Any) -> dict[str, Any]:
    if call.custom:
        return {"id": item_id("ctc"), "type": "custom_tool_call", "call_id": call.id, "name": call.name,
                "input": call.input, "status": "completed"}
    return {"id": item_id("fc"), "type": "function_call", "call_id": call.id, "name": call.name,
            "arguments": call.arguments_json, "status": "completed"}


def _tool_output(state: ServerState, r: Any) -> tuple[list[dict[str, Any]], bool, int, Any]:
    """(output items, complete?, output tokens, stats) of a tool request's row."""
    tokens = row_tokens(r, state.count_tokens)
    if isinstance(r, LengthError):   # a half-written call is never shown as a call
        partial = r.partial_text or ""
        text = "" if partial.lstrip().startswith(MARKER_TOKENS["call_open"]) else partial
        stats = r.stats.to_dict() if hasattr(r.stats, "to_dict") else None
        return [message_item(text, "incomplete")], False, tokens, stats
    res = tool_result_of(r)
    stats = res.stats.to_dict() if hasattr(res.stats, "to_dict") else None
    if res.calls:
        return [_call_item(c) for c in res.calls], True, tokens, stats
    return [message_item(res.content or "")], True, tokens, stats


def _echo_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The request's tools as the response lists them (every field OpenAI's tool types require)."""
    out = []
    for t in tools or []:
        if t.get("type") == "custom":
            out.append({"type": "custom", "name": t.get("name"), "description": t.get("description"),
                        "format": t.get("format") or {"type": "text"}})
        else:
            out.append({"type": "function", "name": t.get("name"), "description": t.get("description"),
                        "parameters": t.get("parameters"), "strict": bool(t.get("strict"))})
    return out


def response_body(state: ServerState, req: Any, ran: Ran, tool_req: Any) -> dict[str, Any]:
    """The ``response`` object of ``req`` (a :class:`~.responses_api.ResponsesRequest`) after its rows ran."""
    r = ran.results[0]
    reasoning_tokens = 0
    if ran.plan.use_tools:
        output, complete, out_tokens, stats = _tool_output(state, r)
    else:
        text, finish, out_tokens, stats = row_of(state, r, ran.plan.stops)
        complete = finish != "length"
        extra = {"field_confidence": getattr(r, "confidence", None)} if ran.plan.confidence else {}
        if ran.grounded:
            extra["grounding"] = spans_of(ran.row_specs[0], text) if complete else None
        output = [message_item(text, "completed" if complete else "incomplete", **extra)]
        thought = getattr(r, "reasoning", None) if ran.thinks else None
        if thought:
            reasoning_tokens = state.count_tokens(thought)
            output.insert(0, _reasoning_item(thought))
    fmt = (req.text or {}).get("format") or {"type": "text"}
    effort = (req.reasoning or {}).get("effort")
    return {
        "id": item_id("resp"), "object": "response", "created_at": int(time.time()),
        "status": "completed" if complete else "incomplete", "error": None,
        "incomplete_details": None if complete else {"reason": "max_output_tokens"},
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": req.max_tool_calls, "model": state.model_id, "output": output,
        # the SDKs' convenience, sent for raw HTTP clients too: every message's text, joined
        "output_text": "".join(p["text"] for o in output if o["type"] == "message" for p in o["content"]),
        "parallel_tool_calls": tool_req.parallel_tool_calls if tool_req is not None else req.parallel_tool_calls
        is not False,
        "previous_response_id": None, "reasoning": {"effort": effort, "summary": None} if req.reasoning else None,
        "store": False, "temperature": req.temperature, "top_p": req.top_p,
        "text": {**(req.text or {}), "format": fmt}, "tool_choice": req.tool_choice or "auto",
        "tools": _echo_tools(req.tools), "truncation": "disabled", "user": req.user, "metadata": req.metadata or {},
        "usage": {"input_tokens": ran.prompt_total, "input_tokens_details": {"cached_tokens": 0,
                                                                               "cache_write_tokens": 0},
                  "output_tokens": out_tokens, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                  "total_tokens": ran.prompt_total + out_tokens},
        "dgemma_stats": stats,
    }
