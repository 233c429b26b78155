"""Grounded extraction: JSON values whose grounded strings are verbatim spans of a source text and
whose grounded numbers are numbers written in it, with the character offsets of every grounded
value, enforced *during* decoding (diffusion canvas or AR), not checked after the fact.

Mark fields as grounded

- per field in pydantic: ``name: Annotated[str, Grounded()]`` or
  ``Field(json_schema_extra={"x-grounded": True})``;
- in a plain JSON Schema: ``{"type": "string", "x-grounded": true}`` (or
  ``{"x-grounded": {"mode": "chars"}}``; ``false`` opts a field out of request-level grounding);
- for the whole request: ``ground="strings"`` (every free string field), ``"numbers"`` or
  ``"all"`` (strings and numbers).

Example::

    >>> from typing import Annotated
    >>> from pydantic import BaseModel
    >>> from dgemma_struct.grounding import Grounded, generate_grounded
    >>> class Person(BaseModel):
    ...     name: Annotated[str, Grounded()]
    ...     age: Annotated[int, Grounded()]
    >>> res = generate_grounded("Extract the name and age as JSON.\\nTara Zhang is 42.", Person)
    >>> res.spans[0].text in res.sources[res.spans[0].doc]
    True

How: the schema is compiled to an llguidance Lark grammar. Objects that hold grounded fields get
hand-written rules (properties in schema order, optional ones skippable); every other sub-schema
is embedded as ``%json {...}``. A grounded string is one lexeme: ``"`` + a substring of the source
+ ``"``, written with llguidance's ``%regex {"substring_chunks": [...]}`` over the source cut into
chunks (words: runs of letters/digits, runs of whitespace, single other characters; chars: code
points) that are JSON-escaped *one chunk at a time*, so a span can never end inside an escape
(``\\"``, ``\\\\``, ``\\n``, ``\\u0007``), intersected with "non-empty, no whitespace or control
character at either end". A grounded field with further constraints (pattern, format, enum,
const, lengths) gets the finite list of the source's spans that pass the field's own sub-schema
instead (empty list: :class:`~dgemma_struct.errors.GroundingError` before any generation).
Grounded numbers are the list of number literals of the source that pass the sub-schema.
Validation is against the ORIGINAL schema (jsonschema, and the pydantic model when given), plus a
check that every grounded value occurs in the source, so repairs and the AR fallback keep both.
"""
from __future__ import annotations

import hashlib
import html
import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import llguidance as llg

from dgemma_struct.constraints.canvas_mask import CanvasWalker
from dgemma_struct.constraints.compile import Constraint, ValidationIssue, ValidationOutcome
from dgemma_struct.constraints.json_schema import json_options, make_validator, prepare_json_schema
from dgemma_struct.constraints.safety import clip, engine_guard
from dgemma_struct.constraints.tokenizer import get_tokenizer_info
from dgemma_struct.errors import (DgemmaStructError, GroundingError, InvalidRequestError, PromptTooLongError,
                                  SchemaError)

__all__ = ["Grounded", "GroundedSpan", "GroundedResult", "GroundedConstraint", "compile_grounded",
           "generate_grounded", "generate_grounded_batch", "grounded_sources", "has_grounding", "GROUND_KEY",
           "render_html", "demo", "grounding_options", "prompt_with_sources"]

GROUND_KEY = "x-grounded"
GRANULARITIES = ("words", "chars")
GROUND_LEVELS = (None, "strings", "numbers", "all")
# A grounded field with extra constraints gets the explicit list of the source's spans that pass them,
# up to this many distinct candidates (beyond it: the substring lexeme, and validation + repair).
MAX_CANDIDATES = 4000
MAX_SPAN_CHUNKS = 64          # longest candidate span, in chunks (words mode) or characters (chars mode)
MAX_CANDIDATE_CHECKS = 200_000
# The plain path's limits, but without precomputing large lexemes and with more lexer fuel per step:
# the span lexeme of a 2,000-word source exhausts the initial lexer fuel when precomputed (0.2 s,
# then an error) and compiles in 0.03 s when it is not; its first mask after ``{"name":"`` then
# needs more than the default 200k step fuel ("too many expressions constructed"), ~10 ms with 10M.
_LIMITS_KW = dict(max_grammar_size=500_000, initial_lexer_fuel=2_000_000, max_lexer_states=250_000,
                  precompute_large_lexemes=False, step_lexer_fuel=10_000_000)


def _limits() -> Any:
    return llg.LLParserLimits(**_LIMITS_KW)


_STRING_KWS = ("pattern", "format", "enum", "const", "minLength", "maxLength")
# Spans offered for a field with a ``format`` must also match these shapes (stricter than jsonschema's
# own checks, e.g. its email check is only "contains @"): a narrower grammar is still sound, and it
# keeps "write to tzhang@post.io." from yielding the span "to tzhang@post.io.".
_FORMAT_SHAPES = {
    "email": re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"),
    "idn-email": re.compile(r"[^\s@]+@[^\s@]+\.[^\s@.]{2,}"),
    "hostname": re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?"),
    "ipv4": re.compile(r"\d{1,3}(?:\.\d{1,3}){3}"),
    "date": re.compile(r"\d{4}-\d{2}-\d{2}"),
    "uri": re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[^\s]*[^\s.,;:!?)]"),
    "uuid": re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"),
}


# ----------------------------------------------------------------------------------------------
# the marker
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Grounded:
    """Pydantic field marker: ``Annotated[str, Grounded()]``, ``Annotated[int, Grounded()]``.
    ``mode``: ``"words"`` (default: spans start and end on word boundaries) or ``"chars"``."""

    mode: str = "words"

    def __post_init__(self) -> None:
        if self.mode not in GRANULARITIES:
            raise GroundingError(f"Grounded(mode=...) must be one of {GRANULARITIES}, not {self.mode!r}")

    def marker(self) -> dict:
        return {"mode": self.mode}

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> dict:
        js = handler(core_schema)
        js = handler.resolve_ref_schema(js)
        js[GROUND_KEY] = self.marker()
        return js


def _marker_mode(marker: Any, default: str, path: tuple) -> str | None:
    """``x-grounded`` value -> granularity, or None when the field is explicitly not grounded."""
    if marker is False or marker is None:
        return None
    if marker is True:
        return default
    if isinstance(marker, dict):
        mode = marker.get("mode", default)
        if mode not in GRANULARITIES:
            raise GroundingError(f"{_fmt(path)}: x-grounded mode must be one of {GRANULARITIES}, not {mode!r}",
                                 path=path)
        return mode
    if isinstance(marker, str) and marker in GRANULARITIES:
        return marker
    raise GroundingError(f"{_fmt(path)}: x-grounded must be true, false or {{\"mode\": \"words\"|\"chars\"}}, "
                         f"not {marker!r}", path=path)


