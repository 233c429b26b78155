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

from .safety import MAX_SCHEMA_DEPTH, WIDE, clip, has_wide_number, is_wide_number

__all__ = ["WIDE", "EXTREME_BOUND", "drop_extreme_bounds", "decimal_step_copy", "MAX_ENUMERATED_MULTIPLES", "is_wide_number", "has_wide_number", "screen_lark_json", "regex_dialect_error",
           "lone_surrogate", "is_ecma_regex"]

#: number bounds this large (or smaller than 1e-15 but not 0) are left out of the grammar copy: llguidance's
#: range regexes fail near the 64-bit limits ("Failed to generate regex for integer range") and on long
#: decimals (``minimum: 1e-308`` is a regex parse error); validation checks them exactly
EXTREME_BOUND = float(2 ** 62)
_BOUND_KWS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def drop_extreme_bounds(s: dict, dropped: list[str] | None = None) -> None:
    """Remove extreme number bounds (:data:`EXTREME_BOUND`) from a grammar-copy subschema ``s``; the
    grammar becomes a superset, and the removed keywords are named in ``dropped``."""
    for kw in _BOUND_KWS:
        v = s.get(kw)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        try:
            a = abs(float(v))
        except OverflowError:
            a = math.inf
        if a >= EXTREME_BOUND or (isinstance(v, float) and 0 < a < 1e-15):
            s.pop(kw)
            if dropped is not None:
                dropped.append(kw)


#: a decimal ``multipleOf`` between bounds with at most this many multiples compiles to their ``enum``
MAX_ENUMERATED_MULTIPLES = 256


def decimal_step_copy(s: dict, dropped: list[str] | None = None) -> None:
    """The grammar copy of a subschema with a decimal ``multipleOf`` (``0.1``): llguidance compiles it
    wrongly next to bounds (``0.1`` in ``[0.25, 0.35]`` accepted nothing). With both bounds and at most
    :data:`MAX_ENUMERATED_MULTIPLES` multiples in range, the grammar is exactly their ``enum`` (``[0.3]``);
    otherwise the step and the non-integer bounds are left to validation (exact, in Decimal)."""
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
    if dropped is not None:
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


_ECMA = None


def is_ecma_regex(pattern: Any, default: bool = True) -> bool:
    """Whether ``pattern`` is an ECMA-262 regular expression (JSON Schema's ``format: "regex"``), as
    jsonschema-rs checks it; without jsonschema-rs, Python's ``re`` decides (``default`` on doubt)."""
    global _ECMA
    if not isinstance(pattern, str):
        return True
    try:
        import jsonschema_rs
    except ImportError:  # pragma: no cover - jsonschema-rs is in the lock
        try:
            re.compile(pattern)
            return True
        except Exception:  # noqa: BLE001
            return False
    if _ECMA is None:
        _ECMA = jsonschema_rs.validator_for({"format": "regex"}, validate_formats=True)
    try:
        return bool(_ECMA.is_valid(pattern))
    except Exception:  # noqa: BLE001
        return default
