"""Tool calling with guaranteed arguments, in DiffusionGemma's native format.

Gemma 4 writes a call as ``<|tool_call>call:NAME{key:VALUE,...}<tool_call|>`` (one or more), then
``<|tool_response>`` (a stop token). Keys are bare, strings are ``<|"|>raw text<|"|>`` with no
escapes, numbers / ``true`` / ``false`` / ``null`` / arrays / objects as in JSON. The markers are
single control tokens (ids 48, 49, 52 on Gemma 4), never spelled from ordinary pieces.

This module turns tool declarations (pydantic models, Python functions, OpenAI tool dicts) into one
grammar over the declared tools, so the canvas can only ever hold calls to a declared tool whose
arguments follow that tool's JSON Schema; after decoding, arguments are converted to JSON and
validated (jsonschema, and pydantic for model tools), and what the grammar cannot express goes
through the same repair loop and AR fallback as JSON.

Example (needs a tokenizer with Gemma 4's tool tokens, e.g. the real checkpoint's)::

    from pydantic import BaseModel
    from dgemma_struct.tools import tool_call_grammar, as_tool

    class GetWeather(BaseModel):
        city: str

    print(tool_call_grammar([as_tool(GetWeather)], marker_ids=GEMMA4_MARKERS)[:40])
"""
from __future__ import annotations

import inspect
import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from dgemma_struct.constraints.compile import Constraint, ValidationIssue, ValidationOutcome
from dgemma_struct.constraints.json_schema import iter_issues, make_validator
from dgemma_struct.errors import ConstraintError, InvalidRequestError, SchemaError
from dgemma_struct.results import GenerationStats

__all__ = ["Tool", "ToolCall", "ToolCallResult", "ToolCallError", "as_tool", "normalise_tools", "tool_call_grammar",
           "compile_tool_calls", "parse_tool_calls", "encode_arguments", "generate_tool_calls", "GEMMA4_MARKERS",
           "TOOL_CHOICES"]

TOOL_CHOICES = ("auto", "required", "none")
#: Gemma 4's tool control tokens by role (names as in the tokenizer).
MARKER_TOKENS = {"call_open": "<|tool_call>", "call_close": "<tool_call|>", "str": '<|"|>',
                 "response": "<|tool_response>"}
GEMMA4_MARKERS = {"call_open": 48, "call_close": 49, "str": 52, "response": 50}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}")
_KEY = re.compile(r"[^\s:,{}\[\]<>\"]{1,128}")
_MAX_TOOLS = 128
_MAX_DEPTH = 24


class ToolCallError(ConstraintError):
    """Bad tool declarations or ``tool_choice`` (duplicate or non-identifier names, invalid argument
    schemas, an unknown tool named in ``tool_choice``, a tokenizer without tool-call tokens)."""


# ----------------------------------------------------------------------------------------------
# declarations
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tool:
    """One declared tool: ``name``, ``description``, ``parameters`` (the arguments' JSON Schema, an
    object schema) and, for tools given as pydantic models, ``model`` (arguments are returned as an
    instance of it)."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    model: Any = None
    strict: bool = False

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry (what the chat template renders into the system turn)."""
        fn: dict[str, Any] = {"name": self.name, "parameters": dict(self.parameters)}
        if self.description:
            fn["description"] = self.description
        return {"type": "function", "function": fn}


def _function_schema(fn: Callable) -> tuple[dict[str, Any], Any]:
    from pydantic import create_model

    sig = inspect.signature(fn)
    fields: dict[str, Any] = {}
    for name, p in sig.parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ToolCallError(f"tool function {fn.__name__!r}: *args/**kwargs cannot be declared as arguments")
        ann = p.annotation if p.annotation is not inspect.Parameter.empty else Any
        fields[name] = (ann, ... if p.default is inspect.Parameter.empty else p.default)
    try:
        model = create_model(f"{fn.__name__}_arguments", **fields)
        schema = model.model_json_schema()
    except Exception as err:  # pydantic.PydanticSchemaGenerationError, TypeError
        raise ToolCallError(f"tool function {fn.__name__!r}: cannot derive an argument schema: {err}") from err
    schema.pop("title", None)
    return schema, model


