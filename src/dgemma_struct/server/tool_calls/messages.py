"""Chat messages with tool calls -> what Gemma 4's chat template takes (:func:`template_messages`),
and the :class:`~dgemma_struct.prompts.ChatPrompt` a tool request generates from."""
from __future__ import annotations

import json
import secrets
from typing import Any, Mapping, Sequence

from dgemma_struct.prompts import ChatPrompt

from ..http_errors import ToolRequestError
from ..protocol import check_messages, lone_surrogate_at
from .request import ToolRequest


def _fail(message: str, param: str, code: str) -> ToolRequestError:
    return ToolRequestError(message, param=param, code=code)


def new_call_id() -> str:
    """An id in OpenAI's style (``call_`` + 24 hex digits)."""
    return "call_" + secrets.token_hex(12)


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
                    if isinstance(call, Mapping) and call.get("type") == "custom":   # its input as the one argument
                        cu = call.get("custom") if isinstance(call.get("custom"), Mapping) else {}
                        call = {**call, "function": {"name": cu.get("name"),
                                                     "arguments": {"input": cu.get("input") or ""}}}
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
    pos = lone_surrogate_at(value)
    if pos is not None:
        raise _fail(f"messages hold text that is not valid Unicode (a lone surrogate at position {pos})",
                    "messages", "invalid_unicode")


def chat_prompt(messages: Sequence[Any], tool_req: ToolRequest | None) -> Any:
    """The :class:`~dgemma_struct.prompts.ChatPrompt` to generate from (declarations in the system turn)."""
    check_messages(messages)  # before the template: too many / too long messages are refused at once
    return ChatPrompt(messages=template_messages(messages),
                      tools=tool_req.openai_tools() if tool_req is not None else None)
