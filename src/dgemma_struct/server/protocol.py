"""Request bodies of the OpenAI-compatible endpoints (pydantic models; unknown fields are kept for
:func:`~.completions.check_fields`: refused when they name a constraint or a limit, else logged) and the translation of ``response_format`` / vLLM-style
``structured_outputs`` / ``guided_*`` fields into a dgemma-struct spec. Grammars are Lark, or
GBNF/EBNF (``root ::= ...``, converted with llguidance's ``gbnf_to_lark``)."""
from __future__ import annotations

import json
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from dgemma_struct.constraints import Choice, Grammar, Regex
from dgemma_struct.constraints.strict_objects import close_objects
from dgemma_struct.engine.token_logprobs import MAX_TOP_LOGPROBS
from dgemma_struct.options import GenerateOptions
from dgemma_struct.prompts import MAX_SEED, min_template_tokens

from .http_errors import APIError


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextPart(_Open):
    type: str = "text"
    text: Optional[str] = None


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Union[str, list[TextPart], None] = None


class JsonSchemaFormat(_Open):
    name: Optional[str] = Field(default=None, max_length=256)
    description: Optional[str] = None
    schema_: Optional[Union[dict[str, Any], bool]] = Field(default=None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(_Open):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None


class StructuredOutputs(_Open):
    """vLLM's ``structured_outputs`` extra body field: exactly one of these."""

    json_: Optional[Union[dict[str, Any], str, bool]] = Field(default=None, alias="json")
    regex: Optional[str] = None
    grammar: Optional[str] = None
    choice: Optional[list[str]] = None
    json_object: Optional[bool] = None


class _Common(_Open):
    model: Optional[str] = Field(default=None, max_length=256)
    response_format: Optional[ResponseFormat] = None
    structured_outputs: Optional[StructuredOutputs] = None
    guided_json: Optional[Union[dict[str, Any], str]] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None
    max_tokens: Optional[int] = Field(default=None, ge=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    seed: Optional[int] = Field(default=None, ge=-(2 ** 63), le=2 ** 64 - 1)
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    n: Optional[int] = Field(default=1, ge=1)
    stop: Optional[Union[str, list[str]]] = None
    stream: Optional[bool] = False
    stream_options: Optional[dict[str, Any]] = None
    user: Optional[str] = None
    # extensions: thinking (also vLLM's chat_template_kwargs.enable_thinking) and grounding
    chat_template_kwargs: Optional[dict[str, Any]] = None
    thinking: Optional[Union[Literal["optional"], bool]] = None
    max_thinking_tokens: Optional[int] = Field(default=None, ge=1, le=8192)
    grounding: Optional[Union[bool, dict[str, Any]]] = None
    # extension: every option's probability for a choice constraint (true = the "canvas" estimator)
    choice_probabilities: Optional[Union[bool, Literal["canvas", "ar"]]] = None
    # extension: per-field confidence of a JSON answer (JSON Pointer -> probability)
    field_confidence: Optional[bool] = None


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = None
    tools: Optional[list[dict[str, Any]]] = None


class CompletionRequest(_Common):
    prompt: Union[str, list[str]]
    echo: Optional[bool] = None
    logprobs: Optional[int] = None



def choice_estimator_of(req: _Common, spec: Any, *, streaming_or_thinking: bool) -> str | None:
    """The estimator a request's ``choice_probabilities`` asks for (``None``: not asked). It needs a
    choice constraint and a non-streamed answer without thinking; anything else is a 400."""
    asked = getattr(req, "choice_probabilities", None)
    if asked in (None, False):
        return None
    if not isinstance(spec, Choice):
        raise APIError(400, "choice_probabilities needs a choice constraint (guided_choice or "
                            "structured_outputs.choice)", param="choice_probabilities", code="invalid_value")
    if streaming_or_thinking:
        raise APIError(400, "choice_probabilities is not supported with streaming or thinking",
                       param="choice_probabilities", code="unsupported_parameter")
    return "canvas" if asked is True else asked


def logprobs_of(req: _Common, *, chat: bool) -> int | None:
    """How many top alternatives per token the request asks for (``None``: no logprobs). Chat:
    ``logprobs: true`` with ``top_logprobs`` 0..20 (``top_logprobs`` without ``logprobs`` is a 400,
    as OpenAI answers it); completions: ``logprobs`` 0..20 (OpenAI's legacy field)."""
    if chat:
        top, on = getattr(req, "top_logprobs", None), getattr(req, "logprobs", None)
        if top is not None and not on:
            raise APIError(400, "Invalid value for 'top_logprobs': 'logprobs' must be true when 'top_logprobs' "
                                "is set", param="top_logprobs", code="invalid_value")
        if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
            raise APIError(400, f"Invalid 'top_logprobs': expected an integer from 0 to {MAX_TOP_LOGPROBS}, got {top}",
                           param="top_logprobs", code="invalid_value")
        return (top or 0) if on else None
    k = getattr(req, "logprobs", None)
    if k is not None and (isinstance(k, bool) or not 0 <= k <= MAX_TOP_LOGPROBS):
        raise APIError(400, f"Invalid 'logprobs': expected an integer from 0 to {MAX_TOP_LOGPROBS}, got {k}",
                       param="logprobs", code="invalid_value")
    return k


def _schema_arg(value: Any, param: str) -> Any:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError) as err:
            raise APIError(400, f"{param} is not valid JSON: {err}", param=param, code="invalid_schema") from None
    if value is True:
        return {}
    if not isinstance(value, dict):
        raise APIError(400, f"{param} must be a JSON Schema object", param=param, code="invalid_schema")
    if not _depth_ok(value, MAX_SPEC_DEPTH):
        raise APIError(400, f"{param} nests more than {MAX_SPEC_DEPTH} levels deep", param=param,
                       code="constraint_too_complex")
    check_text(value, param)
    return value


MAX_STOPS = 16
MAX_STOP_CHARS = 256
MAX_SPEC_DEPTH = 64


def _depth_ok(value: Any, limit: int) -> bool:
    """True when ``value`` nests at most ``limit`` containers deep (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            items = v.values()
        elif isinstance(v, list):
            items = v
        else:
            continue
        if d > limit:
            return False
        stack.extend((x, d + 1) for x in items)
    return True


def lone_surrogate_at(value: Any) -> int | None:
    """The position of the first lone surrogate in any string of ``value`` (nested dicts -- keys too
    -- lists and tuples), or None when every string is valid Unicode."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as err:
                return err.start
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return None


def check_text(value: Any, param: str) -> None:
    """Every string in a prompt must be valid Unicode (a lone surrogate cannot be encoded)."""
    pos = lone_surrogate_at(value)
    if pos is not None:
        raise APIError(400, f"{param} holds text that is not valid Unicode (a lone surrogate at "
                            f"position {pos})", param=param, code="invalid_unicode")


def _is_gbnf(text: str) -> bool:
    return "::=" in text


def _grammar(text: str, param: str) -> Grammar:
    check_text(text, param)
    if "\n" not in text and text.strip().endswith(".lark"):
        raise APIError(400, f"{param}: the server takes grammar text or a built-in grammar name, not a file path",
                       param=param, code="invalid_grammar")
    if _is_gbnf(text):
        from llguidance.gbnf_to_lark import gbnf_to_lark

        try:
            text = gbnf_to_lark(text)
        except Exception as err:  # noqa: BLE001 - GbnfToLarkError and friends: the message has the line
            raise APIError(400, f"{param}: invalid GBNF grammar: {err}", param=param,
                           code="invalid_grammar") from None
    return Grammar(text)


def stops_of(req: "_Common") -> list[str]:
    """The request's stop sequences (``stop``: a string or a list)."""
    stop = req.stop
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else list(stop)
    if len(stops) > MAX_STOPS:
        raise APIError(400, f"at most {MAX_STOPS} stop sequences", param="stop", code="invalid_stop")
    for s in stops:
        if not s or len(s) > MAX_STOP_CHARS:
            raise APIError(400, f"a stop sequence must be 1 to {MAX_STOP_CHARS} characters", param="stop",
                           code="invalid_stop")
    check_text(stops, "stop")
    return stops


def apply_stop(text: str, stops: list[str]) -> str | None:
    """``text`` cut before the earliest stop sequence, or ``None`` when none occurs."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return None if cut < 0 else text[:cut]


def spec_of(req: _Common) -> tuple[Any, str | None]:
    """The spec a request asks for, and the name of the body field it came from (``None`` spec =
    free text). More than one constraint in one request is a 400."""
    found: list[tuple[Any, str]] = []
    rf = req.response_format
    if rf is not None and rf.type != "text":
        if rf.type == "json_object":
            # instructor and others send {"type": "json_object", "schema": {...}}: enforce that schema
            extra = rf.model_extra or {}
            given = extra.get("schema", extra.get("json_schema"))
            if isinstance(given, dict) and "schema" in given and isinstance(given.get("schema"), dict) \
                    and "type" not in given:
                given = given["schema"]
            if given is not None:
                found.append((_schema_arg(given, "response_format.schema"), "response_format"))
            else:
                found.append(({"type": "object"}, "response_format"))
        else:
            if rf.json_schema is None or rf.json_schema.schema_ is None:
                raise APIError(400, "response_format.json_schema.schema is required for type 'json_schema'",
                               param="response_format.json_schema.schema", code="invalid_schema")
            schema = _schema_arg(rf.json_schema.schema_, "response_format.json_schema.schema")
            if rf.json_schema.strict:  # OpenAI strict mode: no undeclared keys in any object
                schema = close_objects(schema)
            found.append((schema, "response_format"))
    so = req.structured_outputs
    if so is not None:
        given = [k for k in ("json_", "regex", "grammar", "choice") if getattr(so, k) is not None]
        if so.json_object:
            given.append("json_object")
        if len(given) != 1:
            raise APIError(400, "structured_outputs needs exactly one of json, regex, grammar, choice, json_object"
                                f" (got {len(given)})", param="structured_outputs", code="invalid_constraint")
        k = given[0]
        if k == "json_":
            schema = _schema_arg(so.json_, "structured_outputs.json")
            if (so.model_extra or {}).get("disable_additional_properties") is True:  # vLLM's strict switch
                schema = close_objects(schema)
            found.append((schema, "structured_outputs.json"))
        elif k == "json_object":
            found.append(({"type": "object"}, "structured_outputs.json_object"))
        elif k == "regex":
            check_text(so.regex, "structured_outputs.regex")
            found.append((Regex(so.regex), "structured_outputs.regex"))
        elif k == "grammar":
            found.append((_grammar(so.grammar, "structured_outputs.grammar"), "structured_outputs.grammar"))
        else:
            check_text(so.choice, "structured_outputs.choice")
            found.append((Choice(list(so.choice)), "structured_outputs.choice"))
    if req.guided_json is not None:
        found.append((_schema_arg(req.guided_json, "guided_json"), "guided_json"))
    if req.guided_regex is not None:
        check_text(req.guided_regex, "guided_regex")
        found.append((Regex(req.guided_regex), "guided_regex"))
    if req.guided_choice is not None:
        check_text(req.guided_choice, "guided_choice")
        found.append((Choice(list(req.guided_choice)), "guided_choice"))
    if req.guided_grammar is not None:
        found.append((_grammar(req.guided_grammar, "guided_grammar"), "guided_grammar"))
    if len(found) > 1:
        raise APIError(400, "give one output constraint per request; got " + ", ".join(p for _, p in found),
                       param=found[1][1], code="invalid_constraint")
    return found[0] if found else (None, None)


#: most messages in one chat request, and most characters of content over all of them: checked before
#: the chat template runs (rendering is pure Python holding the GIL, about quadratic in the number of
#: messages: 256 short messages take ~0.5 s, 1,024 ~5 s, 3,000 ~30 s on the embedded tokenizer)
MAX_MESSAGES = 256
MAX_MESSAGE_CHARS = 1_000_000


def check_messages(messages: Any) -> None:
    """Refuse, in microseconds, a message list that is too long to render (``too_many_messages`` /
    ``messages_too_long``): before the template, and before any tokenization."""
    n = len(messages)
    if n > MAX_MESSAGES:
        raise APIError(400, f"too many messages: {n} (at most {MAX_MESSAGES} per request)", param="messages",
                       code="too_many_messages")
    chars = 0
    for m in messages:
        c = m.get("content") if isinstance(m, dict) else getattr(m, "content", None)
        if isinstance(c, str):
            chars += len(c)
        elif isinstance(c, list):
            chars += sum(len(getattr(p, "text", None) or (p.get("text") or "" if isinstance(p, dict) else ""))
                         for p in c)
    if chars > MAX_MESSAGE_CHARS:
        raise APIError(400, f"the messages hold {chars} characters (at most {MAX_MESSAGE_CHARS})", param="messages",
                       code="messages_too_long")


def generation_options(req: Any, *, max_tokens: int, thinking: Any = False,
                       logprobs: int | None = None, confidence: bool = False) -> GenerateOptions:
    """The request's generation knobs as one :class:`~dgemma_struct.options.GenerateOptions`, made
    once here and carried by the job to its scheduler row (``seed`` wrapped into the valid range;
    ``None``: a fresh seed per row)."""
    knobs: dict[str, Any] = dict(max_new_tokens=max_tokens, logprobs=logprobs, temperature=req.temperature,
                                 seed=None if req.seed is None else int(req.seed) % (MAX_SEED + 1))
    if req.top_p is not None:
        knobs["top_p"] = req.top_p
    if confidence:
        knobs["confidence"] = True
    if thinking is not False:
        knobs["thinking"] = thinking
        if req.max_thinking_tokens is not None:
            knobs["max_thinking_tokens"] = req.max_thinking_tokens
    return GenerateOptions(**knobs)


def estimated_prompt_tokens(prompt: Any) -> int:
    """A lower bound on a prompt's tokens, without the template: every non-system turn costs
    :data:`~dgemma_struct.prompts.MIN_TOKENS_PER_MESSAGE` (a system message may be folded into the first user turn)."""
    messages = getattr(prompt, "messages", prompt)
    return min_template_tokens(messages) if isinstance(messages, list) else 1


def prompt_of_messages(messages: list[ChatMessage]) -> list[dict[str, str]]:
    check_messages(messages)
    out = []
    for i, m in enumerate(messages):
        if isinstance(m.content, list):
            texts = []
            for part in m.content:
                if part.type != "text" or part.text is None:
                    raise APIError(400, f"messages[{i}]: only text content parts are supported (got {part.type!r})",
                                   param=f"messages.{i}.content", code="unsupported_content")
                texts.append(part.text)
            content = "".join(texts)
        else:
            content = m.content or ""
        out.append({"role": "system" if m.role == "developer" else m.role, "content": content})
    return out


def thinking_of(req: _Common) -> tuple[Any, str | None]:
    """The request's thinking setting (``False``, ``True`` = a thought block required, or
    ``"optional"``) and the body field it came from. The ``thinking`` extension field wins over
    vLLM's ``chat_template_kwargs={"enable_thinking": ...}``."""
    if req.thinking is not None:
        return req.thinking, "thinking"
    kw = req.chat_template_kwargs or {}
    if "enable_thinking" in kw:
        on = kw["enable_thinking"]
        if not isinstance(on, bool):
            raise APIError(400, "chat_template_kwargs.enable_thinking must be true or false",
                           param="chat_template_kwargs.enable_thinking", code="invalid_request")
        return on, "chat_template_kwargs.enable_thinking"
    return False, None