def as_tool(obj: Any) -> Tool:
    """A :class:`Tool` from a pydantic model class, a plain function (signature + docstring), an
    OpenAI tool dict (``{"type": "function", "function": {...}}``), a legacy function dict
    (``{"name": ..., "parameters": ...}``) or a :class:`Tool`."""
    from pydantic import BaseModel

    if isinstance(obj, Tool):
        return obj
    if isinstance(obj, type) and issubclass(obj, BaseModel):
        schema = obj.model_json_schema()
        desc = schema.pop("description", "") or (inspect.getdoc(obj) or "")
        schema.pop("title", None)
        return Tool(name=obj.__name__, description=desc, parameters=schema, model=obj)
    if isinstance(obj, Mapping):
        spec = obj
        if obj.get("type") == "function" or "function" in obj:
            spec = obj.get("function")
            if not isinstance(spec, Mapping):
                raise ToolCallError("a tool dict of type 'function' needs a 'function' object")
        elif obj.get("type") not in (None, "function"):
            raise ToolCallError(f"unsupported tool type {obj.get('type')!r} (only 'function' tools)")
        name = spec.get("name")
        params = spec.get("parameters", {"type": "object", "properties": {}})
        if params is None:
            params = {"type": "object", "properties": {}}
        if not isinstance(params, Mapping):
            raise ToolCallError(f"tool {name!r}: 'parameters' must be a JSON Schema object")
        desc = spec.get("description") or ""
        if not isinstance(desc, str):
            raise ToolCallError(f"tool {name!r}: 'description' must be a string")
        return Tool(name=name, description=desc, parameters=dict(params), strict=bool(spec.get("strict", False)))
    if callable(obj) and hasattr(obj, "__name__"):
        schema, model = _function_schema(obj)
        return Tool(name=obj.__name__, description=inspect.getdoc(obj) or "", parameters=schema, model=model)
    raise ToolCallError(f"cannot use {type(obj).__name__} as a tool: give a pydantic model, a function or an "
                        "OpenAI tool dict")


