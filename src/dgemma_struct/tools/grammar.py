"""Tool declarations -> one llguidance Lark grammar: calls to the declared tools in Gemma 4's
format whose arguments follow each tool's JSON Schema (a superset where the grammar cannot express
a keyword; validation decides), or free text, as ``tool_choice`` says."""
from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from dgemma_struct.constraints.regex_ascii import ascii_classes
from dgemma_struct.constraints.schema_checks import follow_pointer
from dgemma_struct.tools.declarations import Tool, ToolCallError, check_choice
from dgemma_struct.tools.numeric import bounded_number_regex
from dgemma_struct.tools.syntax import KEY, GEMMA4_MARKERS, encode_arguments

_MAX_DEPTH = 24
_MAX_REPEAT = 64  # array bounds up to this are in the grammar; beyond, validation alone enforces them
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
    """Lark rules for the declared tools' argument schemas in Gemma 4's value syntax (``str_tok``:
    the string delimiter token; ``roots``: each tool's schema, for its local ``$ref``s)."""

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
            body = ascii_classes(pat)  # ECMA-262 (JSON Schema) \d \w \s are ASCII, Rust's are Unicode
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
        if inner.startswith("/") and inner != _STR_BODY and not inner.startswith("/[^<]{") \
                and (isinstance(lo, int) or isinstance(hi, int)):
            # a pattern / format AND a length: both, as the intersection of two lexemes (llguidance ``&``)
            a = lo if isinstance(lo, int) and lo >= 0 else 0
            b = "" if not isinstance(hi, int) else str(max(hi, a))
            name = self.new("LEN")
            self.rules[name] = f"{inner} & /[^<]{{{a},{b}}}/"
            inner = name
        return f"{self.str_tok} {inner} {self.str_tok}"

    @staticmethod
    def number_rule(s: Mapping[str, Any], integer: bool) -> str:
        """An integer / number terminal: within the schema's ``minimum`` / ``maximum`` /
        ``exclusive*`` bounds (exact for integers, exponent-free decimals for numbers; see
        :mod:`dgemma_struct.tools.numeric`), the plain JSON terminal when there are none."""
        rx = bounded_number_regex(s, integer)
        if rx is None:  # no bounds, or an empty range (left to validation)
            return _INT if integer else _NUM
        return _regex_lit(rx)

    def generic(self) -> str:
        if self._generic is None:
            self._generic = "gval"
            self.rules["gval"] = (f"gstr | {_NUM} | \"true\" | \"false\" | \"null\" | \"[\" (gval (\",\" gval)*)? \"]\""
                                  f" | \"{{\" (gpair (\",\" gpair)*)? \"}}\"")
            self.rules["gstr"] = f"{self.str_tok} {_STR_BODY} {self.str_tok}"
            self.rules["gpair"] = f"/{KEY.pattern}/ \":\" gval"
        return self._generic

    def ref(self, root: str, ref: str, depth: int) -> str:
        key = (root, ref)
        if key in self.refs:
            return self.refs[key]
        if not ref.startswith("#"):
            raise ToolCallError(f"only local $ref are supported in tool arguments, not {ref!r}")
        try:
            target = follow_pointer(self.roots[root], [p for p in ref[1:].split("/") if p])
        except LookupError:
            raise ToolCallError(f"dangling $ref {ref!r} in the arguments of tool {root!r}") from None
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
        if t in ("integer", "number"):
            return self.number_rule(s, t == "integer")
        if t == "boolean":
            return '("true" | "false")'
        if t == "null":
            return '"null"'
        if t == "array":
            items = s.get("items", True)
            item = self.new("item")
            self.rules[item] = self.expr(items if not isinstance(items, list) else True, root, depth + 1)
            return self.array_rule(item, s.get("minItems"), s.get("maxItems"))
        if t == "object":
            return self.object_rule(s, root, depth)
        raise ToolCallError(f"tool {root!r}: unknown type {t!r}")

    @staticmethod
    def array_rule(item: str, lo: Any, hi: Any) -> str:
        """``[item, ...]`` with ``minItems`` / ``maxItems`` as the JSON path enforces them (bounds
        beyond :data:`_MAX_REPEAT` are left to validation: the grammar stays a superset)."""
        lo = lo if isinstance(lo, int) and not isinstance(lo, bool) and lo > 0 else 0
        hi = hi if isinstance(hi, int) and not isinstance(hi, bool) and hi >= 0 else None
        if hi is not None and hi < lo:
            hi = lo  # unsatisfiable: validation refuses every value
        if lo > _MAX_REPEAT:
            lo = 1
        if hi is not None and hi > _MAX_REPEAT:
            hi = None
        if hi == 0:
            return '"[" "]"'
        more = f'("," {item})' + (f"{{{max(lo - 1, 0)},{hi - 1}}}" if hi is not None
                                  else f"{{{lo - 1},}}" if lo > 1 else "*")
        return f'"[" {item} {more} "]"' if lo >= 1 else f'"[" ({item} {more})? "]"'

    def object_rule(self, s: Mapping[str, Any], root: str, depth: int) -> str:
        props = s.get("properties") or {}
        if not isinstance(props, Mapping):
            raise ToolCallError(f"tool {root!r}: 'properties' must be an object")
        if not props:
            return self.generic() if s.get("additionalProperties", True) is not False else '"{" "}"'
        required = set(s.get("required") or [])
        items: list[tuple[str, bool]] = []
        for key, sub in props.items():
            if not KEY.fullmatch(key):
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


def custom_grammar_name(index: int) -> str:
    """The name under which the input grammar of ``tools[index]`` (a custom tool) joins the tool-call
    grammar (an llguidance sub-grammar, referenced as ``@name``).

    >>> custom_grammar_name(2)
    'custom_input_2'
    """
    return f"custom_input_{index}"


def tool_call_grammar(tools: Sequence[Tool], *, marker_ids: Mapping[str, int] = GEMMA4_MARKERS,
                      tool_choice: Any = "auto", parallel_tool_calls: bool = True, max_calls: int | None = None) -> str:
    """The llguidance Lark grammar of the model's answer: calls to the declared tools in Gemma 4's
    format (``"required"`` / a named tool), or calls or free text (``"auto"``), or text only (``"none"``).
    A custom tool's call is ``call:NAME{input:<|"|>...<|"|>}``, the text following its grammar (the
    sub-grammar :func:`custom_grammar_name` names, which the caller supplies). ``max_calls``: at most
    that many calls (with ``parallel_tool_calls``)."""
    choice, named = check_choice(tool_choice, tools)
    s = f"<[{marker_ids['str']}]>"
    b = _GrammarBuilder({t.name: t.parameters for t in tools}, s)
    bodies = []
    for i, t in enumerate(tools):
        if named is not None and t.name != named:
            continue
        if t.is_custom:
            inner = f"@{custom_grammar_name(i)}" if t.grammar is not None else _STR_BODY
            args = f'"{{" "input:" {s} {inner} {s} "}}"'
        else:
            args = b.object_rule(t.parameters, t.name, 0) if t.parameters.get("properties") else '"{" "}"'
        bodies.append(f"{_lark_str('call:' + t.name)} {args}")
    call = f"<[{marker_ids['call_open']}]> ({' | '.join(bodies)}) <[{marker_ids['call_close']}]>"
    calls = "call" if not parallel_tool_calls or max_calls == 1 else "call+" if max_calls is None \
        else f"call{{1,{max_calls}}}"
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
