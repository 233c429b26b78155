"""Tool declarations: :class:`Tool` from a pydantic model, a function or an OpenAI tool dict,
checked by :func:`normalise_tools`, and the ``tool_choice`` values."""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from dgemma_struct.errors import ConstraintError
from dgemma_struct.tools.syntax import TOOL_NAME

TOOL_CHOICES = ("auto", "required", "none")
_MAX_TOOLS = 128


class ToolCallError(ConstraintError):
    """Bad tool declarations or ``tool_choice`` (duplicate or non-identifier names, invalid argument
    schemas, an unknown tool named in ``tool_choice``, a tokenizer without tool-call tokens)."""


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
    #: a custom tool's input format (``{"type": "text"}`` or ``{"type": "grammar", "syntax": "lark" |
    #: "regex", "definition": ...}``); ``None`` for a function tool. Its one argument is the string ``input``.
    format: Mapping[str, Any] | None = None

    @property
    def is_custom(self) -> bool:
        """True for a custom tool (free-form ``input`` text, following its grammar when it has one)."""
        return self.format is not None

    @property
    def grammar(self) -> tuple[str, str] | None:
        """``(syntax, definition)`` of a custom tool's input grammar, or ``None`` (free text / a function)."""
        f = self.format
        return (f["syntax"], f["definition"]) if f is not None and f.get("type") == "grammar" else None

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry (what the chat template renders into the system turn); a custom
        tool is rendered as a function of one string argument ``input`` whose description names its format."""
        fn: dict[str, Any] = {"name": self.name, "parameters": dict(self.parameters)}
        if self.description:
            fn["description"] = self.description
        return {"type": "function", "function": fn}


def _custom_tool(spec: Mapping[str, Any]) -> Tool:
    """A custom tool from ``{"name", "description", "format"}`` (OpenAI's chat ``custom`` object or
    a Responses ``{"type": "custom", ...}`` entry): its ``input`` is a string following ``format``."""
    name, desc, fmt = spec.get("name"), spec.get("description") or "", spec.get("format") or {"type": "text"}
    if not isinstance(desc, str):
        raise ToolCallError(f"tool {name!r}: 'description' must be a string")
    if not isinstance(fmt, Mapping) or fmt.get("type") not in ("text", "grammar"):
        raise ToolCallError(f"custom tool {name!r}: format must be {{'type': 'text'}} or {{'type': 'grammar', ...}}")
    note = "free-form text"
    if fmt["type"] == "grammar":
        syntax, definition = fmt.get("syntax"), fmt.get("definition")
        if syntax not in ("lark", "regex") or not isinstance(definition, str) or not definition:
            raise ToolCallError(f"custom tool {name!r}: a grammar format needs syntax 'lark' or 'regex' and a "
                                "non-empty definition")
        fmt, note = {"type": "grammar", "syntax": syntax, "definition": definition}, f"text in this {syntax} grammar: " + definition
    else:
        fmt = {"type": "text"}
    params = {"type": "object", "properties": {"input": {"type": "string", "description": note}},
              "required": ["input"], "additionalProperties": False}
    return Tool(name=name, description=desc, parameters=params, format=fmt)


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
    OpenAI tool dict (``{"type": "function", "function": {...}}``; a custom tool ``{"type": "custom",
    "custom": {"name", "format"}}`` or the Responses API's flat ``{"type": "custom", "name", "format"}``), a legacy function dict
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
        if obj.get("type") == "custom":
            return _custom_tool(obj["custom"] if isinstance(obj.get("custom"), Mapping) else obj)
        if obj.get("type") == "function" or "function" in obj:
            spec = obj.get("function")
            if not isinstance(spec, Mapping):
                raise ToolCallError("a tool dict of type 'function' needs a 'function' object")
        elif obj.get("type") not in (None, "function"):
            raise ToolCallError(f"unsupported tool type {obj.get('type')!r} (only 'function' and 'custom' tools)")
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
    from dgemma_struct.constraints.schema_checks import check_schema
    from dgemma_struct.errors import SchemaError

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
        if not isinstance(tool.name, str) or not TOOL_NAME.fullmatch(tool.name):
            raise ToolCallError(f"tool name {tool.name!r} is not an identifier ([A-Za-z_][A-Za-z0-9_.-]*, ≤ 64 chars)")
        if tool.name in seen:
            raise ToolCallError(f"duplicate tool name {tool.name!r}")
        seen.add(tool.name)
        params = tool.parameters
        if params.get("type", "object") != "object":
            raise ToolCallError(f"tool {tool.name!r}: the arguments schema must be of type 'object'")
        try:
            check_schema(params)   # the JSON surface's checks: one dialect (\p{..} patterns included)
        except SchemaError as err:
            raise ToolCallError(f"tool {tool.name!r}: invalid arguments schema: {err}") from err
        except RecursionError as err:
            raise ToolCallError(f"tool {tool.name!r}: arguments schema nested too deeply") from err
        out.append(tool)
    return out


def check_choice(tool_choice: Any, tools: Sequence[Tool]) -> tuple[str, str | None]:
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