def normalise_tools(tools: Sequence[Any]) -> list[Tool]:
    """Validate and convert declarations: identifier names, no duplicates, object argument schemas
    that are valid JSON Schema."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError as JSError

    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise ToolCallError("tools must be a list of tool declarations")
    if not tools:
        raise ToolCallError("tools is empty")
    if len(tools) > _MAX_TOOLS:
        raise ToolCallError(f"too many tools ({len(tools)}; at most {_MAX_TOOLS})")
    out: list[Tool] = []
    seen: set[str] = set()
    for t in tools:
        tool = as_tool(t)
        if not isinstance(tool.name, str) or not _NAME.fullmatch(tool.name):
            raise ToolCallError(f"tool name {tool.name!r} is not an identifier ([A-Za-z_][A-Za-z0-9_.-]*, ≤ 64 chars)")
        if tool.name in seen:
            raise ToolCallError(f"duplicate tool name {tool.name!r}")
        seen.add(tool.name)
        params = tool.parameters
        if params.get("type", "object") != "object":
            raise ToolCallError(f"tool {tool.name!r}: the arguments schema must be of type 'object'")
        try:
            Draft202012Validator.check_schema(params)
        except JSError as err:
            raise ToolCallError(f"tool {tool.name!r}: invalid arguments schema: {err.message}") from err
        except RecursionError as err:
            raise ToolCallError(f"tool {tool.name!r}: arguments schema nested too deeply") from err
        out.append(tool)
    return out


# ----------------------------------------------------------------------------------------------
# grammar: JSON Schema -> Gemma-style values (llguidance Lark)
# ----------------------------------------------------------------------------------------------
_STR_BODY = r"/([^<]|<+[^<|])*<*/"  # never contains "<|": no spelled-out control token inside a string
_INT = r"/-?(0|[1-9][0-9]*)/"
_NUM = r"/-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/"
_FORMATS = {"date": r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
            "time": r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})?",
            "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"}


def _lark_str(s: str) -> str:
    return json.dumps(s)


def _regex_lit(pattern: str) -> str:
    return "/" + pattern.replace("/", "\\/") + "/"


class _GrammarBuilder:
    def __init__(self, root_schemas: dict[str, Mapping[str, Any]], str_tok: str):
        self.rules: dict[str, str] = {}
        self.refs: dict[tuple[str, str], str] = {}
        self.str_tok = str_tok
        self.roots = root_schemas
        self._n = 0
        self._generic: str | None = None

    def new(self, prefix: str = "r") -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def literal(self, v: Any) -> str:
        """A Lark expression writing the JSON value ``v`` in Gemma syntax."""
        if isinstance(v, str):
            if "<|" in v:
                raise ToolCallError(f"enum/const string {v!r} contains '<|', which tool arguments cannot hold")
            return f"{self.str_tok} {_lark_str(v)} {self.str_tok}" if v else f"{self.str_tok} {self.str_tok}"
        if isinstance(v, Mapping):
            parts = [f"{_lark_str(str(k) + ':')} {self.literal(x)}" for k, x in v.items()]
            return '"{" ' + ' "," '.join(parts) + (' ' if parts else '') + '"}"'
        if isinstance(v, (list, tuple)):
            parts = [self.literal(x) for x in v]
            return '"[" ' + ' "," '.join(parts) + (' ' if parts else '') + '"]"'
        return _lark_str(encode_arguments(v))  # numbers, booleans, null

    def string_rule(self, s: Mapping[str, Any]) -> str:
        pat = s.get("pattern")
        fmt = s.get("format")
        lo, hi = s.get("minLength"), s.get("maxLength")
        if isinstance(pat, str):
            body = pat
            if body.startswith("^") and body.endswith("$") and not body.endswith("\\$"):
                body = body[1:-1]
            else:  # JSON Schema patterns are searches, not full matches
                body = f"[^<]*({body.lstrip('^').rstrip('$')})[^<]*"
            inner = _regex_lit(body)
        elif isinstance(fmt, str) and fmt in _FORMATS:
            inner = _regex_lit(_FORMATS[fmt])
        elif isinstance(lo, int) or isinstance(hi, int):
            a = lo if isinstance(lo, int) and lo >= 0 else 0
            b = "" if not isinstance(hi, int) else str(max(hi, a))
            inner = _regex_lit(f"[^<]{{{a},{b}}}")
        else:
            inner = _STR_BODY
        return f"{self.str_tok} {inner} {self.str_tok}"

    def generic(self) -> str:
        if self._generic is None:
            g = self._generic = "gval"
            self.rules["gval"] = (f"gstr | {_NUM} | \"true\" | \"false\" | \"null\" | \"[\" (gval (\",\" gval)*)? \"]\""
                                  f" | \"{{\" (gpair (\",\" gpair)*)? \"}}\"")
            self.rules["gstr"] = f"{self.str_tok} {_STR_BODY} {self.str_tok}"
            self.rules["gpair"] = f"/{_KEY.pattern}/ \":\" gval"
            return g
        return self._generic

    def ref(self, root: str, ref: str, depth: int) -> str:
        key = (root, ref)
        if key in self.refs:
            return self.refs[key]
        if not ref.startswith("#"):
            raise ToolCallError(f"only local $ref are supported in tool arguments, not {ref!r}")
        target: Any = self.roots[root]
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, Mapping) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                raise ToolCallError(f"dangling $ref {ref!r} in the arguments of tool {root!r}")
        name = self.new("ref")
        self.refs[key] = name
        self.rules[name] = self.expr(target, root, depth + 1)
        return name

    def expr(self, s: Any, root: str, depth: int = 0) -> str:
        """A Lark expression for values valid against schema ``s`` (a superset where the grammar
        cannot express a keyword: validation decides)."""
        if depth > _MAX_DEPTH:
            raise ToolCallError(f"the arguments schema of tool {root!r} is nested too deeply (> {_MAX_DEPTH})")
        if s is True or s == {}:
            return self.generic()
        if s is False:
            raise ToolCallError(f"tool {root!r}: a 'false' schema admits no value")
        if not isinstance(s, Mapping):
            raise ToolCallError(f"tool {root!r}: schema must be an object, got {type(s).__name__}")
        if "$ref" in s:
            return self.ref(root, s["$ref"], depth)
        if "const" in s:
            return self.literal(s["const"])
        if "enum" in s:
            vals = s["enum"]
            if not isinstance(vals, list) or not vals:
                raise ToolCallError(f"tool {root!r}: enum must be a non-empty list")
            return "(" + " | ".join(self.literal(v) for v in vals) + ")"
        for comb in ("anyOf", "oneOf"):
            if comb in s and isinstance(s[comb], list) and s[comb]:
                base = {k: v for k, v in s.items() if k != comb}
                alts = [self.expr({**base, **sub} if isinstance(sub, Mapping) else sub, root, depth + 1)
                        for sub in s[comb]]
                return "(" + " | ".join(alts) + ")"
        if "allOf" in s and isinstance(s["allOf"], list) and len(s["allOf"]) == 1 and isinstance(s["allOf"][0], Mapping):
            base = {k: v for k, v in s.items() if k != "allOf"}
            return self.expr({**base, **s["allOf"][0]}, root, depth + 1)
        t = s.get("type")
        if isinstance(t, list):
            if not t:
                raise ToolCallError(f"tool {root!r}: empty type list")
            return "(" + " | ".join(self.expr({**s, "type": x}, root, depth + 1) for x in t) + ")"
        if t is None:
            if "properties" in s:
                t = "object"
            elif "items" in s:
                t = "array"
            else:
                return self.generic()
        if t == "string":
            return self.string_rule(s)
        if t == "integer":
            return _INT
        if t == "number":
            return _NUM
        if t == "boolean":
            return '("true" | "false")'
        if t == "null":
            return '"null"'
        if t == "array":
            items = s.get("items", True)
            item = self.new("item")
            self.rules[item] = self.expr(items if not isinstance(items, list) else True, root, depth + 1)
            if isinstance(s.get("minItems"), int) and s["minItems"] >= 1:
                return f'"[" {item} ("," {item})* "]"'
            return f'"[" ({item} ("," {item})*)? "]"'
        if t == "object":
            return self.object_rule(s, root, depth)
        raise ToolCallError(f"tool {root!r}: unknown type {t!r}")

    def object_rule(self, s: Mapping[str, Any], root: str, depth: int) -> str:
        props = s.get("properties") or {}
        if not isinstance(props, Mapping):
            raise ToolCallError(f"tool {root!r}: 'properties' must be an object")
        if not props:
            return self.generic() if s.get("additionalProperties", True) is not False else '"{" "}"'
        required = set(s.get("required") or [])
        items: list[tuple[str, bool]] = []
        for key, sub in props.items():
            if not _KEY.fullmatch(key):
                raise ToolCallError(f"tool {root!r}: property name {key!r} cannot be written as a bare Gemma key")
            rule = self.new("p")
            self.rules[rule] = f"{_lark_str(key + ':')} {self.expr(sub, root, depth + 1)}"
            items.append((rule, key in required))
        # Properties in declared order; optional ones may be left out, commas only between those
        # present. R[i]: items i.. each preceded by a comma; F[i]: items i.., the first present one
        # bare. Rules hold the non-empty part; nullable[i] says whether the language also has "".
        n = len(items)
        r_rule: list[str | None] = [None] * (n + 1)
        f_rule: list[str | None] = [None] * (n + 1)
        nullable = [True] * (n + 1)

        def ref(rule: str | None, can_be_empty: bool) -> str:
            return "" if rule is None else f" {rule}?" if can_be_empty else f" {rule}"

        for i in range(n - 1, -1, -1):
            item, req = items[i]
            tail = ref(r_rule[i + 1], nullable[i + 1])
            r_alts, f_alts = [f'"," {item}{tail}'], [f"{item}{tail}"]
            if not req:
                if r_rule[i + 1]:
                    r_alts.append(r_rule[i + 1])
                if f_rule[i + 1]:
                    f_alts.append(f_rule[i + 1])
            r_rule[i], f_rule[i] = self.new("rest"), self.new("first")
            self.rules[r_rule[i]] = " | ".join(r_alts)
            self.rules[f_rule[i]] = " | ".join(f_alts)
            nullable[i] = (not req) and nullable[i + 1]
        return f'"{{"{ref(f_rule[0], nullable[0])} "}}"'


def control_token_id(tokenizer: Any, token: str) -> int | None:
    """The id of a single-token ``token`` in ``tokenizer``, or None (no full-vocabulary copy: a
    262k ``get_vocab()`` costs seconds)."""
    try:
        tid = tokenizer.convert_tokens_to_ids(token)
    except Exception:  # noqa: BLE001 - tokenizers without the method or with odd inputs
        return None
    if not isinstance(tid, int) or tid < 0:
        return None
    try:
        back = tokenizer.convert_ids_to_tokens(tid)
    except Exception:  # noqa: BLE001
        return None
    return tid if back == token else None


def _marker_ids(tokenizer: Any) -> dict[str, int]:
    ids: dict[str, int] = {}
    for role, tok in MARKER_TOKENS.items():
        tid = control_token_id(tokenizer, tok)
        if tid is None:
            raise ToolCallError(f"this tokenizer has no {tok!r} control token: tool calls need Gemma 4's tool-call "
                                "tokens (the real DiffusionGemma checkpoint has them)")
        ids[role] = tid
    return ids


def tool_call_grammar(tools: Sequence[Tool], *, marker_ids: Mapping[str, int] = GEMMA4_MARKERS,
                      tool_choice: Any = "auto", parallel_tool_calls: bool = True) -> str:
    """The llguidance Lark grammar of the model's answer: calls to the declared tools in Gemma 4's
    format (``"required"`` / a named tool), or calls or free text (``"auto"``), or text only (``"none"``)."""
    choice, named = _check_choice(tool_choice, tools)
    s = f"<[{marker_ids['str']}]>"
    b = _GrammarBuilder({t.name: t.parameters for t in tools}, s)
    bodies = []
    for t in tools:
        if named is not None and t.name != named:
            continue
        args = b.object_rule(t.parameters, t.name, 0) if t.parameters.get("properties") else '"{" "}"'
        bodies.append(f"{_lark_str('call:' + t.name)} {args}")
    call = f"<[{marker_ids['call_open']}]> ({' | '.join(bodies)}) <[{marker_ids['call_close']}]>"
    calls = "call+" if parallel_tool_calls else "call"
    text = "TEXT"
    if choice == "none":
        start = text
    elif choice == "auto":
        start = f"calls | {text}"
    else:
        start = "calls"
    lines = [f"start: {start}", f"calls: {calls}", f"call: {call}", r"TEXT: /(?s:.+)/"]
    lines += [f"{k}: {v}" for k, v in b.rules.items()]
    return "\n".join(lines) + "\n"


def _check_choice(tool_choice: Any, tools: Sequence[Tool]) -> tuple[str, str | None]:
    if isinstance(tool_choice, str):
        if tool_choice not in TOOL_CHOICES:
            raise ToolCallError(f"tool_choice must be one of {TOOL_CHOICES} or {{'name': ...}}, got {tool_choice!r}")
        return tool_choice, None
    if isinstance(tool_choice, Mapping):
        name = tool_choice.get("name")
        if name is None and isinstance(tool_choice.get("function"), Mapping):
            name = tool_choice["function"].get("name")
        if not isinstance(name, str):
            raise ToolCallError(f"tool_choice must name a tool: {tool_choice!r}")
        if name not in {t.name for t in tools}:
            raise ToolCallError(f"tool_choice names {name!r}, which is not a declared tool")
        return "named", name
    raise ToolCallError(f"tool_choice must be a string or {{'name': ...}}, got {type(tool_choice).__name__}")


# ----------------------------------------------------------------------------------------------
# Gemma-style values <-> JSON
# ----------------------------------------------------------------------------------------------
def encode_arguments(value: Any, *, str_delim: str = MARKER_TOKENS["str"]) -> str:
    """JSON value -> Gemma 4 argument syntax (what the chat template writes for past calls)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if isinstance(value, str):
        return f"{str_delim}{value}{str_delim}" if str_delim else value
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{encode_arguments(v, str_delim=str_delim)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(encode_arguments(v, str_delim=str_delim) for v in value) + "]"
    raise TypeError(f"cannot encode {type(value).__name__}")


class _Parser:
    def __init__(self, text: str):
        self.s = text
        self.i = 0

    def error(self, what: str) -> ValueError:
        return ValueError(f"{what} at character {self.i}: {self.s[self.i:self.i + 30]!r}")

    def take(self, lit: str) -> bool:
        if self.s.startswith(lit, self.i):
            self.i += len(lit)
            return True
        return False

    def expect(self, lit: str) -> None:
        if not self.take(lit):
            raise self.error(f"expected {lit!r}")

    def value(self, depth: int = 0) -> Any:
        if depth > 64:
            raise self.error("nested too deeply")
        d = MARKER_TOKENS["str"]
        if self.take(d):
            j = self.s.find(d, self.i)
            if j < 0:
                raise self.error("unterminated string")
            out, self.i = self.s[self.i:j], j + len(d)
            return out
        if self.take("{"):
            obj: dict[str, Any] = {}
            if self.take("}"):
                return obj
            while True:
                m = _KEY.match(self.s, self.i)
                if not m:
                    raise self.error("expected a key")
                self.i = m.end()
                self.expect(":")
                obj[m.group()] = self.value(depth + 1)
                if self.take("}"):
                    return obj
                self.expect(",")
        if self.take("["):
            arr: list[Any] = []
            if self.take("]"):
                return arr
            while True:
                arr.append(self.value(depth + 1))
                if self.take("]"):
                    return arr
                self.expect(",")
        for lit, v in (("true", True), ("false", False), ("null", None)):
            if self.take(lit):
                return v
        m = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?").match(self.s, self.i)
        if not m:
            raise self.error("expected a value")
        self.i = m.end()
        num = m.group()
        if m.group(2) or m.group(3):
            f = float(num)
            if f in (float("inf"), float("-inf")):
                raise self.error(f"number {num} is outside the range of a double")
            return f
        return int(num)


def parse_tool_calls(text: str) -> list[tuple[str, dict[str, Any]]]:
    """Parse ``<|tool_call>call:NAME{...}<tool_call|>`` calls from decoded text (special tokens kept).
    Raises ``ValueError`` when the text is not a sequence of well-formed calls; text after the calls
    that is only a stop marker is ignored. This is also what a post-hoc parser (vLLM's) does with
    free text, so the benchmark uses it for the unconstrained baseline."""
    p = _Parser(text.strip())
    calls: list[tuple[str, dict[str, Any]]] = []
    open_, close = MARKER_TOKENS["call_open"], MARKER_TOKENS["call_close"]
    while p.i < len(p.s):
        if p.s.startswith(MARKER_TOKENS["response"], p.i):
            break
        p.expect(open_)
        p.expect("call:")
        m = _NAME.match(p.s, p.i)
        if not m:
            raise p.error("expected a tool name")
        p.i = m.end()
        if not p.s.startswith("{", p.i):
            raise p.error("expected '{'")
        args = p.value()
        p.expect(close)
        calls.append((m.group(), args))
    if not calls:
        raise ValueError("no tool call in the text")
    return calls


# ----------------------------------------------------------------------------------------------
# constraint and results
# ----------------------------------------------------------------------------------------------
@dataclass
class ToolCall:
    """One validated call: ``name``, ``arguments`` (a JSON-able dict valid against the tool's
    schema), ``value`` (the pydantic instance for model / function tools, else the dict), ``id``."""

    name: str
    arguments: dict[str, Any]
    value: Any = None
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(12))

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass
class ToolCallResult:
    """``calls`` (possibly empty with ``tool_choice="auto"``/``"none"``), ``content`` (the text answer
    when the model did not call), the raw ``text`` and ``stats``."""

    calls: list[ToolCall]
    content: str | None
    text: str
    stats: GenerationStats = field(default_factory=GenerationStats)

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.calls else self.stats.finish_reason