def has_grounding(schema: Any) -> bool:
    """True when a JSON Schema (dict) or pydantic model marks any field with ``x-grounded``."""
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        schema = schema.model_json_schema()

    def walk(x: Any) -> bool:
        if isinstance(x, dict):
            if x.get(GROUND_KEY) not in (None, False):
                return True
            return any(walk(v) for v in x.values())
        if isinstance(x, list):
            return any(walk(v) for v in x)
        return False
    return walk(schema)


def _fmt(path: Sequence) -> str:
    return "/" + "/".join(str(p) for p in path) if path else "<root>"


# ----------------------------------------------------------------------------------------------
# sources: chunks, spans, numbers
# ----------------------------------------------------------------------------------------------
def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def chunk_offsets(text: str, granularity: str = "words") -> list[tuple[int, int]]:
    """``(start, end)`` character offsets of the chunks a span is made of: code points
    (``"chars"``), or runs of letters/digits/underscore, runs of whitespace and single other
    characters (``"words"``)."""
    if granularity == "chars":
        return [(i, i + 1) for i in range(len(text))]
    out: list[tuple[int, int]] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        j = i + 1
        if _is_word(ch):
            while j < n and _is_word(text[j]):
                j += 1
        elif ch.isspace():
            while j < n and text[j].isspace():
                j += 1
        out.append((i, j))
        i = j
    return out


def _bad_edge(ch: str) -> bool:
    return ch.isspace() or ord(ch) < 0x20 or ch in "\u2028\u2029"


_LEFT_PUNCT, _RIGHT_PUNCT = ",;:.!?)]}", ",;:([{"


def edge_ok(span: str) -> bool:
    """May a free grounded string be ``span``? Non-empty, no whitespace or control character at
    either end, not starting with closing punctuation or ending with a separator (``"Klein,"``),
    at least one letter or digit (not a bare ``-``)."""
    return bool(span) and not _bad_edge(span[0]) and not _bad_edge(span[-1]) and \
        span[0] not in _LEFT_PUNCT and span[-1] not in _RIGHT_PUNCT and any(c.isalnum() for c in span)


def _esc(s: str) -> str:
    """JSON string body of ``s`` (what goes between the quotes)."""
    return json.dumps(s, ensure_ascii=False)[1:-1]


def _lark_lit(s: str) -> str:
    """A Lark string literal matching exactly ``s`` (``s`` holds no raw control characters)."""
    return json.dumps(s, ensure_ascii=False)


# a number is not part of a word, a decimal, or a hyphenated code (ORD-12345, 555-867-5309, 2024-05-01)
_NUM = re.compile(r"(?<![\w.])(?<!\w-)-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][+-]?\d+)?(?![\w])(?!-\w)")
_JSON_NUM = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")


@dataclass(frozen=True)
class _NumberLit:
    literal: str      # as a JSON number
    value: Any        # int or float
    is_int: bool


def source_numbers(text: str) -> list[tuple[_NumberLit, int, int]]:
    """Number literals written in ``text`` with their character offsets (``1,250`` is 1250; the
    digits of hyphenated codes, phone numbers and ISO dates are not numbers)."""
    out = []
    for m in _NUM.finditer(text):
        raw = m.group(0).replace(",", "")
        is_int = re.fullmatch(r"-?\d+", raw) is not None
        if is_int:
            value: Any = int(raw)
            lit = str(value)
        else:
            value = float(raw)
            if value != value or value in (float("inf"), float("-inf")):
                continue
            lit = raw if _JSON_NUM.fullmatch(raw) else repr(value)
        out.append((_NumberLit(lit, value, is_int), m.start(), m.end()))
    return out


def _prompt_text(prompt: Any) -> list[str]:
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, (list, tuple)):
        docs = []
        for msg in prompt:
            if isinstance(msg, dict) and msg.get("role", "user") == "user":
                c = msg.get("content")
                if isinstance(c, str):
                    docs.append(c)
                elif isinstance(c, list):  # OpenAI content parts
                    docs.extend(p.get("text", "") for p in c if isinstance(p, dict) and p.get("type") == "text")
        return docs
    raise InvalidRequestError(f"a prompt must be text or a list of chat messages, not {type(prompt).__name__}")


def grounded_sources(prompt: Any = None, source: str | Sequence[str] | None = None) -> tuple[str, ...]:
    """The documents grounded values come from: ``source`` (one text or a list of texts), else the
    prompt's text (the user messages of a chat prompt). Raises :class:`GroundingError` when there
    is no non-blank text to ground on."""
    if source is None:
        docs = _prompt_text(prompt) if prompt is not None else []
    elif isinstance(source, str):
        docs = [source]
    elif isinstance(source, (list, tuple)):
        docs = list(source)
        for d in docs:
            if not isinstance(d, str):
                raise GroundingError(f"source documents must be strings, not {type(d).__name__}")
    else:
        raise GroundingError(f"source must be a string or a list of strings, not {type(source).__name__}")
    if not docs or not any(d.strip() for d in docs):
        raise GroundingError("the grounding source is empty: nothing to extract values from")
    return tuple(docs)


class _Doc:
    """One source document with its chunk boundaries (for aligning found values)."""

    def __init__(self, text: str):
        self.text = text
        self._bounds: dict[str, tuple[set, set]] = {}
        self.numbers = source_numbers(text)

    def bounds(self, granularity: str) -> tuple[set, set]:
        b = self._bounds.get(granularity)
        if b is None:
            ch = chunk_offsets(self.text, granularity)
            b = self._bounds[granularity] = ({s for s, _ in ch}, {e for _, e in ch})
        return b

    def find_string(self, value: str, granularity: str) -> list[tuple[int, int]]:
        if not value:
            return []
        starts, ends = self.bounds(granularity)
        out, i = [], self.text.find(value)
        while i >= 0:
            if i in starts and i + len(value) in ends:
                out.append((i, i + len(value)))
            i = self.text.find(value, i + 1)
        return out

    def find_number(self, value: Any) -> list[tuple[int, int]]:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return []
        return [(s, e) for lit, s, e in self.numbers if lit.value == value]


# ----------------------------------------------------------------------------------------------
# schema -> Lark grammar
# ----------------------------------------------------------------------------------------------
@dataclass
class _Leaf:
    kind: str           # "string" | "number"
    granularity: str


def _strip_markers(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _strip_markers(v) for k, v in x.items() if k != GROUND_KEY}
    if isinstance(x, list):
        return [_strip_markers(v) for v in x]
    return x


def _types(node: dict) -> list[str]:
    t = node.get("type")
    if isinstance(t, str):
        return [t]
    if isinstance(t, list):
        return [x for x in t if isinstance(x, str)]
    if "enum" in node or "const" in node:
        vals = node.get("enum", [node.get("const")] if "const" in node else [])
        kinds = []
        for v in vals:
            k = ("string" if isinstance(v, str) else "boolean" if isinstance(v, bool) else
                 "integer" if isinstance(v, int) else "number" if isinstance(v, float) else
                 "null" if v is None else "array" if isinstance(v, list) else "object")
            if k not in kinds:
                kinds.append(k)
        return kinds
    if "properties" in node:
        return ["object"]
    if "items" in node or "prefixItems" in node:
        return ["array"]
    return []


