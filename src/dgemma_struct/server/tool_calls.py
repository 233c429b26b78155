"""Tool calling for the chat endpoint: OpenAI ``tools`` / ``tool_choice`` / ``parallel_tool_calls``
(and the legacy ``functions`` / ``function_call``) in, ``message.tool_calls`` (or the legacy
``message.function_call``) and streaming tool-call deltas out.

Pure functions, no server state: the endpoint calls :func:`tool_request_of` on the request body,
:func:`template_messages` on its messages, :func:`compile_for` to get the constraint,
and :func:`chat_message` / :func:`stream_chunks` on each result. Every bad input raises
:class:`ToolRequestError` (a :class:`~dgemma_struct.tools.ToolCallError`) carrying the OpenAI
error ``param`` and ``code``; :func:`api_error` turns it into the server's 400. See ``docs/tools.md``.
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

from dgemma_struct.errors import LengthError, PromptTooLongError
from dgemma_struct.tools import (MARKER_TOKENS, TOOL_CHOICES, Tool, ToolCall, ToolCallError, ToolCallResult,
                                 normalise_tools)

__all__ = ["ToolRequest", "ToolRequestError", "tool_request_of", "template_messages", "chat_prompt", "compile_for",
           "check_context", "prepare_tokenizer", "chat_message", "chat_choice", "stream_chunks", "api_error",
           "new_call_id", "tool_result_of", "row_tokens", "completion_body", "sse_events"]

#: Request fields this module reads (the server's pydantic models keep them as extra fields).
TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call")
#: Characters of arguments JSON per streamed delta (OpenAI sends small fragments).
FRAGMENT_CHARS = 16


class ToolRequestError(ToolCallError):
    """A bad tool-calling request: an HTTP 400 with OpenAI's ``param`` and a precise ``code``."""

    def __init__(self, message: str, *, param: str, code: str):
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass(frozen=True)
class ToolRequest:
    """The tool part of a chat request, checked. ``tool_choice`` is ``"auto"``, ``"required"``,
    ``"none"`` or ``{"name": NAME}``; ``legacy`` is true when the request used ``functions`` (the
    answer then uses ``message.function_call``, one call at most)."""

    tools: tuple[Tool, ...]
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    legacy: bool = False

    @property
    def calls_possible(self) -> bool:
        """False for ``tool_choice="none"``: the model answers in text (declarations still rendered)."""
        return self.tool_choice != "none"

    def openai_tools(self) -> list[dict[str, Any]]:
        """The declarations as the chat template takes them (OpenAI ``tools`` entries)."""
        return [t.to_openai() for t in self.tools]


def _get(req: Any, name: str) -> Any:
    """A field of a request given as a dict or a pydantic model (extra fields included)."""
    if isinstance(req, Mapping):
        return req.get(name)
    value = getattr(req, name, None)
    if value is None:
        extra = getattr(req, "model_extra", None) or {}
        value = extra.get(name)
    return value


def _fail(message: str, param: str, code: str) -> ToolRequestError:
    return ToolRequestError(message, param=param, code=code)


def _check_strict(schema: Any, param: str, path: str = "parameters") -> None:
    """``strict: true`` as OpenAI defines it: every object closes (``additionalProperties: false``)
    and requires all its properties. The grammar then enforces exactly that shape."""
    stack = [(schema, path)]
    while stack:
        s, where = stack.pop()
        if isinstance(s, list):
            stack.extend((x, f"{where}.{i}") for i, x in enumerate(s))
            continue
        if not isinstance(s, Mapping):
            continue
        is_object = s.get("type") == "object" or (isinstance(s.get("type"), list) and "object" in s["type"]) \
            or "properties" in s
        if is_object:
            if s.get("additionalProperties") is not False:
                raise _fail(f"strict tool schemas need 'additionalProperties': false on every object ({where})",
                            param, "invalid_tool_schema")
            props = s.get("properties") or {}
            missing = [k for k in props if k not in (s.get("required") or [])]
            if missing:
                raise _fail(f"strict tool schemas must require every property; {where} does not require "
                            f"{missing[:5]}", param, "invalid_tool_schema")
        for key in ("properties", "$defs", "definitions"):
            if isinstance(s.get(key), Mapping):
                stack.extend((v, f"{where}.{key}.{k}") for k, v in s[key].items())
        for key in ("items", "anyOf", "oneOf", "allOf", "prefixItems"):
            if key in s:
                stack.append((s[key], f"{where}.{key}"))


