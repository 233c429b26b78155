"""OpenAI's Responses API, ``POST /v1/responses``: the request is checked and translated into the
chat request it means (``input`` + ``instructions`` -> messages, ``text.format`` -> ``response_format``,
``tools`` / ``tool_choice`` -> the chat tool fields, ``max_output_tokens`` -> ``max_tokens``,
``reasoning`` -> the thinking channel), runs on the same batch road as chat completions
(:func:`.completions.execute`), and its rows become a ``response`` object (:mod:`.responses_body`):
``message`` / ``function_call`` / ``custom_tool_call`` / ``reasoning`` output items, ``status`` and
``incomplete_details``, ``usage`` and the SDK's stats under ``dgemma_stats``. No state is kept on the
server: ``store: true``, ``previous_response_id``, ``conversation`` and ``background`` are 400s.

>>> req = ResponsesRequest(input="Hi", text={"format": {"type": "json_object"}}, max_output_tokens=32)
>>> chat = chat_body(req)
>>> chat["messages"], chat["response_format"], chat["max_tokens"]
([{'role': 'user', 'content': 'Hi'}], {'type': 'json_object'}, 32)
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dgemma_struct.errors import DgemmaStructError

from .completions import Ran, check_fields, execute
from .http_errors import APIError, api_error_for
from .protocol import ChatCompletionRequest, prompt_of_messages, spec_of
from .responses import json_response
from .responses_body import response_body
from .responses_stream import stream_response
from .state import ServerState
from .tool_calls import chat_prompt, tool_request_of


class ResponsesRequest(BaseModel):
    """The body of ``POST /v1/responses`` (OpenAI's fields plus the ``seed`` and ``field_confidence``
    extensions). Unknown fields naming a constraint or a limit are 400s (:func:`.completions.check_fields`)."""

    model_config = ConfigDict(extra="allow")

    model: Optional[str] = Field(default=None, max_length=256)
    input: Union[str, list[dict[str, Any]]]
    instructions: Optional[str] = None
    text: Optional[dict[str, Any]] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    parallel_tool_calls: Optional[bool] = None
    max_tool_calls: Optional[int] = Field(default=None, ge=1)
    max_output_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    seed: Optional[int] = Field(default=None, ge=-(2 ** 63), le=2 ** 64 - 1)
    reasoning: Optional[dict[str, Any]] = None
    metadata: Optional[dict[str, str]] = None
    store: Optional[bool] = None
    stream: Optional[bool] = False
    stream_options: Optional[dict[str, Any]] = None
    previous_response_id: Optional[str] = None
    conversation: Optional[Any] = None
    background: Optional[bool] = None
    include: Optional[list[str]] = None
    truncation: Optional[Literal["auto", "disabled"]] = None
    top_logprobs: Optional[int] = None
    prompt: Optional[dict[str, Any]] = None
    user: Optional[str] = None
    field_confidence: Optional[bool] = None
    # the chat endpoint's constraint extensions, passed through as they are (checked there)
    structured_outputs: Optional[Any] = None
    guided_json: Optional[Any] = None
    guided_regex: Optional[Any] = None
    guided_choice: Optional[Any] = None
    guided_grammar: Optional[Any] = None
    grounding: Optional[Any] = None
    thinking: Optional[Any] = None
    max_thinking_tokens: Optional[Any] = None
    choice_probabilities: Optional[Any] = None


#: request fields that need server-side state or a feature this server does not have: a 400 naming them
_REFUSED = {"previous_response_id": "stored responses are not kept (store is always false): send the whole "
                                    "conversation in input",
            "conversation": "conversations are not kept: send the whole conversation in input",
            "prompt": "stored prompt templates are not supported: send instructions and input",
            "top_logprobs": "logprobs are not supported on /v1/responses yet (use /v1/chat/completions)",
            "include": "no include value is supported (reasoning text is in the output; no logprobs, no "
                       "encrypted reasoning)",
            "choice_probabilities": "choice_probabilities is served on /v1/chat/completions only"}
#: extension fields handed to the chat request unchanged
_PASSED = ("structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "grounding",
           "thinking", "max_thinking_tokens", "field_confidence")
_REASONING = ("none", "minimal", "low", "medium", "high", "xhigh")


def _refuse(req: ResponsesRequest) -> None:
    """A 400 for every field that names something this server cannot honour."""
    for name, why in _REFUSED.items():
        value = getattr(req, name)
        if value not in (None, [], {}):
            raise APIError(400, f"{name}: {why}", param=name, code="unsupported_parameter")
    if req.store:
        raise APIError(400, "store: responses are never stored on this server; send store: false (or omit it)",
                       param="store", code="unsupported_parameter")
    if req.background:
        raise APIError(400, "background responses are not supported", param="background",
                       code="unsupported_parameter")
    if req.truncation == "auto":
        raise APIError(400, "truncation 'auto' is not supported: a prompt that does not fit is a 400",
                       param="truncation", code="unsupported_parameter")


def _content(content: Any, param: str) -> str:
    """A message's text: a string, or ``input_text`` / ``output_text`` / ``text`` parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, f"{param} must be a string or a list of content parts", param=param,
                       code="invalid_value")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
            raise APIError(400, f"{param}.{j}: only text parts (input_text, output_text) are supported, got "
                                f"{kind!r}", param=f"{param}.{j}.type", code="unsupported_content")
        out.append(part["text"])
    return "".join(out)