class _GrammarBuilder:
    """Writes the Lark grammar of a schema with grounded fields (see the module docstring)."""

    def __init__(self, root: Any, docs: tuple[str, ...], *, ground: str | None, granularity: str, lltok: Any):
        self.root = root
        self.docs = docs
        self.ground = ground
        self.granularity = granularity
        self.lltok = lltok
        self.rules: list[str] = []
        self.n = 0
        self.ref_rules: dict[str, str] = {}
        self.span_terms: dict[str, str] = {}
        self.grounded_count = 0
        self._defs = {k: root[k] for k in ("$defs", "definitions") if isinstance(root, dict) and k in root}
        self._json_opts = dict(json_options("compact", None), lenient=True, coerce_one_of=True)
        self._enum_memo: dict[tuple, bool] = {}

    # -- helpers ------------------------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def resolve(self, node: Any, path: tuple) -> tuple[Any, str | None]:
        """Follows local ``$ref`` chains; returns (target, last ref) for siblings-free refs."""
        ref = None
        seen = set()
        while isinstance(node, dict) and isinstance(node.get("$ref"), str):
            ref = node["$ref"]
            if ref in seen:
                raise SchemaError(f"{_fmt(path)}: $ref cycle through {ref}")
            seen.add(ref)
            if not ref.startswith("#"):
                raise GroundingError(f"{_fmt(path)}: only local $refs are supported with grounding, not {ref!r}",
                                     path=path)
            target: Any = self.root
            for part in [p for p in ref[1:].split("/") if p]:
                part = part.replace("~1", "/").replace("~0", "~")
                if isinstance(target, dict) and part in target:
                    target = target[part]
                elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                    target = target[int(part)]
                else:
                    raise SchemaError(f"{_fmt(path)}: dangling $ref {ref!r}", keywords=["$ref"])
            siblings = {k: v for k, v in node.items() if k not in ("$ref", "description", "title", "default")}
            if siblings and isinstance(target, dict):
                node = {**target, **siblings}
                ref = None
            else:
                node = target
        return node, ref

    def leaf(self, node: Any, path: tuple) -> _Leaf | None:
        """Is ``node`` (already resolved) a grounded leaf? Raises on grounding a non-leaf type."""
        if not isinstance(node, dict):
            return None
        marker = node.get(GROUND_KEY)
        types = _types(node)
        if marker is not None:
            mode = _marker_mode(marker, self.granularity, path)
            if mode is None:
                return None
            scalar = [t for t in types if t != "null"]
            if not scalar or any(t not in ("string", "number", "integer") for t in scalar):
                raise GroundingError(
                    f"{_fmt(path)}: only string and number fields can be grounded, not "
                    f"{'/'.join(types) or 'an untyped field'} (mark the items of an array instead)", path=path)
            if len(scalar) > 1 and "string" in scalar:
                raise GroundingError(f"{_fmt(path)}: a grounded field must be a string or a number, not both",
                                     path=path)
            return _Leaf("string" if scalar[0] == "string" else "number", mode)
        if self.ground is None or "const" in node:
            return None
        if "enum" in node:
            # request-level grounding narrows a string enum to the members written in the source,
            # when there is one (an enum of labels the text never spells out is left as is)
            vals = node["enum"]
            if self.ground in ("strings", "all") and isinstance(vals, list) and vals and \
                    all(isinstance(v, str) for v in vals) and self.enum_in_source(tuple(vals)):
                return _Leaf("string", self.granularity)
            return None
        scalar = [t for t in types if t != "null"]
        if len(scalar) != 1:
            return None
        if scalar[0] == "string" and self.ground in ("strings", "all"):
            return _Leaf("string", self.granularity)
        if scalar[0] in ("number", "integer") and self.ground in ("numbers", "all"):
            return _Leaf("number", self.granularity)
        return None

    def enum_in_source(self, vals: tuple) -> bool:
        hit = self._enum_memo.get(vals)
        if hit is None:
            docs = [_Doc(d) for d in self.docs]
            hit = self._enum_memo[vals] = any(d.find_string(v, self.granularity) for v in vals for d in docs)
        return hit

    def contains(self, node: Any, path: tuple, _stack: frozenset = frozenset()) -> bool:
        """Does ``node`` hold a grounded leaf anywhere below it?"""
        if isinstance(node, dict) and isinstance(node.get("$ref"), str):
            ref = node["$ref"]
            if ref in _stack:
                return False
            _stack = _stack | {ref}
        node, _ = self.resolve(node, path)
        if not isinstance(node, dict):
            return False
        if self.leaf(node, path) is not None:
            return True
        for kw in ("properties", "patternProperties", "$defs", "definitions"):
            sub = node.get(kw)
            if isinstance(sub, dict) and kw in ("properties", "patternProperties"):
                if any(self.contains(v, path + (k,), _stack) for k, v in sub.items()):
                    return True
        for kw in ("items", "additionalProperties", "additionalItems", "contains", "not", "if", "then", "else"):
            sub = node.get(kw)
            if isinstance(sub, dict) and self.contains(sub, path + (kw,), _stack):
                return True
            if isinstance(sub, list) and any(self.contains(v, path + (kw, i), _stack) for i, v in enumerate(sub)):
                return True
        for kw in ("anyOf", "oneOf", "allOf", "prefixItems"):
            sub = node.get(kw)
            if isinstance(sub, list) and any(self.contains(v, path + (kw, i), _stack) for i, v in enumerate(sub)):
                return True
        return False

    # -- expressions ----------------------------------------------------------------------------
    def json_piece(self, node: Any, path: tuple) -> str:
        """``%json {...}`` for an ungrounded sub-schema (relaxed like the plain JSON path)."""
        sub = _strip_markers(node)
        if isinstance(sub, bool):
            sub = {} if sub else {"not": {}}
        sub = dict(sub)
        for k, v in self._defs.items():
            sub.setdefault(k, _strip_markers(v))
        try:
            plan = prepare_json_schema(sub, self.lltok, limits=_limits())
        except SchemaError as e:
            raise type(e)(f"{_fmt(path)}: {e}") from None
        g = dict(plan.grammar_schema) if isinstance(plan.grammar_schema, dict) else {}
        g["x-guidance"] = self._json_opts
        return "%json " + json.dumps(g, ensure_ascii=False)

    def expr(self, node: Any, path: tuple) -> str:
        if isinstance(node, dict) and isinstance(node.get("$ref"), str) and set(node) <= {"$ref", "description",
                                                                                            "title", "default"}:
            ref = node["$ref"]
            if not self.contains(node, path):
                return self.json_piece(node, path)
            name = self.ref_rules.get(ref)
            if name is None:
                name = self.ref_rules[ref] = self.fresh("ref")
                target, _ = self.resolve(node, path)
                body = self.expr(target, path)
                self.rules.append(f"{name}: {body}")
            return name
        node, _ = self.resolve(node, path)
        if not self.contains(node, path):
            return self.json_piece(node, path)
        leaf = self.leaf(node, path)
        if leaf is not None:
            return self.leaf_expr(node, leaf, path)
        for kw in ("anyOf", "oneOf"):
            if isinstance(node.get(kw), list):
                rest = {k: v for k, v in node.items() if k != kw}
                alts = [self.expr({**rest, **b} if isinstance(b, dict) and rest and "$ref" not in b else b,
                                  path) for b in node[kw]]
                return "(" + " | ".join(alts) + ")"
        if isinstance(node.get("allOf"), list):
            parts = node["allOf"]
            rest = {k: v for k, v in node.items() if k != "allOf"}
            if len(parts) == 1:
                merged = parts[0] if not rest else {**(self.resolve(parts[0], path)[0] or {}), **rest}
                return self.expr(merged, path)
            raise GroundingError(f"{_fmt(path)}: grounded fields inside an allOf of several schemas are not "
                                 "supported; merge them into one schema", path=path)
        types = [t for t in _types(node)]
        if len(types) > 1:
            alts = [self.expr({**node, "type": t}, path) for t in types]
            return "(" + " | ".join(alts) + ")"
        t = types[0] if types else None
        if t == "object":
            return self.object_expr(node, path)
        if t == "array":
            return self.array_expr(node, path)
        raise GroundingError(f"{_fmt(path)}: cannot place grounded fields under this schema "
                             f"({', '.join(sorted(node)) or 'empty'})", path=path)

    def object_expr(self, node: dict, path: tuple) -> str:
        props = node.get("properties") or {}
        required = set(node.get("required") or [])
        names = list(props)
        missing = [r for r in required if r not in props]
        if missing:
            raise GroundingError(f"{_fmt(path)}: required properties {missing} have no schema; a grounded object "
                                 "needs every required property declared", path=path)
        if not names:
            return '"{}"'
        items = [f'{_lark_lit(json.dumps(k, ensure_ascii=False) + ":")} {self.expr(props[k], path + (k,))}'
                 for k in names]
        base = self.fresh("obj")
        # first_i: properties i.. with nothing written yet; rest_i: after at least one
        n = len(names)
        first = [f"{base}_f{i}" for i in range(n + 1)]
        rest = [f"{base}_r{i}" for i in range(n + 1)]
        can_be_empty = not (required & set(names))
        for i in range(n - 1, -1, -1):
            req = names[i] in required
            r_alts = [f'"," {items[i]} {rest[i + 1]}']
            if not req:
                r_alts.append(rest[i + 1])
            self.rules.append(f"{rest[i]}: " + " | ".join(r_alts))
            f_alts = [f"{items[i]} {rest[i + 1]}"]
            if not req and not (i == n - 1):
                f_alts.append(first[i + 1])
            self.rules.append(f"{first[i]}: " + " | ".join(f_alts))
        self.rules.append(f'{rest[n]}: ""')
        return f'"{{" {first[0]}{"?" if can_be_empty else ""} "}}"'

    def array_expr(self, node: dict, path: tuple) -> str:
        if node.get("prefixItems") is not None or isinstance(node.get("items"), list):
            raise GroundingError(f"{_fmt(path)}: grounded fields in tuple arrays (prefixItems) are not supported",
                                 path=path)
        items = node.get("items", {})
        item = self.expr(items, path + ("items",))
        lo = int(node.get("minItems", 0) or 0)
        hi = node.get("maxItems")
        if hi is not None and int(hi) < lo:
            raise SchemaError(f"{_fmt(path)}: maxItems < minItems")
        name = self.fresh("arr")
        self.rules.append(f"{name}_i: {item}")
        more_lo = max(lo - 1, 0)
        more = f'("," {name}_i){{{more_lo},{"" if hi is None else max(int(hi) - 1, 0)}}}'
        if hi is not None and int(hi) == 0:
            return '"[]"'
        body = f"{name}_i {more}"
        return f'"[" {body} "]"' if lo >= 1 else f'"[" ({body})? "]"'

    # -- leaves ---------------------------------------------------------------------------------
    def leaf_expr(self, node: dict, leaf: _Leaf, path: tuple) -> str:
        self.grounded_count += 1
        check = _strip_markers({k: v for k, v in node.items()})
        for k, v in self._defs.items():
            check.setdefault(k, v)
        nullable = "null" in _types(node)
        if leaf.kind == "number":
            lits = self.number_candidates(check, path)
            if not lits:
                raise GroundingError(f"{_fmt(path)}: no number written in the source satisfies this field "
                                     f"({_constraint_summary(node)})", path=path)
            name = self.fresh("GN")
            self.rules.append(f"{name}: " + " | ".join(_lark_lit(x) for x in lits))
        else:
            constrained = any(k in node for k in _STRING_KWS)
            cands = self.string_candidates(check, leaf.granularity, path) if constrained else None
            if cands is not None and not cands:
                raise GroundingError(f"{_fmt(path)}: no span of the source satisfies this field "
                                     f"({_constraint_summary(node)})", path=path)
            if cands is not None:
                name = self.fresh("GS")
                self.rules.append(f"{name}: " + " | ".join(_lark_lit(json.dumps(c, ensure_ascii=False))
                                                           for c in cands))
            else:
                name = self.span_terminal(leaf.granularity)
        return f'({name} | "null")' if nullable else name

    def span_terminal(self, granularity: str) -> str:
        name = self.span_terms.get(granularity)
        if name is not None:
            return name
        name = self.span_terms[granularity] = f"GSTR_{granularity.upper()}"
        subs = []
        for i, doc in enumerate(self.docs):
            chunks = [_esc(doc[s:e]) for s, e in chunk_offsets(doc, granularity)]
            if not chunks:
                continue
            sub = f"SRC_{granularity.upper()}_{i}"
            self.rules.append(f"{sub}: %regex " + json.dumps({"substring_chunks": chunks}, ensure_ascii=False))
            subs.append(sub)
        if "EDGE_WS" not in "\n".join(self.rules):
            self.rules += [
                r"EDGE_WS: /[\s\u2028\u2029]/",
                r'EDGE_ESC: "\\n" | "\\t" | "\\r" | "\\f" | "\\b" | /\\u00[01][0-9a-fA-F]/',
                r"EDGE_ANY: /(.|\n)*/",
                r"EDGE_EVEN: /((.|\n)*[^\\])?(\\\\)*/",
                r"EDGE_PUNCT_L: /[,;:.!?)\]}]/",
                r"EDGE_PUNCT_R: /[,;:(\[{]/",
            ]
        body = (f"({' | '.join(subs)}) & /(.|\\n)+/ & ~(EDGE_WS EDGE_ANY) & ~(EDGE_ANY EDGE_WS) "
                f"& ~(EDGE_ESC EDGE_ANY) & ~(EDGE_EVEN EDGE_ESC) "
                f"& ~(EDGE_PUNCT_L EDGE_ANY) & ~(EDGE_ANY EDGE_PUNCT_R) "
                f"& /(.|\\n)*[\\p{{L}}\\p{{N}}](.|\\n)*/")
        self.rules.append(f"SPAN_{granularity.upper()}: {body}")
        self.rules.append(f'{name}: "\\"" SPAN_{granularity.upper()} "\\""')
        return name

    def string_candidates(self, check: dict, granularity: str, path: tuple) -> list[str] | None:
        """Distinct spans of the source that pass the field's sub-schema; None when there are too
        many to list (the lexeme is used then)."""
        validator = make_validator(check)
        max_len = check.get("maxLength")
        for kw in ("enum", "const"):
            if kw in check:  # a closed set: test its members instead of every span
                vals = check["enum"] if kw == "enum" else [check["const"]]
                out = []
                for v in vals:
                    if isinstance(v, str) and v and not _bad_edge(v[0]) and not _bad_edge(v[-1]) and \
                            any(_Doc(d).find_string(v, granularity) for d in self.docs) and validator.is_valid(v):
                        out.append(v)
                return list(dict.fromkeys(out))
        shape = _FORMAT_SHAPES.get(check.get("format")) if isinstance(check.get("format"), str) else None
        pre = None  # a cheap Python-regex prefilter; the validator still decides
        if isinstance(check.get("pattern"), str):
            try:
                pre = re.compile(check["pattern"])
            except re.error:
                pre = None
        seen: dict[str, None] = {}
        checks = 0
        for doc in self.docs:
            ch = chunk_offsets(doc, granularity)
            starts = [k for k, (s, e) in enumerate(ch) if edge_ok(doc[s] + ".")]
            good_set = {k for k, (s, e) in enumerate(ch) if edge_ok("a" + doc[e - 1])}
            for i in starts:
                s = ch[i][0]
                for j in range(i, min(len(ch), i + MAX_SPAN_CHUNKS)):
                    e = ch[j][1]
                    if max_len is not None and e - s > max_len:
                        break
                    if j not in good_set:
                        continue
                    cand = doc[s:e]
                    if cand in seen:
                        continue
                    checks += 1
                    if checks > MAX_CANDIDATE_CHECKS:
                        return None
                    if shape is not None and not shape.fullmatch(cand):
                        continue
                    if pre is not None and not pre.search(cand):
                        continue
                    if validator.is_valid(cand):
                        seen[cand] = None
                        if len(seen) > MAX_CANDIDATES:
                            return None
        return list(seen)

    def number_candidates(self, check: dict, path: tuple) -> list[str]:
        validator = make_validator(check)
        integer = "integer" in _types(check) and "number" not in _types(check)
        out: dict[str, None] = {}
        for doc in self.docs:
            for lit, _, _ in source_numbers(doc):
                if integer and not lit.is_int:
                    continue
                if validator.is_valid(lit.value):
                    out[lit.literal] = None
        return list(out)

    def build(self) -> str:
        if not self.contains(self.root, ()):
            raise GroundingError("nothing to ground: no field is marked x-grounded / Grounded() and ground= "
                                 "selects none (use ground='strings' or mark fields)")
        top = self.expr(self.root, ())
        return "start: " + top + "\n" + "\n".join(self.rules) + "\n"