def _declarations(raw: Any, legacy: bool) -> list[dict[str, Any]]:
    """OpenAI tool entries from ``tools`` (or legacy ``functions``), shape-checked."""
    field = "functions" if legacy else "tools"
    if not isinstance(raw, list):
        raise _fail(f"{field} must be a list", field, "invalid_tools")
    if not raw:
        raise _fail(f"{field} must not be empty (omit it for no tools)", field, "invalid_tools")
    out = []
    for i, entry in enumerate(raw):
        param = f"{field}.{i}"
        if not isinstance(entry, Mapping):
            raise _fail(f"{param} must be an object", param, "invalid_tools")
        if legacy:
            fn = entry
        else:
            if entry.get("type", "function") != "function":
                raise _fail(f"{param}: only tools of type 'function' are supported, got {entry.get('type')!r}",
                            f"{param}.type", "unsupported_tool_type")
            fn = entry.get("function")
            if not isinstance(fn, Mapping):
                raise _fail(f"{param}.function must be an object", f"{param}.function", "invalid_tools")
            param = f"{param}.function"
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise _fail(f"{param}.name must be a non-empty string", f"{param}.name", "invalid_tool_name")
        if fn.get("description") is not None and not isinstance(fn.get("description"), str):
            raise _fail(f"{param}.description must be a string", f"{param}.description", "invalid_tools")
        strict = fn.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise _fail(f"{param}.strict must be a boolean", f"{param}.strict", "invalid_tools")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, Mapping):
            raise _fail(f"{param}.parameters must be a JSON Schema object", f"{param}.parameters",
                        "invalid_tool_schema")
        if strict:
            _check_strict(params or {"type": "object", "properties": {}, "additionalProperties": False},
                          f"{param}.parameters")
        clean = {"name": name, "parameters": dict(params) if params is not None else None,
                 "strict": bool(strict)}
        if fn.get("description"):
            clean["description"] = fn["description"]
        out.append({"type": "function", "function": clean})
    return out


def _choice(raw: Any, names: set[str], legacy: bool) -> Any:
    field = "function_call" if legacy else "tool_choice"
    if raw is None:
        return "auto"
    if isinstance(raw, str):
        allowed = ("auto", "none") if legacy else TOOL_CHOICES
        if raw not in allowed:
            raise _fail(f"{field} must be one of {allowed} or name a function, got {raw!r}", field,
                        "invalid_tool_choice")
        return raw
    if not isinstance(raw, Mapping):
        raise _fail(f"{field} must be a string or an object", field, "invalid_tool_choice")
    if legacy:
        name = raw.get("name")
    else:
        if raw.get("type", "function") != "function" or not isinstance(raw.get("function"), Mapping):
            raise _fail(f'{field} objects look like {{"type": "function", "function": {{"name": ...}}}}', field,
                        "invalid_tool_choice")
        name = raw["function"].get("name")
    if not isinstance(name, str):
        raise _fail(f"{field} must name a function", field, "invalid_tool_choice")
    if name not in names:
        raise _fail(f"{field} names {name!r}, which is not among the declared {'functions' if legacy else 'tools'}",
                    field, "unknown_tool")
    return {"name": name}