class ToolCallConstraint(Constraint):
    """The compiled grammar over the declared tools plus per-call argument validation."""

    def __init__(self, grammar: str, info: Any, tools: Sequence[Tool], choice: str, marker_ids: Mapping[str, int]):
        super().__init__("grammar", grammar, info, may_allow_specials=False,
                         description=f"tool calls over {len(tools)} tools ({choice})")
        self._marker_ids = {MARKER_TOKENS[role]: tid for role, tid in marker_ids.items()}
        # budget-aware closing: the string delimiter and the call's end marker close what is open
        self.closing_token_ids = (marker_ids["str"], marker_ids["call_close"])
        self.tools = {t.name: t for t in tools}
        self.tool_choice = choice
        self._validators = {t.name: make_validator(dict(t.parameters)) for t in tools}

    def check_calls(self, text: str) -> tuple[list[ToolCall], str | None, list[ValidationIssue]]:
        if not text.startswith(MARKER_TOKENS["call_open"]):
            if self.tool_choice in ("auto", "none"):
                return [], text, []
            return [], None, [ValidationIssue((), "a tool call is required")]
        try:
            parsed = parse_tool_calls(text)
        except ValueError as err:
            return [], None, [ValidationIssue((), f"malformed tool call: {err}")]
        calls: list[ToolCall] = []
        issues: list[ValidationIssue] = []
        for k, (name, args) in enumerate(parsed):
            tool = self.tools.get(name)
            if tool is None:
                issues.append(ValidationIssue((k,), f"call to undeclared tool {name!r}"))
                continue
            errs = iter_issues(self._validators[name], args)
            if errs:
                issues += [ValidationIssue((k, "arguments", *p), m) for p, m in errs]
                continue
            value: Any = args
            if tool.model is not None:
                try:
                    value = tool.model.model_validate(args)
                except Exception as err:  # pydantic.ValidationError
                    issues.append(ValidationIssue((k, "arguments"), str(err).splitlines()[0]))
                    continue
            calls.append(ToolCall(name=name, arguments=args, value=value))
        return calls, None, issues

    def validate_text(self, text: str) -> ValidationOutcome:
        calls, content, issues = self.check_calls(text)
        if issues:
            return ValidationOutcome(False, None, issues)
        return ValidationOutcome(True, ToolCallResult(calls=calls, content=content, text=text), [])

    def tokenize(self, text: str) -> list[int]:
        """Token ids of decoded text: the marker spellings become their control-token ids, the rest
        is tokenized as ordinary text (a spelled ``<|tool_call>`` inside a string never occurs: string
        values cannot hold ``<|``)."""
        pattern = "(" + "|".join(re.escape(m) for m in self._marker_ids) + ")"
        ids: list[int] = []
        for piece in re.split(pattern, text):
            if piece in self._marker_ids:
                ids.append(self._marker_ids[piece])
            elif piece:
                ids.extend(super().tokenize(piece))
        return ids

    def matches(self, text: str) -> bool:
        return self.grammar_accepts(text) and self.validate_text(text).ok