def _constraint_summary(node: dict) -> str:
    keys = {k: node[k] for k in ("type", "pattern", "format", "enum", "const", "minLength", "maxLength",
                                 "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
            if k in node}
    s = json.dumps(keys, ensure_ascii=False)
    return s if len(s) < 160 else s[:157] + "..."


# ----------------------------------------------------------------------------------------------
# the constraint
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GroundedSpan:
    """Where one grounded value came from. ``path``: its JSON path (keys and indices);
    ``doc``/``start``/``end``: the first occurrence (character offsets, end exclusive) in
    ``sources[doc]``; ``occurrences``: every ``(doc, start, end)`` it matches."""

    path: tuple
    value: Any
    doc: int
    start: int
    end: int
    text: str
    occurrences: tuple = ()

    @property
    def pointer(self) -> str:
        """The JSON Pointer (RFC 6901) of the value."""
        return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in self.path)

    @property
    def label(self) -> str:
        return ".".join(str(p) for p in self.path) or "value"

    def to_dict(self) -> dict:
        return {"path": list(self.path), "pointer": self.pointer, "value": self.value, "doc": self.doc,
                "start": self.start, "end": self.end, "text": self.text,
                "occurrences": [list(o) for o in self.occurrences]}


class GroundedConstraint(Constraint):
    """A JSON constraint whose grounded fields are spans of ``sources``. Validates against the
    original schema (and pydantic model) and checks every grounded value against the source."""

    def __init__(self, grammar: str, info: Any, *, schema: Any, sources: tuple[str, ...], ground: str | None,
                 granularity: str, semantic_keywords: Sequence[str] = (), pydantic_adapter: Any = None,
                 lark: str = "", n_grounded: int = 0):
        # the base class compiles with the plain path's limits; compile a trivial grammar there and
        # the real one here, with large lexemes not precomputed (see _LIMITS_KW)
        super().__init__("json", _trivial_grammar(), info, schema=schema, semantic_keywords=semantic_keywords,
                         validator=make_validator(_strip_markers(schema)), pydantic_adapter=pydantic_adapter,
                         description=f"grounded json ({n_grounded} grounded fields, {len(sources)} documents)")
        with engine_guard("compiling the grounded constraint"):
            template = llg.LLMatcher(info.lltok, grammar, log_level=0, limits=_limits())
            err = template.get_error() if template.is_error() else ""
        if err:
            raise _compile_error(err)
        self._template = template
        self.grammar = grammar
        self.sources = sources
        self.ground = ground
        self.granularity = granularity
        self.lark = lark
        self._docs = [_Doc(d) for d in sources]
        self._builder = _GrammarBuilder(schema, sources, ground=ground, granularity=granularity, lltok=None)

    def canvas_walker(self) -> "_GroundedWalker":
        return _GroundedWalker(self)

    def locate(self, value: Any) -> tuple[list[GroundedSpan], list[ValidationIssue]]:
        """Spans of every grounded value in ``value`` (a JSON value), and issues for those not found."""
        spans: list[GroundedSpan] = []
        issues: list[ValidationIssue] = []
        for path, v, leaf in self._leaves(value, self.schema, ()):
            occ: list[tuple[int, int, int]] = []
            for di, d in enumerate(self._docs):
                found = d.find_string(v, leaf.granularity) if leaf.kind == "string" else d.find_number(v)
                occ.extend((di, s, e) for s, e in found)
            if not occ:
                issues.append(ValidationIssue(path, f"{v!r} is not {'a span' if leaf.kind == 'string' else 'a number'}"
                                                    " of the source"))
                continue
            di, s, e = occ[0]
            spans.append(GroundedSpan(path, v, di, s, e, self.sources[di][s:e], tuple(occ)))
        return spans, issues

    def _leaves(self, value: Any, node: Any, path: tuple, depth: int = 0) -> Iterable[tuple[tuple, Any, _Leaf]]:
        if depth > 64:
            return
        b = self._builder
        node, _ = b.resolve(node, path)
        if not isinstance(node, dict):
            return
        leaf = b.leaf(node, path)
        if leaf is not None:
            if leaf.kind == "string" and isinstance(value, str):
                yield path, value, leaf
            elif leaf.kind == "number" and isinstance(value, (int, float)) and not isinstance(value, bool):
                yield path, value, leaf
            return
        for kw in ("anyOf", "oneOf"):
            if isinstance(node.get(kw), list):
                rest = {k: v for k, v in node.items() if k != kw}
                for br in node[kw]:
                    sub = {**rest, **br} if isinstance(br, dict) and rest and "$ref" not in br else br
                    rs, _ = b.resolve(sub, path)
                    if make_validator(_strip_markers({**(rs if isinstance(rs, dict) else {}),
                                                      **{k: v for k, v in b._defs.items()}})).is_valid(value):
                        yield from self._leaves(value, sub, path, depth + 1)
                        return
                return
        if isinstance(node.get("allOf"), list) and len(node["allOf"]) == 1:
            yield from self._leaves(value, node["allOf"][0], path, depth + 1)
            return
        types = _types(node)
        if len(types) > 1:
            for t in types:
                if (t == "object" and isinstance(value, dict)) or (t == "array" and isinstance(value, list)) or \
                        (t == "string" and isinstance(value, str)):
                    yield from self._leaves(value, {**node, "type": t}, path, depth + 1)
                    return
            return
        if isinstance(value, dict):
            props = node.get("properties") or {}
            for k, v in value.items():
                if k in props:
                    yield from self._leaves(v, props[k], path + (k,), depth + 1)
        elif isinstance(value, list) and isinstance(node.get("items"), dict):
            for i, v in enumerate(value):
                yield from self._leaves(v, node["items"], path + (i,), depth + 1)

    def validate_text(self, text: str) -> ValidationOutcome:
        out = super().validate_text(text)
        if not out.ok:
            return out
        try:
            raw = json.loads(text)
        except ValueError:  # pragma: no cover - validated above
            return out
        _, issues = self.locate(raw)
        if issues:
            return ValidationOutcome(False, out.value, issues)
        return out


