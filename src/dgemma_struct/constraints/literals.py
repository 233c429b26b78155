"""Screens for literals that reach the native engine (llguidance): wide numbers, ``%json`` blocks
inside Lark grammars, regex dialects and text llguidance cannot encode.

**One rule for numbers** (:func:`is_wide_number`): a JSON number (an ``int`` *or* a ``float``, never a
``bool``) whose double value reaches ``2**63`` in size is *wide*. llguidance reads numbers into 64-bit
integers where a schema says ``"type": "integer"``; a value that saturates to ``-2**63`` there
(``-1e308``, ``-9.223372036854776e18``, ``-9223372036854775807``, ...) kills the process (SIGSEGV),
and one beyond the range makes its schema reader fail. Every float that large is integral, so the rule
covers "integral floats beyond i64" too. The same rule screens JSON schemas (:mod:`.json_schema`),
``%json`` bodies of Lark grammars (:func:`screen_lark_json`), tool schemas and grounded specs (both
compiled through those two paths).

>>> is_wide_number(-1e308), is_wide_number(-9223372036854775807), is_wide_number(2 ** 62), is_wide_number(True)
(True, True, False, False)
>>> regex_dialect_error("a**") is not None, regex_dialect_error(r"\\p{L}+") is None
(True, True)
"""
from __future__ import annotations

import json
import math
import re
import warnings
from typing import Any

from dgemma_struct.errors import GrammarError

from .safety import (ANNOTATIONS, JSON_TYPE_OF, MAX_SCHEMA_DEPTH, STRUCTURAL, WIDE, clip, drop_wide_literals,
                     has_wide_number, is_wide_number)
from .field_bounds import engine_reads_step
from .json_locate import json_equal
from .schema_checks import spec_format_valid

__all__ = ["WIDE", "EXTREME_BOUND", "drop_extreme_bounds", "decimal_step_copy", "MAX_ENUMERATED_MULTIPLES", "is_wide_number", "has_wide_number", "screen_lark_json", "regex_dialect_error",
           "lone_surrogate", "is_ecma_regex", "drop_wide_literals", "exact_literal_grammar"]

#: number bounds this large (or smaller than 1e-15 but not 0) are left out of the grammar copy: llguidance's
#: range regexes fail near the 64-bit limits ("Failed to generate regex for integer range") and on long
#: decimals (``minimum: 1e-308`` is a regex parse error); validation checks them exactly
EXTREME_BOUND = float(2 ** 62)
_BOUND_KWS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def drop_extreme_bounds(s: dict, dropped: list[str] | None = None) -> Any:
    """Remove extreme number bounds (:data:`EXTREME_BOUND`) from a grammar-copy subschema ``s`` (named in
    ``dropped``): a superset, or the one value :func:`_pin_narrow_range` pinned (returned; else None)."""
    popped: dict[str, Any] = {}
    for kw in _BOUND_KWS:
        v = s.get(kw)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        try:
            a = abs(float(v))
        except OverflowError:
            a = math.inf
        if a >= EXTREME_BOUND or (isinstance(v, float) and 0 < a < 1e-15):
            popped[kw] = s.pop(kw)
            if dropped is not None:
                dropped.append(kw)
    tiny = {k: v for k, v in popped.items() if abs(v) < 1}  # (the huge ones: refused where they must hold)
    if tiny and not {"multipleOf", "enum", "const"} & set(s) and not any(isinstance(v, bool) for v in s.values()):
        return _pin_narrow_range(s, {**{k: s[k] for k in _BOUND_KWS if _plain_number(s.get(k))}, **tiny})