def tool_request_of(req: Any, *, output_constraint: str | None = None) -> ToolRequest | None:
    """The checked tool part of a chat request (a dict or the server's pydantic request), or ``None``
    when it declares no tools. ``output_constraint``: the body field of the request's other output
    constraint (``response_format``, ``guided_json``, ...; what ``spec_of`` returns) or ``None``.

    Rules: ``tools`` and ``functions`` together, ``tool_choice`` / ``parallel_tool_calls`` without
    tools, and ``tools`` with another output constraint (unless ``tool_choice`` is ``"none"``) are
    400s, so no request is ambiguous about what its answer must match."""
    tools, functions = _get(req, "tools"), _get(req, "functions")
    choice_raw, fc_raw = _get(req, "tool_choice"), _get(req, "function_call")
    parallel = _get(req, "parallel_tool_calls")
    if tools is not None and functions is not None:
        raise _fail("give tools or the legacy functions, not both", "functions", "invalid_tools")
    if tools is None and functions is None:
        for name, value in (("tool_choice", choice_raw), ("function_call", fc_raw)):
            if value is not None and value != "none":
                raise _fail(f"{name} needs {'functions' if name == 'function_call' else 'tools'}", name,
                            "invalid_tool_choice")
        return None
    legacy = tools is None
    if legacy and choice_raw is not None:
        raise _fail("tool_choice goes with tools; with the legacy functions use function_call", "tool_choice",
                    "invalid_tool_choice")
    if not legacy and fc_raw is not None:
        raise _fail("function_call goes with the legacy functions; with tools use tool_choice", "function_call",
                    "invalid_tool_choice")
    if parallel is not None and not isinstance(parallel, bool):
        raise _fail(f"parallel_tool_calls must be a boolean, got {parallel!r}", "parallel_tool_calls",
                    "invalid_request")
    decls = _declarations(functions if legacy else tools, legacy)
    field = "functions" if legacy else "tools"
    try:
        normalised = normalise_tools(decls)
    except ToolCallError as err:
        msg = str(err)
        code = ("duplicate_tool_name" if "duplicate" in msg else "invalid_tool_name" if "not an identifier" in msg
                else "too_many_tools" if "too many" in msg else "invalid_tool_schema")
        raise _fail(msg, field, code) from None
    choice = _choice(fc_raw if legacy else choice_raw, {t.name for t in normalised}, legacy)
    if output_constraint is not None and choice != "none":
        raise _fail(f"tools and {output_constraint} together are ambiguous: give one output constraint, or "
                    f'tool_choice "none" to answer with {output_constraint}', output_constraint,
                    "tools_with_response_format")
    return ToolRequest(tools=tuple(normalised), tool_choice=choice,
                       parallel_tool_calls=False if legacy else (True if parallel is None else parallel),
                       legacy=legacy)