class _GroundedWalker(CanvasWalker):
    """A canvas walker that does not force the token opening a string value (``":"``, ``":["``,
    ``","`` in an array), as llguidance's own JSON grammar does not. Measured on the embedded model
    in diffusion mode: with ``{"name":"`` forced the first value token goes wrong ("Hriya Brown"
    for "Priya Brown", or a span of the instruction), with ``{"name`` forced it does not."""

    def forced_tokens(self, max_n: int) -> list[int]:
        out = super().forced_tokens(max_n)
        stops = set(self.constraint.stop_token_ids)
        while out and out[-1] not in stops:
            text = self.constraint.tokenizer_info.lltok.decode_str(out)
            if not re.search(r'(?:^|[:\[,])"$', text):
                break
            out.pop()
        return out


_TRIVIAL: list = []


def _trivial_grammar() -> str:
    if not _TRIVIAL:
        _TRIVIAL.append(llg.LLMatcher.grammar_from_lark('start: "{}"'))
    return _TRIVIAL[0]


def _compile_error(err: str) -> DgemmaStructError:
    from dgemma_struct.errors import ConstraintCompileTimeout
    low = err.lower()
    if any(w in low for w in ("limit", "fuel", "too many", "too complex", "too large")):
        return ConstraintCompileTimeout(f"the grounded grammar exceeds the compile limits (source too large?): "
                                        f"{clip(err)}")
    return SchemaError(f"cannot compile the grounded grammar: {clip(err)}")