def _pin_narrow_range(s: dict, b: dict) -> Any:
    """A range narrower than ``1e-15`` that lost a tiny bound (``[0, 1e-300]``), which no number a model writes
    falls in: the grammar copy pins one valid value (an inclusive end, else the midpoint) as its ``enum``."""
    integer = s.get("type") in ("integer", ["integer"])
    lo = [float(b[k]) for k in ("minimum", "exclusiveMinimum") if k in b]
    hi = [float(b[k]) for k in ("maximum", "exclusiveMaximum") if k in b]
    if not (lo and hi and (integer or s.get("type") in ("number", ["number"]))
            and max(lo) <= min(hi) < max(lo) + 1e-15):
        return
    a, z = max(lo), min(hi)
    ax, zx = b.get("exclusiveMinimum") == a, b.get("exclusiveMaximum") == z
    for x in ([] if ax else [a]) + ([] if zx else [z]) + [(a + z) / 2]:
        if (a < x if ax else a <= x) and (x < z if zx else x <= z) and (not integer or x.is_integer()):
            s["enum"] = [int(x) if integer else x]
            return s["enum"][0]


#: a decimal ``multipleOf`` between bounds with at most this many multiples compiles to their ``enum``
MAX_ENUMERATED_MULTIPLES = 256


def decimal_step_copy(s: dict, dropped: list[str] | None = None) -> None:
    """The grammar copy of a subschema with a decimal ``multipleOf`` (``0.1``): llguidance compiles it
    wrongly next to bounds (``0.1`` in ``[0.25, 0.35]`` accepted nothing). With both bounds and at most
    :data:`MAX_ENUMERATED_MULTIPLES` multiples in range, the grammar is exactly their ``enum`` (``[0.3]``);
    otherwise the non-integer bounds are left to validation (exact, in Decimal), and the step too unless
    llguidance reads it exactly (:func:`engine_reads_step`: then the grammar keeps it, ``0.5`` refuses ``0.3``)."""
    from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, InvalidOperation

    step = s.pop("multipleOf")
    try:
        d = Decimal(repr(step))
        lo = [(Decimal(repr(s[k])), k == "exclusiveMinimum") for k in ("minimum", "exclusiveMinimum")
              if _plain_number(s.get(k))]
        hi = [(Decimal(repr(s[k])), k == "exclusiveMaximum") for k in ("maximum", "exclusiveMaximum")
              if _plain_number(s.get(k))]
        if d > 0 and lo and hi and s.get("type", "number") in ("number", ["number"]):
            a, b = max(lo)[0], min(hi)[0]
            k0 = (a / d).to_integral_value(ROUND_CEILING)
            k1 = (b / d).to_integral_value(ROUND_FLOOR)
            if 0 <= k1 - k0 < MAX_ENUMERATED_MULTIPLES:
                vals = [k * d for k in range(int(k0), int(k1) + 1)]
                vals = [v for v in vals if all(v > x if strict else v >= x for x, strict in lo)
                        and all(v < x if strict else v <= x for x, strict in hi)]
                if vals:
                    s["enum"] = [float(v) if v != v.to_integral_value() else int(v) for v in vals]
                    return
    except (InvalidOperation, ValueError, OverflowError):
        pass
    if engine_reads_step(step):  # kept: llguidance enforces it exactly beside integer bounds (0.5 refuses 0.3)
        s["multipleOf"] = step
    elif dropped is not None:
        dropped.append("multipleOf")
    for kw in _BOUND_KWS:  # decimal range regexes refuse valid values (0.3 in [0.25, 0.35]): validation
        v = s.get(kw)
        if isinstance(v, float) and not v.is_integer():
            s.pop(kw)
            if dropped is not None:
                dropped.append(kw)


def _plain_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


_JSON_DIRECTIVE = re.compile(r"%json\b\s*")


