"""The response side of tool calling: a generation result -> ``message.tool_calls`` (or the legacy
``message.function_call``), the ``chat.completion`` body, and OpenAI's streaming tool-call deltas."""
from __future__ import annotations

import json
from typing import Any, Iterator, Mapping, Sequence

from dgemma_struct.errors import LengthError
from dgemma_struct.tools import MARKER_TOKENS, ToolCall, ToolCallResult

from ..responses import (ChatChoice, ChatCompletion, ChatCompletionChunk, ChatChunkChoice, ChatDelta, AssistantMessage,
                         CustomCall, CustomCallDelta, FunctionCall, FunctionCallDelta, ToolCallDelta, ToolCallOut,
                         Usage)
from .request import ToolRequest

#: Characters of arguments JSON per streamed delta (OpenAI sends small fragments).
FRAGMENT_CHARS = 16


def tool_result_of(result: Any) -> ToolCallResult:
    """The :class:`ToolCallResult` of a generation result (or the result itself)."""
    if isinstance(result, ToolCallResult):
        return result
    value = getattr(result, "value", None)
    if isinstance(value, ToolCallResult):
        return value
    raise TypeError(f"not a tool-call result: {type(result).__name__}")


def _message(result: Any, tool_req: ToolRequest) -> tuple[AssistantMessage, str]:
    if isinstance(result, LengthError):
        # as OpenAI: 200 with finish_reason "length"; a half-written call is never shown as a call
        partial = result.partial_text or ""
        text = None if partial.lstrip().startswith(MARKER_TOKENS["call_open"]) else partial
        return AssistantMessage(content=text), "length"
    res = tool_result_of(result)
    if not res.calls:
        finish = res.stats.finish_reason if res.stats.finish_reason in ("stop", "length") else "stop"
        return AssistantMessage(content=res.content or ""), finish
    if tool_req.legacy:
        first = res.calls[0]
        return AssistantMessage(function_call=FunctionCall(name=first.name, arguments=first.arguments_json)), \
            "function_call"
    return AssistantMessage(tool_calls=[_wire_call(c) for c in res.calls]), "tool_calls"


def _wire_call(call: ToolCall) -> ToolCallOut:
    if call.custom:   # OpenAI's custom tool-call shape: the input text, never a JSON object
        return ToolCallOut(id=call.id, type="custom", custom=CustomCall(name=call.name, input=call.input))
    return ToolCallOut(id=call.id, function=FunctionCall(name=call.name, arguments=call.arguments_json))


def chat_message(result: Any, tool_req: ToolRequest) -> tuple[dict[str, Any], str]:
    """``(message, finish_reason)`` of a chat choice (``result``: a generation result, a
    :class:`ToolCallResult` or the :class:`LengthError` of a row that ran out of ``max_tokens``,
    answered as OpenAI does: ``finish_reason: "length"``, no call). With calls, ``content`` is null and the calls
    are in ``tool_calls`` (``finish_reason: "tool_calls"``), or in ``function_call`` for a legacy
    request (the first call; ``finish_reason: "function_call"``); without, the text answer."""
    message, finish = _message(result, tool_req)
    return message.wire(), finish


def _choice(index: int, result: Any, tool_req: ToolRequest) -> ChatChoice:
    message, finish = _message(result, tool_req)
    return ChatChoice(index=index, message=message, finish_reason=finish)


def chat_choice(index: int, result: Any, tool_req: ToolRequest) -> dict[str, Any]:
    """One entry of a ``chat.completion``'s ``choices``."""
    return _choice(index, result, tool_req).wire()


def _fragments(text: str, size: int) -> Iterator[str]:
    for k in range(0, len(text), size):
        yield text[k:k + size]


def stream_chunks(result: Any, tool_req: ToolRequest, *, rid: str, model: str, created: int, index: int = 0,
                  fragment_chars: int = FRAGMENT_CHARS) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` dicts OpenAI streams for one choice: a role chunk, per call a
    first delta with ``index``/``id``/``type``/``function.name`` and ``arguments: ""``, then argument
    fragments, and a last chunk with an empty delta and the finish reason. Legacy requests stream
    ``function_call`` deltas; a text answer streams its content."""
    def chunk(delta: ChatDelta, finish: str | None = None) -> dict[str, Any]:
        return ChatCompletionChunk(id=rid, created=created, model=model, system_fingerprint=None,
                                   choices=[ChatChunkChoice(index=index, delta=delta, finish_reason=finish)]).wire()

    message, finish = _message(result, tool_req)
    calls = message.tool_calls or message.function_call
    out = [chunk(ChatDelta(role="assistant", content=None if calls else ""))]
    if not calls:
        if message.content:
            out.append(chunk(ChatDelta(content=message.content)))
    elif message.function_call is not None:
        fc = message.function_call
        out.append(chunk(ChatDelta(function_call=FunctionCallDelta(name=fc.name, arguments=""))))
        out += [chunk(ChatDelta(function_call=FunctionCallDelta(arguments=f)))
                for f in _fragments(fc.arguments, fragment_chars)]
    else:
        for k, call in enumerate(message.tool_calls):
            if call.custom is not None:
                first = ToolCallDelta(index=k, id=call.id, type="custom",
                                      custom=CustomCallDelta(name=call.custom.name, input=""))
                out.append(chunk(ChatDelta(tool_calls=[first])))
                out += [chunk(ChatDelta(tool_calls=[ToolCallDelta(index=k, custom=CustomCallDelta(input=f))]))
                        for f in _fragments(call.custom.input, fragment_chars)]
                continue
            first = ToolCallDelta(index=k, id=call.id, type="function",
                                  function=FunctionCallDelta(name=call.function.name, arguments=""))
            out.append(chunk(ChatDelta(tool_calls=[first])))
            out += [chunk(ChatDelta(tool_calls=[ToolCallDelta(index=k, function=FunctionCallDelta(arguments=f))]))
                    for f in _fragments(call.function.arguments, fragment_chars)]
    out.append(chunk(ChatDelta(), finish))
    return out


def row_tokens(row: Any, count_tokens: Any) -> int:
    """Completion tokens of a row (``count_tokens(text)`` for a :class:`LengthError`'s partial text)."""
    if isinstance(row, LengthError):
        return count_tokens(row.partial_text or "")
    ids = getattr(row, "token_ids", None)
    return len(ids) if ids is not None else 0


def completion_body(rows: Sequence[Any], tool_req: ToolRequest, *, rid: str, model: str, created: int,
                    prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """The whole ``chat.completion`` body of a tool request (one choice per row)."""
    return ChatCompletion(id=rid, created=created, model=model,
                          choices=[_choice(i, r, tool_req) for i, r in enumerate(rows)],
                          usage=Usage.of(prompt_tokens, completion_tokens)).wire()


def sse_events(rows: Sequence[Any], tool_req: ToolRequest, *, rid: str, model: str, created: int,
               usage: Mapping[str, int] | None = None) -> Iterator[str]:
    """The SSE stream of a tool request: every row's chunks (:func:`stream_chunks`), the usage chunk
    when ``usage`` is given (``stream_options.include_usage``), then ``data: [DONE]``."""
    for i, row in enumerate(rows):
        for c in stream_chunks(row, tool_req, rid=rid, model=model, created=created, index=i):
            yield "data: " + json.dumps(c, ensure_ascii=True, separators=(",", ":")) + "\n\n"
    if usage is not None:
        tail = ChatCompletionChunk(id=rid, created=created, model=model, choices=[], usage=Usage(**usage)).wire()
        yield "data: " + json.dumps(tail, separators=(",", ":")) + "\n\n"
    yield "data: [DONE]\n\n"