def _schema_of(schema: Any) -> tuple[Any, Any]:
    """-> (JSON Schema dict, pydantic TypeAdapter or None)."""
    from dgemma_struct.constraints.specs import JsonSchema
    if isinstance(schema, JsonSchema):
        schema = schema.as_dict()
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise SchemaError(f"schema is not valid JSON: {e}") from None
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        from pydantic import TypeAdapter
        try:
            return schema.model_json_schema(), TypeAdapter(schema)
        except Exception as e:  # noqa: BLE001 - pydantic raises several types
            raise SchemaError(f"cannot derive a JSON Schema from {schema.__name__}: {e}") from None
    if isinstance(schema, dict):
        try:
            return json.loads(json.dumps(schema)), None
        except (TypeError, ValueError) as e:
            raise SchemaError(f"schema is not JSON-serialisable: {e}") from None
    if isinstance(schema, bool):
        raise GroundingError("a boolean schema has no fields to ground")
    raise SchemaError(f"grounded extraction needs a JSON Schema dict or a pydantic model, not {schema!r}")


_cache: "OrderedDict[tuple, GroundedConstraint]" = OrderedDict()
_cache_lock = threading.Lock()
_CACHE_MAX = 64


def compile_grounded(schema: Any, tokenizer: Any, *, source: str | Sequence[str], ground: str | None = None,
                     granularity: str = "words", stop_token_ids: Sequence[int] | None = None,
                     vocab_size: int | None = None, strict: bool = False,
                     use_cache: bool = True) -> GroundedConstraint:
    """Compile ``schema`` (pydantic model or JSON Schema) so that its grounded fields can only take
    spans (strings) and number literals (numbers) of ``source`` (one text or a list of texts).

    ``ground``: None (only fields marked ``x-grounded`` / ``Grounded()``), ``"strings"`` (also every
    free string field), ``"numbers"`` or ``"all"``. ``granularity``: default for fields without an
    explicit mode, ``"words"`` or ``"chars"``. Raises :class:`GroundingError` for an empty source,
    an unsatisfiable grounded field or grounding on a non-string, non-number field."""
    if ground not in GROUND_LEVELS:
        raise GroundingError(f"ground must be one of {GROUND_LEVELS}, not {ground!r}")
    if granularity not in GRANULARITIES:
        raise GroundingError(f"granularity must be one of {GRANULARITIES}, not {granularity!r}")
    docs = grounded_sources(None, source)
    info = get_tokenizer_info(tokenizer, stop_token_ids, vocab_size)
    js, adapter = _schema_of(schema)
    key = None
    if use_cache:
        h = hashlib.sha256("\x00".join(docs).encode("utf-8", "surrogatepass")).hexdigest()
        skey = f"pydantic:{id(schema)}" if adapter is not None else json.dumps(js, sort_keys=True)
        key = (skey, h, len(docs), ground, granularity, info.key, strict)
        with _cache_lock:
            c = _cache.get(key)
            if c is not None:
                _cache.move_to_end(key)
                return c
    # schema checks (metaschema, refs, bounds) and the keywords the grammar leaves to validation
    plan = prepare_json_schema(_strip_markers(js), info.lltok, strict=strict, limits=_limits())
    builder = _GrammarBuilder(js, docs, ground=ground, granularity=granularity, lltok=info.lltok)
    lark = builder.build()
    with engine_guard("building the grounded grammar"):
        grammar = llg.LLMatcher.grammar_from_lark(lark)
    c = GroundedConstraint(grammar, info, schema=js, sources=docs, ground=ground, granularity=granularity,
                           semantic_keywords=plan.semantic_keywords, pydantic_adapter=adapter, lark=lark,
                           n_grounded=builder.grounded_count)
    if use_cache and key is not None:
        with _cache_lock:
            _cache[key] = c
            while len(_cache) > _CACHE_MAX:
                _cache.popitem(last=False)
    return c