def screen_lark_json(text: str) -> None:
    """Raise :class:`GrammarError` when a ``%json {...}`` block of a Lark grammar holds a wide number
    (the rule of :func:`is_wide_number`), nests too deeply, or is not JSON (llguidance would be handed
    a spec that can crash it)."""
    if "%json" not in text:
        return
    dec = json.JSONDecoder()
    for m in _JSON_DIRECTIVE.finditer(text):
        pos = m.end()
        if pos >= len(text) or text[pos] not in "{[tf":
            continue
        line = text.count("\n", 0, m.start()) + 1
        depth = 0
        for ch in text[pos:pos + 200_000]:  # a cheap nesting bound before json's recursive reader
            if ch in "{[":
                depth += 1
                if depth > MAX_SCHEMA_DEPTH * 4:
                    raise GrammarError(f"%json block at line {line} is nested too deeply")
            elif ch in "}]":
                depth -= 1
                if depth <= 0:
                    break
        try:
            body, _ = dec.raw_decode(text, pos)
        except (ValueError, RecursionError) as e:
            raise GrammarError(f"%json block at line {line} is not valid JSON: {clip(e, 200)}") from None
        if has_wide_number(body):
            raise GrammarError(f"%json block at line {line} holds a number beyond the 64-bit range (|v| >= 2**63), "
                               f"which the constrained decoder cannot take; write it as a quoted literal "
                               f"terminal instead")


def lone_surrogate(text: str) -> int | None:
    """The index of the first lone surrogate in ``text`` (it cannot be encoded as UTF-8), or None."""
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as e:
        return e.start


_RUST_ONLY = re.compile(r"\\x\{[0-9A-Fa-f]{1,8}\}")


def regex_dialect_error(pattern: str) -> str | None:
    """None when ``pattern`` parses in at least one of Python's ``re``, the ``regex`` module or
    ECMA-262 (jsonschema-rs' ``format: regex`` check); else the first parser's message. llguidance
    accepts some patterns none of them do (``a**``, a trailing ``\\``) and reads them as something else."""
    first: str | None = None
    pattern = _RUST_ONLY.sub("x", pattern)  # Rust spellings none of the three read (\x{1F600})
    try:
        with warnings.catch_warnings():  # "possible set intersection": Rust syntax, read by re as a set
            warnings.simplefilter("ignore")
            re.compile(pattern)
        return None
    except Exception as e:  # noqa: BLE001 - re.error, OverflowError, RecursionError
        first = f"{type(e).__name__}: {e}"
    try:
        import regex as _regex
        _regex.compile(pattern)
        return None
    except ImportError:  # pragma: no cover - regex is in the lock
        pass
    except Exception:  # noqa: BLE001
        pass
    if is_ecma_regex(pattern, default=False):
        return None
    return first


def is_ecma_regex(pattern: Any, default: bool = True) -> bool:
    """Whether ``pattern`` is an ECMA-262 regular expression (JSON Schema's ``format: "regex"``), as
    jsonschema-rs checks it; without jsonschema-rs, Python's ``re`` decides (``default`` on doubt)."""
    if not isinstance(pattern, str):
        return True
    ok = spec_format_valid("regex", pattern, on_error=default)
    if ok is not None:
        return ok
    try:  # pragma: no cover - jsonschema-rs is in the lock
        re.compile(pattern)
        return True
    except Exception:  # noqa: BLE001
        return False


# ----------------------------------------------------------------------------------------------
# wide literals: out of the JSON grammar copy, back in as exact Lark text
# ----------------------------------------------------------------------------------------------
_MARK = "x-dgemma-literals"
_MAX_REPEAT = 64


class _Unsupported(Exception):
    """A literal sits where :class:`_LiteralGrammar` cannot write the structure around it."""


def _fits(v: Any, t: Any) -> bool:
    """Whether the JSON value ``v`` has the JSON-Schema ``type`` ``t`` (a name or a list; None: any)."""
    if t is None:
        return True
    names = t if isinstance(t, list) else [t]
    own = JSON_TYPE_OF.get(type(v), "string")
    integral = own == "integer" or (own == "number" and float(v).is_integer())
    return own in names or (own == "integer" and "number" in names) or (integral and "integer" in names)