# ----------------------------------------------------------------------------------------------
# messages -> chat template messages
# ----------------------------------------------------------------------------------------------
def _text(content: Any, param: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _fail(f"{param}.{j}: only text content parts are supported", f"{param}.{j}",
                            "unsupported_content")
            parts.append(part["text"])
        return "".join(parts)
    raise _fail(f"{param} must be a string or a list of text parts", param, "invalid_message")


def _arguments(raw: Any, param: str) -> dict[str, Any]:
    """OpenAI sends arguments as a JSON string; the chat template needs the object."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except (ValueError, RecursionError) as err:
            raise _fail(f"{param} is not valid JSON: {err}", param, "invalid_tool_arguments") from None
    if not isinstance(raw, Mapping):
        raise _fail(f"{param} must be a JSON object", param, "invalid_tool_arguments")
    return dict(raw)


def template_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """OpenAI chat messages (dicts or the server's message models) -> what Gemma 4's chat template
    takes: assistant ``tool_calls`` (and legacy ``function_call``) with parsed argument objects and
    an ``id`` on every call; ``role: "tool"`` (and legacy ``role: "function"``) messages with
    ``tool_call_id`` and ``name`` (resolved from the earlier call's id when missing) and string
    content; ``developer`` becomes ``system``. Every message is checked; errors name ``messages.N``."""
    out: list[dict[str, Any]] = []
    names_by_id: dict[str, str] = {}
    pending: list[str] = []   # ids of the latest assistant calls, in order, for tool messages without an id
    for i, m in enumerate(messages):
        if hasattr(m, "model_dump"):
            m = m.model_dump(exclude_none=True)
        param = f"messages.{i}"
        if not isinstance(m, Mapping):
            raise _fail(f"{param} must be an object", param, "invalid_message")
        role = m.get("role")
        content = _text(m.get("content"), f"{param}.content")
        if role == "developer":
            role = "system"
        if role == "assistant":
            calls = m.get("tool_calls")
            if calls is None and m.get("function_call") is not None:
                calls = [{"type": "function", "function": m["function_call"]}]
            msg: dict[str, Any] = {"role": "assistant", "content": content}
            if calls is not None:
                if not isinstance(calls, list):
                    raise _fail(f"{param}.tool_calls must be a list", f"{param}.tool_calls", "invalid_message")
                conv = []
                pending = []
                for j, call in enumerate(calls):
                    cp = f"{param}.tool_calls.{j}"
                    fn = call.get("function") if isinstance(call, Mapping) else None
                    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
                        raise _fail(f"{cp}.function.name must be a non-empty string", f"{cp}.function.name",
                                    "invalid_message")
                    cid = call.get("id") or new_call_id()
                    if not isinstance(cid, str):
                        raise _fail(f"{cp}.id must be a string", f"{cp}.id", "invalid_message")
                    names_by_id[cid] = fn["name"]
                    pending.append(cid)
                    args = _arguments(fn.get("arguments"), f"{cp}.function.arguments")
                    conv.append({"id": cid, "type": "function", "function": {"name": fn["name"], "arguments": args}})
                if conv:
                    msg["tool_calls"] = conv
            if content is None and "tool_calls" not in msg:
                msg["content"] = ""
            out.append(msg)
        elif role in ("tool", "function"):
            cid, name = m.get("tool_call_id"), m.get("name")
            if cid is not None and not isinstance(cid, str):
                raise _fail(f"{param}.tool_call_id must be a string", f"{param}.tool_call_id", "invalid_message")
            if name is not None and not isinstance(name, str):
                raise _fail(f"{param}.name must be a string", f"{param}.name", "invalid_message")
            if cid is None and pending:
                cid = pending[0]
            if cid is not None and cid in names_by_id:
                name = name or names_by_id[cid]
            elif cid is not None and name is None:
                raise _fail(f"{param}.tool_call_id {cid!r} matches no earlier assistant tool call",
                            f"{param}.tool_call_id", "unknown_tool_call_id")
            if name is None:
                raise _fail(f"{param}: a tool message needs a tool_call_id (or a name)", f"{param}.tool_call_id",
                            "invalid_message")
            if cid in pending:
                pending.remove(cid)
            out.append({"role": "tool", "tool_call_id": cid or new_call_id(), "name": name,
                        "content": content if content is not None else ""})
        elif role in ("system", "user"):
            if content is None:
                raise _fail(f"{param} needs content", f"{param}.content", "invalid_message")
            out.append({"role": role, "content": content})
        else:
            raise _fail(f"{param}.role {role!r} is not a chat role", f"{param}.role", "invalid_message")
    _check_unicode(out)
    return out


def _check_unicode(value: Any) -> None:
    from .protocol import lone_surrogate_at

    pos = lone_surrogate_at(value)
    if pos is not None:
        raise _fail(f"messages hold text that is not valid Unicode (a lone surrogate at position {pos})",
                    "messages", "invalid_unicode")


def chat_prompt(messages: Sequence[Any], tool_req: ToolRequest | None) -> Any:
    """The :class:`~dgemma_struct.runtime.ChatPrompt` to generate from (declarations in the system turn)."""
    from dgemma_struct.runtime import ChatPrompt

    return ChatPrompt(messages=template_messages(messages),
                      tools=tool_req.openai_tools() if tool_req is not None else None)


def prepare_tokenizer(runtime: Any) -> None:
    """Build (once per tokenizer; cached) the llguidance tokenizer data :func:`compile_for` needs.
    Seconds for Gemma 4's 262k vocabulary: call it untimed before a timed compile."""
    from dgemma_struct.constraints.tokenizer import get_tokenizer_info

    get_tokenizer_info(runtime.tokenizer, stop_token_ids=list(runtime.eos_token_ids),
                       vocab_size=runtime.model.config.text_config.vocab_size)


def compile_for(tool_req: ToolRequest, runtime: Any) -> Any:
    """The :class:`~dgemma_struct.tools.ToolCallConstraint` of a request, for ``runtime``'s tokenizer.
    A tokenizer without Gemma 4's tool tokens is a 400 ``tools_unsupported_by_model``."""
    from dgemma_struct.tools import compile_tool_calls

    field = "functions" if tool_req.legacy else "tools"
    try:
        return compile_tool_calls(list(tool_req.tools), runtime.tokenizer, tool_choice=tool_req.tool_choice,
                                  parallel_tool_calls=tool_req.parallel_tool_calls,
                                  stop_token_ids=list(runtime.eos_token_ids),
                                  vocab_size=runtime.model.config.text_config.vocab_size)
    except ToolRequestError:
        raise
    except ToolCallError as err:
        code = "tools_unsupported_by_model" if "control token" in str(err) else "invalid_tool_schema"
        raise _fail(str(err), field, code) from None


def check_context(prompt_tokens: int, max_tokens: int, max_context: int, tool_req: ToolRequest | None) -> None:
    """Raise :class:`PromptTooLongError` before generation when the prompt (declarations included)
    plus ``max_tokens`` does not fit the model's context."""
    if prompt_tokens + max_tokens > max_context:
        why = f" ({len(tool_req.tools)} tool declarations included)" if tool_req is not None else ""
        raise PromptTooLongError(f"the prompt of {prompt_tokens} tokens{why} plus max_tokens={max_tokens} "
                                 f"exceeds the model's context of {max_context} tokens")


# ----------------------------------------------------------------------------------------------
# results -> response bodies
# ----------------------------------------------------------------------------------------------
def new_call_id() -> str:
    """An id in OpenAI's style (``call_`` + 24 hex digits)."""
    return "call_" + secrets.token_hex(12)


def tool_result_of(result: Any) -> ToolCallResult:
    """The :class:`ToolCallResult` of a generation result (or the result itself)."""
    if isinstance(result, ToolCallResult):
        return result
    value = getattr(result, "value", None)
    if isinstance(value, ToolCallResult):
        return value
    raise TypeError(f"not a tool-call result: {type(result).__name__}")


def _wire_call(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments_json}}


def chat_message(result: Any, tool_req: ToolRequest) -> tuple[dict[str, Any], str]:
    """``(message, finish_reason)`` of a chat choice (``result``: a generation result, a
    :class:`ToolCallResult` or the :class:`LengthError` of a row that ran out of ``max_tokens``,
    answered as OpenAI does: ``finish_reason: "length"``, no call). With calls, ``content`` is null and the calls
    are in ``tool_calls`` (``finish_reason: "tool_calls"``), or in ``function_call`` for a legacy
    request (the first call; ``finish_reason: "function_call"``); without, the text answer."""
    if isinstance(result, LengthError):
        # as OpenAI: 200 with finish_reason "length"; a half-written call is never shown as a call
        partial = result.partial_text or ""
        text = None if partial.lstrip().startswith(MARKER_TOKENS["call_open"]) else partial
        return {"role": "assistant", "content": text, "refusal": None}, "length"
    res = tool_result_of(result)
    if not res.calls:
        finish = res.stats.finish_reason if res.stats.finish_reason in ("stop", "length") else "stop"
        return {"role": "assistant", "content": res.content or "", "refusal": None}, finish
    if tool_req.legacy:
        first = res.calls[0]
        return ({"role": "assistant", "content": None, "refusal": None,
                 "function_call": {"name": first.name, "arguments": first.arguments_json}}, "function_call")
    return ({"role": "assistant", "content": None, "refusal": None,
             "tool_calls": [_wire_call(c) for c in res.calls]}, "tool_calls")


def chat_choice(index: int, result: Any, tool_req: ToolRequest) -> dict[str, Any]:
    """One entry of a ``chat.completion``'s ``choices``."""
    message, finish = chat_message(result, tool_req)
    return {"index": index, "message": message, "logprobs": None, "finish_reason": finish}


def _fragments(text: str, size: int) -> Iterator[str]:
    for k in range(0, len(text), size):
        yield text[k:k + size]


def stream_chunks(result: Any, tool_req: ToolRequest, *, rid: str, model: str, created: int, index: int = 0,
                  fragment_chars: int = FRAGMENT_CHARS) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` dicts OpenAI streams for one choice: a role chunk, per call a
    first delta with ``index``/``id``/``type``/``function.name`` and ``arguments: ""``, then argument
    fragments, and a last chunk with an empty delta and the finish reason. Legacy requests stream
    ``function_call`` deltas; a text answer streams its content."""
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                "system_fingerprint": None,
                "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    message, finish = chat_message(result, tool_req)
    calls = message.get("tool_calls") or message.get("function_call")
    out = [chunk({"role": "assistant", "content": None if calls else ""})]
    if not calls:
        if message["content"]:
            out.append(chunk({"content": message["content"]}))
    elif tool_req.legacy:
        fc = message["function_call"]
        out.append(chunk({"function_call": {"name": fc["name"], "arguments": ""}}))
        out += [chunk({"function_call": {"arguments": f}}) for f in _fragments(fc["arguments"], fragment_chars)]
    else:
        for k, call in enumerate(message["tool_calls"]):
            out.append(chunk({"tool_calls": [{"index": k, "id": call["id"], "type": "function",
                                              "function": {"name": call["function"]["name"], "arguments": ""}}]}))
            out += [chunk({"tool_calls": [{"index": k, "function": {"arguments": f}}]})
                    for f in _fragments(call["function"]["arguments"], fragment_chars)]
    out.append(chunk({}, finish))
    return out


def api_error(err: ToolRequestError) -> Any:
    """The server's :class:`~dgemma_struct.server.errors.APIError` (HTTP 400) for a bad tool request."""
    from .errors import APIError

    return APIError(400, str(err), param=err.param, code=err.code)


def row_tokens(row: Any, count_tokens: Any) -> int:
    """Completion tokens of a row (``count_tokens(text)`` for a :class:`LengthError`'s partial text)."""
    if isinstance(row, LengthError):
        return count_tokens(row.partial_text or "")
    ids = getattr(row, "token_ids", None)
    return len(ids) if ids is not None else 0


def completion_body(rows: Sequence[Any], tool_req: ToolRequest, *, rid: str, model: str, created: int,
                    prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """The whole ``chat.completion`` body of a tool request (one choice per row)."""
    return {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [chat_choice(i, r, tool_req) for i, r in enumerate(rows)], "system_fingerprint": None,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def sse_events(rows: Sequence[Any], tool_req: ToolRequest, *, rid: str, model: str, created: int,
               usage: Mapping[str, int] | None = None) -> Iterator[str]:
    """The SSE stream of a tool request: every row's chunks (:func:`stream_chunks`), the usage chunk
    when ``usage`` is given (``stream_options.include_usage``), then ``data: [DONE]``."""
    for i, row in enumerate(rows):
        for c in stream_chunks(row, tool_req, rid=rid, model=model, created=created, index=i):
            yield "data: " + json.dumps(c, ensure_ascii=True, separators=(",", ":")) + "\n\n"
    if usage is not None:
        tail = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [],
                "usage": dict(usage)}
        yield "data: " + json.dumps(tail, separators=(",", ":")) + "\n\n"
    yield "data: [DONE]\n\n"