# ----------------------------------------------------------------------------------------------
# results and generation
# ----------------------------------------------------------------------------------------------
@dataclass
class GroundedResult:
    """A grounded extraction: ``value`` (pydantic instance or JSON value), ``spans`` (one
    :class:`GroundedSpan` per grounded value), ``sources`` (the documents), ``text``, ``stats``."""

    value: Any
    spans: list[GroundedSpan]
    sources: tuple[str, ...]
    text: str = ""
    stats: Any = None
    json_value: Any = None

    def to_dict(self) -> dict:
        """JSON-ready ``{"value", "spans", "sources"}`` (what a server returns in its extension field)."""
        v = self.value.model_dump(mode="json") if hasattr(self.value, "model_dump") else self.value
        return {"value": v, "spans": [s.to_dict() for s in self.spans], "n_sources": len(self.sources)}

    def to_html(self, *, title: str | None = None, full_page: bool = True) -> str:
        """The source documents with every grounded span highlighted and labelled by its field."""
        return render_html(self.sources, self.spans, value=self.json_value, title=title, full_page=full_page)


_PALETTE = ["#ffd54f", "#81d4fa", "#a5d6a7", "#f48fb1", "#ce93d8", "#ffab91", "#80cbc4", "#e6ee9c",
            "#b0bec5", "#bcaaa4"]


def render_html(sources: Sequence[str], spans: Sequence[GroundedSpan], *, value: Any = None,
                title: str | None = None, full_page: bool = True) -> str:
    """HTML of ``sources`` with ``spans`` highlighted (one colour per field, its name as a label),
    followed by a table of the extracted values and their offsets."""
    labels = list(dict.fromkeys(re.sub(r"\.\d+(?=\.|$)", "[]", s.label) for s in spans))
    color = {lab: _PALETTE[i % len(_PALETTE)] for i, lab in enumerate(labels)}
    parts = []
    for di, doc in enumerate(sources):
        mine = sorted((s for s in spans if s.doc == di), key=lambda s: (s.start, -(s.end - s.start)))
        cuts = sorted({0, len(doc)} | {s.start for s in mine} | {s.end for s in mine})
        out = []
        for a, b in zip(cuts, cuts[1:]):
            cover = [s for s in mine if s.start <= a and b <= s.end]
            seg = html.escape(doc[a:b])
            if cover:
                top = cover[-1]
                lab = re.sub(r"\.\d+(?=\.|$)", "[]", top.label)
                names = ", ".join(html.escape(c.label) for c in cover)
                seg = (f'<mark style="background:{color[lab]}" title="{names}" '
                       f'data-fields="{names}">{seg}</mark>')
            out.append(seg)
            for s in mine:
                if s.end == b:
                    lab = re.sub(r"\.\d+(?=\.|$)", "[]", s.label)
                    out.append(f'<span class="lbl" style="background:{color[lab]}">{html.escape(s.label)}</span>')
        head = f'<div class="doc-h">source {di + 1} of {len(sources)}</div>' if len(sources) > 1 else ""
        parts.append(f'{head}<div class="doc">{"".join(out)}</div>')
    rows = "".join(
        f'<tr><td><span class="sw" style="background:{color[re.sub(r".[0-9]+(?=[.]|$)", "[]", s.label)]}">'
        f'</span>{html.escape(s.pointer)}</td><td><code>{html.escape(json.dumps(s.value, ensure_ascii=False))}'
        f'</code></td><td>{s.doc}:{s.start}&ndash;{s.end}</td></tr>' for s in spans)
    table = (f'<table><thead><tr><th>field</th><th>value</th><th>source:chars</th></tr></thead>'
             f'<tbody>{rows}</tbody></table>')
    val = (f'<pre class="val">{html.escape(json.dumps(value, ensure_ascii=False, indent=2))}</pre>'
           if value is not None else "")
    body = (f'<div class="grounded">{"<h2>" + html.escape(title) + "</h2>" if title else ""}{"".join(parts)}'
            f'{table}{val}</div>')
    if not full_page:
        return body
    css = ("body{font-family:system-ui,sans-serif;margin:24px;color:#222;background:#fff}"
           ".doc{white-space:pre-wrap;line-height:2.1;font-size:17px;border:1px solid #ddd;border-radius:6px;"
           "padding:12px 14px;margin:8px 0 16px}.doc-h{font-size:12px;color:#777}"
           "mark{border-radius:3px;padding:1px 2px}.lbl{font-size:10px;vertical-align:super;border-radius:3px;"
           "padding:0 3px;margin-left:1px;font-family:monospace;opacity:.85}"
           "table{border-collapse:collapse;font-size:14px}td,th{border-bottom:1px solid #eee;padding:4px 10px;"
           "text-align:left}.sw{display:inline-block;width:10px;height:10px;margin-right:6px;border-radius:2px}"
           ".val{background:#f6f8fa;padding:10px;border-radius:6px;font-size:13px}")
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title or "grounded extraction")}'
            f'</title><style>{css}</style></head><body>{body}</body></html>')


def prompt_with_sources(prompt: Any, docs: Sequence[str]) -> Any:
    """The prompt, with every source document it does not already contain appended (the model
    must see what it copies from)."""
    present = "\n".join(_prompt_text(prompt))
    extra = [d for d in docs if d not in present]
    if not extra:
        return prompt
    add = "\n\n".join(extra)
    if isinstance(prompt, str):
        return prompt + "\n" + add
    msgs = [dict(m) for m in prompt]
    for m in reversed(msgs):
        if m.get("role", "user") == "user" and isinstance(m.get("content"), str):
            m["content"] = m["content"] + "\n" + add
            return msgs
    return msgs + [{"role": "user", "content": add}]


def _prepare(prompt: Any, schema: Any, runtime: Any, *, source: Any, ground: str | None, granularity: str,
             max_new_tokens: int, strict: bool) -> tuple[Any, GroundedConstraint]:
    docs = grounded_sources(prompt, source)
    full = prompt_with_sources(prompt, docs) if source is not None else prompt
    ids = runtime.encode_prompt(full)
    if len(ids) + max_new_tokens > runtime.max_context:
        raise PromptTooLongError(f"the prompt with its grounding source is {len(ids)} tokens; with max_new_tokens="
                                 f"{max_new_tokens} it exceeds the model's context of {runtime.max_context} tokens")
    c = compile_grounded(schema, runtime.tokenizer, source=docs, ground=ground, granularity=granularity,
                         stop_token_ids=runtime.eos_token_ids,
                         vocab_size=runtime.model.config.text_config.vocab_size, strict=strict)
    return full, c