def exact_literal_grammar(g: dict, marks: list, opts: dict) -> str | None:
    """A Lark grammar for the JSON grammar copy ``g`` in which every ``const`` / ``enum`` that
    :func:`drop_wide_literals` removed is written back *exactly*, as quoted Lark literals (llguidance
    never reads them as numbers, so nothing near ``+-2**63`` reaches it as one). The structure down to
    those literals (``properties``, ``items``, ``anyOf`` / ``oneOf``, one-schema ``allOf``, type lists)
    is written as Lark rules, every other subschema stays ``%json`` (``opts``: its ``x-guidance``).
    Objects list their declared properties in order (a subset: validation still decides); local
    ``$ref`` s become rules. None when a literal sits where this cannot reach it (tuples, ``not``, ...)."""
    for s, kw, vals, written in marks:
        if written and (kw == "const" or _MARK not in s):
            s[_MARK] = vals
    try:
        marked = json.loads(json.dumps(g))
    finally:
        for s, *_ in marks:
            s.pop(_MARK, None)
    builder = _LiteralGrammar(marked, g, opts)
    if not builder.marked(marked):
        return None
    try:
        text = builder.build()
    except (_Unsupported, RecursionError, TypeError, ValueError):
        return None
    return None if lone_surrogate(text) is not None else text  # text the engine could not take