def _messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """``instructions`` + ``input`` as chat messages (tool calls and their outputs included)."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": req.instructions}] if req.instructions else []
    if isinstance(req.input, str):
        return msgs + [{"role": "user", "content": req.input}]
    if not req.input:
        raise APIError(400, "input must not be empty", param="input", code="invalid_value")
    for i, item in enumerate(req.input):
        param, kind = f"input.{i}", item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise APIError(400, f"{param}.role must be user, system, developer or assistant, got {role!r}",
                               param=f"{param}.role", code="invalid_value")
            msgs.append({"role": role, "content": _content(item.get("content"), f"{param}.content")})
        elif kind in ("function_call", "custom_tool_call"):
            call = ({"type": "function", "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
                    if kind == "function_call" else
                    {"type": "custom", "custom": {"name": item.get("name"), "input": item.get("input")}})
            call["id"] = item.get("call_id")
            if msgs and msgs[-1]["role"] == "assistant" and msgs[-1].get("tool_calls") is not None:
                msgs[-1]["tool_calls"].append(call)   # parallel calls: one assistant turn
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            out = item.get("output")
            msgs.append({"role": "tool", "tool_call_id": item.get("call_id"),
                         "content": out if isinstance(out, str) else _content(out, f"{param}.output")})
        elif kind == "reasoning":
            continue   # an earlier thought handed back: the chat template drops past thoughts anyway
        else:
            raise APIError(400, f"{param}: input items of type {kind!r} are not supported", param=f"{param}.type",
                           code="unsupported_input_item")
    return msgs


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise APIError(400, "text.format.type must be text, json_object or json_schema", param="text.format.type",
                       code="invalid_value")
    unknown = set(fmt) - {"type", "name", "schema", "strict", "description"}
    if unknown:
        name = sorted(unknown)[0]
        raise APIError(400, f"unknown parameter 'text.format.{name}' (a constraint is never ignored)",
                       param=f"text.format.{name}", code="unknown_parameter")
    if fmt["type"] != "json_schema":
        return {"type": fmt["type"]}
    if "schema" not in fmt:
        raise APIError(400, "text.format.schema is required for type 'json_schema'", param="text.format.schema",
                       code="invalid_schema")
    return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict", "description")
                                                   if k in fmt}}


def _tools(req: ResponsesRequest) -> dict[str, Any]:
    """``tools`` / ``tool_choice`` in the chat request's shape (``allowed_tools`` -> ``allowed_tools``)."""
    if req.tools is None:
        return {} if req.tool_choice is None else {"tool_choice": req.tool_choice}
    tools = []
    for i, t in enumerate(req.tools):
        kind = t.get("type")
        if kind == "function":
            tools.append({"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters",
                                                                             "strict") if k in t}})
        elif kind == "custom":
            tools.append({"type": "custom", "custom": {k: t[k] for k in ("name", "description", "format") if k in t}})
        else:
            raise APIError(400, f"tools.{i}: only tools of type 'function' or 'custom' are supported, got {kind!r}",
                           param=f"tools.{i}.type", code="unsupported_tool_type")
    out: dict[str, Any] = {"tools": tools}
    choice = req.tool_choice
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind in ("function", "custom"):
            choice = {"type": kind, kind: {"name": choice.get("name")}}
        elif kind == "allowed_tools":
            listed = choice.get("tools")
            names = [t.get("name") for t in listed if isinstance(t, dict)] if isinstance(listed, list) else []
            if not names or len(names) != len(listed) or not all(isinstance(n, str) for n in names):
                raise APIError(400, "tool_choice.tools must list the allowed tools by name", param="tool_choice.tools",
                               code="invalid_tool_choice")
            out["allowed_tools"], choice = names, choice.get("mode", "auto")
        else:
            raise APIError(400, f"tool_choice of type {kind!r} is not supported", param="tool_choice.type",
                           code="invalid_tool_choice")
    if choice is not None:
        out["tool_choice"] = choice
    return out