def compile_tool_calls(tools: Sequence[Any], tokenizer: Any, *, tool_choice: Any = "auto",
                       parallel_tool_calls: bool = True, stop_token_ids: Sequence[int] | None = None,
                       vocab_size: int | None = None) -> ToolCallConstraint:
    """Compile the tool-call constraint for ``tokenizer`` (an HF tokenizer with Gemma 4's tool tokens)."""
    import llguidance as llg

    from dgemma_struct.constraints.tokenizer import get_tokenizer_info

    decl = normalise_tools(tools)
    if not isinstance(parallel_tool_calls, bool):
        raise InvalidRequestError(f"parallel_tool_calls must be a bool, got {parallel_tool_calls!r}")
    choice, _ = _check_choice(tool_choice, decl)
    ids = _marker_ids(tokenizer)
    lark = tool_call_grammar(decl, marker_ids=ids, tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls)
    info = get_tokenizer_info(tokenizer, stop_token_ids=stop_token_ids, vocab_size=vocab_size)
    try:
        g = llg.LLMatcher.grammar_from_lark(lark)
        err = llg.LLMatcher.validate_grammar(g, info.lltok)
    except Exception as e:  # noqa: BLE001 - llguidance raises ValueError/RuntimeError
        raise ToolCallError(f"cannot compile the tool declarations: {str(e)[:500]}") from e
    if err:
        raise ToolCallError(f"cannot compile the tool declarations: {err.strip()[:500]}")
    try:
        return ToolCallConstraint(g, info, decl, choice, ids)
    except SchemaError as e:  # raised by Constraint for the wrong kind table
        raise ToolCallError(str(e)) from e