class _LiteralGrammar:
    """``root``: the marked copy (structure); ``plain``: the grammar copy (``$defs`` of the ``%json`` leaves)."""

    def __init__(self, root: dict, plain: dict, opts: dict):
        self.root, self.opts, self.rules, self.n, self.refs = root, opts, [], 0, {}
        self.item = opts.get("item_separator") or ","
        self.key = opts.get("key_separator") or ":"
        self.shared = {k: plain[k] for k in ("$defs", "definitions", "$schema") if k in plain}
        self.memo: dict[int, tuple[Any, bool]] = {}

    def marked(self, x: Any) -> bool:
        """Whether ``x`` holds a literal mark, local ``$ref`` s followed (memoised per object, kept alive
        with it; inside a ``$ref`` cycle a node may read unmarked: then it stays ``%json``, a superset)."""
        if isinstance(x, list):
            return any(self.marked(v) for v in x)
        if not isinstance(x, dict):
            return False
        hit = self.memo.get(id(x))
        if hit is None:
            self.memo[id(x)] = (x, False)
            hit = self.memo[id(x)] = (x, _MARK in x or any(self.marked(v) for v in x.values())
                                      or self.marked(self.target(x.get("$ref"))))
        return hit[1]

    def target(self, ref: Any) -> Any:
        """The subschema of the marked copy a local ``$ref`` (``#/...``) names, or None."""
        if not (isinstance(ref, str) and ref.startswith("#/")):
            return None
        cur: Any = self.root
        for part in ref[2:].split("/"):
            cur = cur.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(cur, dict) else None
        return cur

    def build(self) -> str:
        top = self.expr(self.root, 0)
        ws = "%ignore /[ \\t\\n\\r]+/\n" if self.opts.get("whitespace_flexible") else ""
        return "start: " + top + "\n" + "".join(r + "\n" for r in self.rules) + ws

    def fresh(self) -> str:
        self.n += 1
        return f"wide_{self.n}"

    def lit(self, v: Any) -> str:
        return json.dumps(json.dumps(v, separators=(self.item, self.key), ensure_ascii=False), ensure_ascii=False)

    def leaf(self, node: Any) -> str:
        body = dict(node) if isinstance(node, dict) else ({} if node is True else {"not": {}})
        for k, v in self.shared.items():
            body.setdefault(k, v)
        body["x-guidance"] = self.opts
        text = json.dumps(body, ensure_ascii=False)
        if _MARK in text:  # never: a mark holds the numbers the engine must not read
            raise _Unsupported
        return "%json " + text

    def expr(self, node: Any, depth: int) -> str:
        if depth > 64:
            raise _Unsupported
        if not isinstance(node, dict) or not self.marked(node):
            return self.leaf(node)
        if _MARK in node:
            vals = [v for v in node[_MARK] if _fits(v, node.get("type"))]
            if not vals:
                raise _Unsupported
            return "(" + " | ".join(self.lit(v) for v in vals) + ")"
        if "$ref" in node:
            if self.target(node["$ref"]) is None or set(node) - {"$ref", "$defs", "definitions", "$schema",
                                                                   *ANNOTATIONS}:
                raise _Unsupported
            name = self.refs.get(node["$ref"])
            if name is None:
                name = self.refs[node["$ref"]] = self.fresh()
                self.rules.append(f"{name}: {self.expr(self.target(node['$ref']), depth + 1)}")
            return name
        if "prefixItems" in node:
            raise _Unsupported
        for kw in ("anyOf", "oneOf", "allOf"):
            subs = node.get(kw)
            if isinstance(subs, list):
                if kw == "allOf" and len(subs) != 1:  # bounded by its finite branches: their common literals
                    sets = [b[_MARK] for b in subs if isinstance(b, dict) and _MARK in b] or [()]
                    vals = [v for v in sets[0] if all(any(json_equal(v, w) for w in o) for o in sets[1:])]
                    return self.expr({**{k: v for k, v in node.items() if k != kw}, _MARK: vals}, depth + 1)
                rest = {k: v for k, v in node.items() if k != kw}
                alts = [self.expr({**rest, **b} if isinstance(b, dict) else b, depth + 1) for b in subs]
                return "(" + " | ".join(alts) + ")"
        t = node.get("type")
        if isinstance(t, list):
            return "(" + " | ".join(self.expr({**node, "type": x}, depth + 1) for x in t) + ")"
        if t == "object" or (t is None and isinstance(node.get("properties"), dict)):
            return self.object(node, depth)
        if t == "array" or (t is None and "items" in node):
            return self.array(node, depth)
        if t in ("null", "boolean", "string", "number", "integer"):  # a scalar branch of a type list
            return self.leaf({k: v for k, v in node.items() if k not in STRUCTURAL})
        raise _Unsupported

    def object(self, node: dict, depth: int) -> str:
        props = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        required = set(node.get("required") or [])
        mp = node.get("minProperties")
        if not required <= set(props) or (isinstance(mp, (int, float)) and mp > len(props)):
            raise _Unsupported
        names = list(props)
        if not names:
            return '"{}"'
        items = [f"{json.dumps(json.dumps(k, ensure_ascii=False) + self.key, ensure_ascii=False)} "
                 f"{self.expr(props[k], depth + 1)}" for k in names]
        base = self.fresh()
        first = [f"{base}_f{i}" for i in range(len(names) + 1)]
        rest = [f"{base}_r{i}" for i in range(len(names) + 1)]
        sep = json.dumps(self.item)
        for i in range(len(names) - 1, -1, -1):
            req = names[i] in required
            self.rules.append(f"{rest[i]}: {sep} {items[i]} {rest[i + 1]}" + ("" if req else f" | {rest[i + 1]}"))
            alts = [f"{items[i]} {rest[i + 1]}"] + ([first[i + 1]] if not req and i < len(names) - 1 else [])
            self.rules.append(f"{first[i]}: " + " | ".join(alts))
        self.rules.append(f'{rest[-1]}: ""')
        return f'"{{" {first[0]}{"" if required else "?"} "}}"'

    def array(self, node: dict, depth: int) -> str:
        items = node.get("items", True)
        lo, hi = node.get("minItems", 0), node.get("maxItems")
        lo = lo if isinstance(lo, int) and not isinstance(lo, bool) and lo > 0 else 0
        hi = hi if isinstance(hi, int) and not isinstance(hi, bool) and hi >= lo else None
        if lo > _MAX_REPEAT:
            raise _Unsupported
        if hi == 0:
            return '"[]"'
        name = self.fresh()
        self.rules.append(f"{name}: {self.expr(items, depth + 1)}")
        top = "" if hi is None or hi > _MAX_REPEAT else str(hi - 1)
        body = name if hi == 1 else f'{name} ({json.dumps(self.item)} {name}){{{max(lo - 1, 0)},{top}}}'
        return f'"[" {body} "]"' if lo else f'"[" ({body})? "]"'