def chat_body(req: ResponsesRequest) -> dict[str, Any]:
    """The chat-completions body a Responses request means (see the module docstring)."""
    body: dict[str, Any] = {"messages": _messages(req), "stream": False}
    for src, dst in (("model", "model"), ("max_output_tokens", "max_tokens"), ("temperature", "temperature"),
                     ("top_p", "top_p"), ("seed", "seed"), ("parallel_tool_calls", "parallel_tool_calls"),
                     ("max_tool_calls", "max_tool_calls"), *((k, k) for k in _PASSED)):
        if getattr(req, src) is not None:
            body[dst] = getattr(req, src)
    rf = _response_format(req.text)
    if rf is not None:
        body["response_format"] = rf
    effort = (req.reasoning or {}).get("effort")
    if effort is not None and effort not in _REASONING:
        raise APIError(400, f"reasoning.effort must be one of {_REASONING}", param="reasoning.effort",
                       code="invalid_value")
    if req.reasoning is not None and effort != "none" and req.thinking is None:
        body["thinking"] = True   # the model's thought channel; its depth is not adjustable
    return {**body, **_tools(req)}


def _param(name: str | None) -> str | None:
    """A chat field's name as the Responses request spells it."""
    if name is None:
        return None
    for chat, resp in (("max_tokens", "max_output_tokens"), ("response_format.json_schema", "text.format"),
                       ("response_format", "text.format"), ("messages", "input"), ("thinking", "reasoning")):
        if name == chat or name.startswith(chat + "."):
            return resp + name[len(chat):]
    return name.replace(".custom.format.grammar.", ".format.").replace(".custom.", ".").replace(".function.", ".")


async def respond(state: ServerState, req: ResponsesRequest, request: Request | None = None) -> Any:
    """Answer ``POST /v1/responses``: a ``response`` object, or its event stream with ``stream: true``."""
    check_fields(req)
    _refuse(req)
    try:
        chat = ChatCompletionRequest.model_validate(chat_body(req))
        tool_req = tool_request_of(chat, output_constraint=spec_of(chat)[1])
        toolish = any(m.role == "tool" or (m.model_extra or {}).get("tool_calls") for m in chat.messages)
        prompt = chat_prompt(chat.messages, tool_req) if (tool_req or toolish) else prompt_of_messages(chat.messages)
        ran = await execute(state, chat, [prompt], chat=True, request=request, tool_req=tool_req)
    except (APIError, DgemmaStructError) as err:
        err = api_error_for(err)
        raise APIError(err.status, err.message.replace("max_tokens", "max_output_tokens"), type=err.type,
                       param=_param(err.param), code=err.code, headers=err.headers) from None
    except ValidationError as err:
        first = err.errors()[0]
        where = _param(".".join(str(x) for x in first.get("loc", ())))
        raise APIError(400, f"invalid request: {where}: {first.get('msg')}", param=where,
                       code="invalid_request_body") from None
    if not isinstance(ran, Ran):
        return ran   # the client went away (499)
    body = response_body(state, req, ran, tool_req)
    if req.stream:
        return stream_response(body)
    return json_response(body)