def _result(res: Any, c: GroundedConstraint) -> GroundedResult:
    raw = json.loads(res.text)
    spans, issues = c.locate(raw)
    if issues:  # validate_text already refused such outputs; never hand one back as success
        from dgemma_struct.errors import GenerationFailed
        raise GenerationFailed("a grounded value is not in the source: " + "; ".join(map(str, issues)),
                               errors=[str(i) for i in issues], partial_text=res.text, stats=res.stats)
    return GroundedResult(value=res.value, spans=spans, sources=c.sources, text=res.text, stats=res.stats,
                          json_value=raw)


def generate_grounded(prompt: Any, schema: Any, *, source: str | Sequence[str] | None = None,
                      ground: str | None = None, granularity: str = "words", runtime: Any = None,
                      max_new_tokens: int = 128, strict: bool = False, **opts: Any) -> GroundedResult:
    """Grounded extraction: like :func:`dgemma_struct.generate_json`, but grounded fields (see the
    module docstring) only take spans / numbers of ``source`` (default: the prompt's text; a source
    not already in the prompt is appended to it). Other options (``mode``, ``seed``,
    ``max_repairs``, ``fallback``, ``timeout_s`` ...) are :func:`dgemma_struct.generate`'s.
    Returns a :class:`GroundedResult` with ``.value``, ``.spans`` and ``.to_html()``."""
    from dgemma_struct.api import _runtime, generate
    rt = _runtime(runtime)
    full, c = _prepare(prompt, schema, rt, source=source, ground=ground, granularity=granularity,
                       max_new_tokens=max_new_tokens, strict=strict)
    opts.pop("return_details", None)
    res = generate(full, c, runtime=rt, max_new_tokens=max_new_tokens, return_details=True, **opts)
    return _result(res, c)


def generate_grounded_batch(prompts: Sequence[Any], schema: Any, *, sources: Sequence[Any] | None = None,
                            ground: str | None = None, granularity: str = "words", runtime: Any = None,
                            max_new_tokens: int = 128, strict: bool = False, return_exceptions: bool = False,
                            **opts: Any) -> list[Any]:
    """:func:`generate_grounded` for many prompts in one batched canvas loop (``schema``: one for all
    or one per prompt; ``sources``: one per prompt, None entries meaning the prompt's text). With
    ``return_exceptions=True`` a failed row holds its typed error."""
    from dgemma_struct.api import _runtime, generate_batch
    rt = _runtime(runtime)
    n = len(prompts)
    schemas = list(schema) if isinstance(schema, (list, tuple)) else [schema] * n
    srcs = list(sources) if sources is not None else [None] * n
    if len(schemas) != n or len(srcs) != n:
        raise InvalidRequestError(f"{n} prompts but {len(schemas)} schemas and {len(srcs)} sources")
    prepared: list[Any] = []
    for p, s, src in zip(prompts, schemas, srcs):
        try:
            prepared.append(_prepare(p, s, rt, source=src, ground=ground, granularity=granularity,
                                     max_new_tokens=max_new_tokens, strict=strict))
        except DgemmaStructError as err:
            if not return_exceptions:
                raise
            prepared.append(err)
    live = [i for i, x in enumerate(prepared) if not isinstance(x, DgemmaStructError)]
    out: list[Any] = list(prepared)
    if live:
        res = generate_batch([prepared[i][0] for i in live], [prepared[i][1] for i in live], runtime=rt,
                             max_new_tokens=max_new_tokens, return_exceptions=return_exceptions, **opts)
        for i, r in zip(live, res):
            if isinstance(r, DgemmaStructError):
                out[i] = r
                continue
            try:
                out[i] = _result(r, prepared[i][1])
            except DgemmaStructError as err:
                if not return_exceptions:
                    raise
                out[i] = err
    return out


DEMO_PROMPT = ("Extract the name, age and email as JSON.\nTara Zhang is 42 years old and can be reached at "
               "tzhang@post.io.")
DEMO_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                                "email": {"type": "string", "format": "email"}},
               "required": ["name", "age", "email"], "additionalProperties": False}


def demo(runtime: Any = None, *, seed: int = 0, html_path: str | None = None) -> str:
    """Text for ``dgemma-struct demo``: the same extraction schema-constrained only and grounded
    (``ground="all"``), diffusion and AR, with the grounded offsets; optionally writes the HTML
    rendering of the last grounded result to ``html_path``."""
    from dgemma_struct.api import _runtime, generate
    rt = _runtime(runtime)
    lines = ["grounded extraction: every string is a span of the prompt, every number is written in it",
             f"prompt: {DEMO_PROMPT!r}"]
    res = None
    for mode in ("diffusion", "ar"):
        plain = generate(DEMO_PROMPT, DEMO_SCHEMA, runtime=rt, seed=seed, mode=mode)
        res = generate_grounded(DEMO_PROMPT, DEMO_SCHEMA, ground="all", runtime=rt, seed=seed, mode=mode)
        lines.append(f"  {mode:9s} constrained: {json.dumps(plain)}")
        lines.append(f"  {'':9s} grounded:    {json.dumps(res.json_value)}")
        lines.append(f"  {'':9s} spans:       " + ", ".join(f"{s.pointer}@{s.start}-{s.end}" for s in res.spans))
    if html_path and res is not None:
        with open(html_path, "w", encoding="utf-8") as f:
            f.write(res.to_html(title="dgemma-struct grounded extraction"))
        lines.append(f"  highlighted source: {html_path}")
    return "\n".join(lines)


def grounding_options(obj: Any) -> dict:
    """Validate a server request's grounding extension (``"grounding": {"ground": "strings",
    "source": "..." | [...], "granularity": "words"}``; ``true`` means ``{"ground": "strings"}``)
    into keyword arguments of :func:`generate_grounded`. Raises :class:`GroundingError` (a 400)."""
    if obj is True:
        return {"ground": "strings"}
    if not isinstance(obj, dict):
        raise GroundingError("grounding must be true or an object with ground / source / granularity")
    unknown = sorted(set(obj) - {"ground", "source", "granularity"})
    if unknown:
        raise GroundingError(f"unknown grounding option(s): {', '.join(map(str, unknown))}")
    out: dict = {}
    if obj.get("ground") is not None:
        if obj["ground"] not in GROUND_LEVELS:
            raise GroundingError(f"grounding.ground must be one of {GROUND_LEVELS[1:]}, not {obj['ground']!r}")
        out["ground"] = obj["ground"]
    if obj.get("granularity") is not None:
        if obj["granularity"] not in GRANULARITIES:
            raise GroundingError(f"grounding.granularity must be one of {GRANULARITIES}")
        out["granularity"] = obj["granularity"]
    if obj.get("source") is not None:
        out["source"] = grounded_sources(None, obj["source"])
    return out