def generate_tool_calls(prompt_or_messages: Any, tools: Sequence[Any], *, tool_choice: Any = "auto",
                        parallel_tool_calls: bool = True, runtime: Any = None, **opts: Any) -> ToolCallResult:
    """Let the model call the declared tools; every returned call names a declared tool and its
    arguments validate against that tool's schema (or a typed error is raised).

    ``prompt_or_messages``: a user string or chat messages (``role: "tool"`` results included); the
    declarations are rendered into the system turn by the checkpoint's chat template. Other options
    are those of :func:`dgemma_struct.generate` (``max_new_tokens``, ``mode``, ``seed``, ...)."""
    from dgemma_struct.api import generate
    from dgemma_struct.runtime import ChatPrompt, DiffusionRuntime

    rt = runtime if runtime is not None else DiffusionRuntime.default()
    c = compile_tool_calls(tools, rt.tokenizer, tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls,
                           stop_token_ids=rt.eos_token_ids, vocab_size=rt.model.config.text_config.vocab_size)
    messages = ([{"role": "user", "content": prompt_or_messages}] if isinstance(prompt_or_messages, str)
                else list(prompt_or_messages))
    prompt = ChatPrompt(messages=messages, tools=[t.to_openai() for t in c.tools.values()])
    opts.pop("return_details", None)
    res = generate(prompt, c, runtime=rt, return_details=True, **opts)
    out: ToolCallResult = res.value
    out.stats = res.stats
    if out.calls:
        out.stats.finish_reason = "tool_calls"
    return out
