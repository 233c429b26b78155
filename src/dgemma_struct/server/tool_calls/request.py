"""The request side of tool calling: OpenAI ``tools`` / ``tool_choice`` / ``parallel_tool_calls``
(and the legacy ``functions`` / ``function_call``) checked into a :class:`ToolRequest`, and the
constraint that request compiles to. Every bad input raises :class:`ToolRequestError`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from dgemma_struct.errors import ConstraintEngineError, ConstraintError, PromptTooLongError
from dgemma_struct.constraints import Grammar, Regex, compile_constraint, get_tokenizer_info
from dgemma_struct.tools import TOOL_CHOICES, Tool, ToolCallError, compile_tool_calls, normalise_tools

from ..http_errors import APIError, ToolRequestError, api_error_for

#: Request fields this module reads (the server's pydantic models keep them as extra fields).
TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call", "max_tool_calls",
               "allowed_tools")


@dataclass(frozen=True)
class ToolRequest:
    """The tool part of a chat request, checked. ``tool_choice`` is ``"auto"``, ``"required"``,
    ``"none"`` or ``{"name": NAME}``; ``legacy`` is true when the request used ``functions`` (the
    answer then uses ``message.function_call``, one call at most)."""

    tools: tuple[Tool, ...]
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    legacy: bool = False
    allowed: frozenset[str] | None = None   # ``allowed_tools``: the tools that may be called (all rendered)
    max_calls: int | None = None            # ``max_tool_calls``: most calls in one answer

    def tool(self, name: str) -> Tool | None:
        """The declared tool called ``name``."""
        return next((t for t in self.tools if t.name == name), None)

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
        elif entry.get("type") == "custom":
            out.append(_custom(entry, param))
            continue
        else:
            if entry.get("type", "function") != "function":
                raise _fail(f"{param}: only tools of type 'function' or 'custom' are supported, got "
                            f"{entry.get('type')!r}", f"{param}.type", "unsupported_tool_type")
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


def _custom(entry: Mapping[str, Any], param: str) -> dict[str, Any]:
    """A chat ``{"type": "custom", "custom": {"name", "description", "format"}}`` entry, shape-checked."""
    spec = entry.get("custom")
    if not isinstance(spec, Mapping):
        raise _fail(f"{param}.custom must be an object", f"{param}.custom", "invalid_tools")
    param = f"{param}.custom"
    if not isinstance(spec.get("name"), str) or not spec["name"]:
        raise _fail(f"{param}.name must be a non-empty string", f"{param}.name", "invalid_tool_name")
    fmt = spec.get("format", {"type": "text"})
    if not isinstance(fmt, Mapping) or fmt.get("type") not in ("text", "grammar"):
        raise _fail(f"{param}.format must be {{'type': 'text'}} or {{'type': 'grammar', 'grammar': ...}}",
                    f"{param}.format", "invalid_tools")
    if fmt["type"] == "grammar":
        g = fmt.get("grammar") if isinstance(fmt.get("grammar"), Mapping) else fmt   # chat nests it; Responses not
        if g.get("syntax") not in ("lark", "regex"):
            raise _fail(f"{param}.format.grammar.syntax must be 'lark' or 'regex', got {g.get('syntax')!r}",
                        f"{param}.format.grammar.syntax", "invalid_tools")
        if not isinstance(g.get("definition"), str) or not g["definition"].strip():
            raise _fail(f"{param}.format.grammar.definition must be a non-empty string",
                        f"{param}.format.grammar.definition", "invalid_grammar")
        fmt = {"type": "grammar", "syntax": g["syntax"], "definition": g["definition"]}
    if spec.get("description") is not None and not isinstance(spec["description"], str):
        raise _fail(f"{param}.description must be a string", f"{param}.description", "invalid_tools")
    return {"type": "custom", "custom": {"name": spec["name"], "description": spec.get("description") or "",
                                         "format": dict(fmt)}}


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
        kind = raw.get("type", "function")
        if kind not in ("function", "custom") or not isinstance(raw.get(kind), Mapping):
            raise _fail(f'{field} objects look like {{"type": "function", "function": {{"name": ...}}}} (or '
                        f'"custom" / "custom")', field, "invalid_tool_choice")
        name = raw[kind].get("name")
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
    max_calls = _get(req, "max_tool_calls")
    if max_calls is not None and (isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls < 1):
        raise _fail(f"max_tool_calls must be a positive integer, got {max_calls!r}", "max_tool_calls",
                    "invalid_request")
    allowed = _get(req, "allowed_tools")
    if allowed is not None:
        unknown = sorted(set(allowed) - {t.name for t in normalised})
        if unknown:
            raise _fail(f"tool_choice.tools names {unknown[0]!r}, which is not among the declared tools",
                        "tool_choice.tools", "unknown_tool")
    return ToolRequest(tools=tuple(normalised), tool_choice=choice,
                       parallel_tool_calls=False if legacy else (True if parallel is None else parallel),
                       legacy=legacy, allowed=None if allowed is None else frozenset(allowed), max_calls=max_calls)


def prepare_tokenizer(runtime: Any) -> None:
    """Build (once per tokenizer; cached) the llguidance tokenizer data :func:`compile_for` needs.
    Seconds for Gemma 4's 262k vocabulary: call it untimed before a timed compile."""
    get_tokenizer_info(runtime.tokenizer, stop_token_ids=list(runtime.eos_token_ids),
                       vocab_size=runtime.model.config.text_config.vocab_size)


def compile_for(tool_req: ToolRequest, runtime: Any) -> Any:
    """The :class:`~dgemma_struct.tools.ToolCallConstraint` of a request, for ``runtime``'s tokenizer.
    A tokenizer without Gemma 4's tool tokens is a 400 ``tools_unsupported_by_model``."""
    field = "functions" if tool_req.legacy else "tools"
    stops, vocab = list(runtime.eos_token_ids), runtime.model.config.text_config.vocab_size
    for i, t in enumerate(tool_req.tools):   # a custom grammar: the compiler (and errors) of response_format
        if t.grammar is not None:
            spec = Regex(t.grammar[1]) if t.grammar[0] == "regex" else Grammar(t.grammar[1])
            try:
                compile_constraint(spec, get_tokenizer_info(runtime.tokenizer, stop_token_ids=stops, vocab_size=vocab))
            except (ConstraintError, ConstraintEngineError) as err:
                raise _fail(str(err), f"{field}.{i}.custom.format.grammar.definition",
                            api_error_for(err).code) from None
    callable_ = [t for t in tool_req.tools if tool_req.allowed is None or t.name in tool_req.allowed]
    try:
        return compile_tool_calls(callable_, runtime.tokenizer, tool_choice=tool_req.tool_choice,
                                  parallel_tool_calls=tool_req.parallel_tool_calls, stop_token_ids=stops,
                                  vocab_size=vocab, max_calls=tool_req.max_calls)
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


def api_error(err: ToolRequestError) -> APIError:
    """The server's :class:`~dgemma_struct.server.http_errors.APIError` (HTTP 400) for a bad tool request."""
    return api_error_for(err)
