"""Runaway guards for the grammar copy of a JSON Schema: numbers no longer than their type holds, and
per-field length budgets. Each narrows the grammar only (validation keeps the schema as written) and
never makes a satisfiable schema unsatisfiable: a bound is added only where a value of the
schema's own rule fits under it.

- **Numbers** (``bounded_numbers``): an ``integer`` without a bound on a side gets ``±(2**53 - 1)``
  there (JSON's interoperable integers, I-JSON; inside int64, and exact as the double llguidance reads a
  bound as); a ``number`` gets ``±1e16`` (no exponent) and at most 17 significant digits: the grammar
  copy is an ``anyOf`` of magnitude bands, ``|x| < 10**k`` with at most ``min(10, 17 - k)`` digits after
  the point (a ``multipleOf``; llguidance reads steps down to ``1e-10`` exactly), ``k`` = 7, 10, 13, 16
  (so ``|x| < 1e7`` takes 10 decimals, ``< 1e10`` 7, ``< 1e13`` 4, ``< 1e16`` 1), each band cut to the
  schema's own integer bounds; a schema bound beyond ``1e16`` asks for more and keeps plain bounds. A number with non-integer bounds keeps the plain bounds
  (llguidance's decimal range regexes misjudge a step beside them).
- **Budgets** (``field_budget``): a plain string (no ``pattern`` / ``format`` / ``enum`` / ``const`` /
  ``maxLength``) gets ``maxLength = max(minLength, 16, ceil(3 * max_new_tokens / fields))``, ``fields``
  the number of property and item leaves of the schema, a leaf of a recursive definition counted
  :data:`RECURSIVE_WEIGHT` times (a token holds ~3 characters of text, so ``fields`` such strings fill
  the budget together but one alone cannot).
- **Extensions**: ``x-max-chars: N`` on a string is a ``maxLength`` for the grammar only; ``x-max-tokens:
  N`` bounds the string to ``N`` characters (a character never takes less than a token's share, so
  ``N`` tokens of text are at most ``N`` characters only for one-character tokens: a conservative bound
  the JSON grammar path can express; llguidance's per-lexeme ``max_tokens`` exists in Lark only).

>>> g = {"type": "object", "properties": {"a": {"type": "string"}, "n": {"type": "integer"}}}
>>> bound_fields(g, numbers=True, budget=64)
>>> g["properties"]["a"]["maxLength"], g["properties"]["n"]["maximum"]
(96, 9007199254740991)
"""
from __future__ import annotations

import json
import math
from typing import Any

from .schema_checks import is_number, iter_subschemas

__all__ = ["INT_BOUND", "FLOAT_BOUND", "SIGNIFICANT_DIGITS", "field_chars", "bound_fields", "EXTENSIONS",
           "engine_reads_step", "digit_bands"]

#: the widest unbounded integer the grammar writes: 2**53 - 1 (llguidance reads bounds as doubles, exact
#: up to 2**53; its range regexes fail near +-2**63)
INT_BOUND = 2 ** 53 - 1
#: the widest unbounded float: 17 significant digits before the point
FLOAT_BOUND = 1e16
#: the most significant digits a bounded ``number`` literal has (a double holds 17)
SIGNIFICANT_DIGITS = 17
#: the finest step llguidance reads exactly (``1e-11`` is "too many digits")
_FINEST = 10
#: orders of magnitude per band: each band costs the compile ~0.3 ms per field (10 bands made a
#: 4-float model compile 6x slower); between band edges fewer digits than 17 are allowed
_BAND_STEP = 3
#: the length extensions a schema may carry (grammar only)
EXTENSIONS = ("x-max-chars", "x-max-tokens")
_FIXED = ("pattern", "format", "enum", "const", "maxLength", "contentEncoding", "contentMediaType")
_COMBINED = ("anyOf", "oneOf", "allOf", "not", "$ref", "if", "then", "else")
_LOW = ("minimum", "exclusiveMinimum")
_HIGH = ("maximum", "exclusiveMaximum")


def field_chars(budget: int, fields: int) -> int:
    """The default ``maxLength`` of a plain string for a request of ``budget`` tokens over ``fields`` leaves.

    >>> field_chars(128, 3), field_chars(16, 20)
    (128, 16)
    """
    return max(16, math.ceil(3 * budget / max(1, fields)))


#: how many times a leaf of a recursive definition counts (a tree repeats it; a category tree's one
#: ``name`` leaf had the whole budget's characters and a model filled 300 of them)
RECURSIVE_WEIGHT = 4


def _recursive_defs(g: dict) -> set[str]:
    out = set()
    for key in ("$defs", "definitions"):
        defs = g.get(key)
        if isinstance(defs, dict):
            out |= {(key, k) for k, d in defs.items() if f'"#/{key}/{k}"' in json.dumps(d)}
    return out


def _leaves(g: Any) -> int:
    n = 0
    rec = _recursive_defs(g)
    for path, s in iter_subschemas(g):
        t = s.get("type")
        if isinstance(t, str) and t not in ("object", "array"):
            n += RECURSIVE_WEIGHT if rec and tuple(path[:2]) in rec else 1
    return max(1, n)


def engine_reads_step(step: Any) -> bool:
    """Whether llguidance enforces the ``multipleOf`` ``step`` exactly. It scales the double by 10 until
    it has no fraction, into a u32 (``1e-11`` or ``0.123456789`` drift and fail), and a step of two or
    more digits over two or more places refuses its multiples' shorter spellings (``0.25``: ``0.5``;
    measured on llguidance 1.9: single-digit steps and one-place steps are exact).

    >>> [engine_reads_step(x) for x in (0.5, 0.01, 1e-10, 1e-11, 0.123456789, 2.5, 12.5, 0.05, 0.25)]
    [True, True, True, False, False, True, True, True, False]
    """
    from decimal import Decimal

    if not is_number(step) or not math.isfinite(step) or step <= 0:
        return False
    v, e = float(step), 0
    while v % 1 != 0 and e < 40:  # the engine's loop, in the same double arithmetic
        v, e = v * 10, e + 1
    exact = v % 1 == 0 and v <= 2 ** 32 - 1 and Decimal(int(v)).scaleb(-e) == Decimal(repr(step))
    return exact and (e <= 1 or int(v) < 10)


def _tighter_low(a: tuple[float, bool], b: tuple[float, bool]) -> tuple[float, bool]:
    return max(a, b, key=lambda v: (v[0], v[1]))  # same value: the exclusive one is tighter


def _tighter_high(a: tuple[float, bool], b: tuple[float, bool]) -> tuple[float, bool]:
    return min(a, b, key=lambda v: (v[0], not v[1]))


def digit_bands(low: tuple[float, bool] | None, high: tuple[float, bool] | None) -> list[dict]:
    """The magnitude bands of a bounded ``number`` between ``low`` and ``high`` (``(value, exclusive)``,
    integers; None: unbounded): at most :data:`SIGNIFICANT_DIGITS` significant digits, no band past the
    first that holds the whole range.

    >>> [(b["exclusiveMaximum"], b["multipleOf"]) for b in digit_bands((0, True), None)][:2]
    [(10000000, 1e-10), (10000000000, 1e-07)]
    >>> digit_bands((0, True), (100, False))
    [{'type': 'number', 'multipleOf': 1e-10, 'exclusiveMinimum': 0, 'maximum': 100}]
    >>> [b["multipleOf"] for b in digit_bands(None, None)]
    [1e-10, 1e-07, 0.0001, 0.1]
    """
    bands = []
    for k in range(SIGNIFICANT_DIGITS - _FINEST, SIGNIFICANT_DIGITS, _BAND_STEP):
        lo = (-10 ** k, True) if low is None else _tighter_low(low, (-10 ** k, True))
        hi = (10 ** k, True) if high is None else _tighter_high(high, (10 ** k, True))
        if lo[0] > hi[0] or lo[0] == hi[0] and (lo[1] or hi[1]):
            continue  # the range lies beyond this band (a wider one holds it)
        b: dict[str, Any] = {"type": "number", "multipleOf": float(f"1e-{min(_FINEST, SIGNIFICANT_DIGITS - k)}")}
        b["exclusiveMinimum" if lo[1] else "minimum"] = lo[0]
        b["exclusiveMaximum" if hi[1] else "maximum"] = hi[0]
        bands.append(b)
        if lo == low and hi == high:
            break  # the whole range fits: wider bands only allow fewer digits
    return bands


def _side(s: dict, keys: tuple[str, str], tighter: Any) -> tuple[float, bool] | None:
    out = None
    for k in keys:
        if is_number(s.get(k)):
            v = (s[k], k.startswith("exclusive"))
            out = v if out is None else tighter(out, v)
    return out


def _bound_number(s: dict, t: str) -> None:
    if any(k in s for k in ("enum", "const", "multipleOf")):
        return
    top = INT_BOUND if t == "integer" else FLOAT_BOUND
    lows = [s[k] for k in _LOW if is_number(s.get(k))]
    highs = [s[k] for k in _HIGH if is_number(s.get(k))]
    # the bands stop at 1e16: a schema bound beyond it asks for more, and keeps plain bounds
    if t == "number" and all(float(v).is_integer() and abs(v) <= FLOAT_BOUND for v in lows + highs) \
            and not any(k in s for k in _COMBINED):
        low, high = _side(s, _LOW, _tighter_low), _side(s, _HIGH, _tighter_high)
        bands = digit_bands(low, high)
        if bands:
            for k in _LOW + _HIGH + ("type",):
                s.pop(k, None)
            if len(bands) == 1:
                s.update(bands[0])
            else:
                s["anyOf"] = bands
            return
    if not lows and all(h > -top for h in highs):
        s["minimum"] = -top
    if not highs and all(lo < top for lo in lows):
        s["maximum"] = top


def bound_fields(g: Any, *, numbers: bool = False, budget: int | None = None) -> None:
    """Add the runaway guards to the grammar copy ``g`` in place (module docstring): number bounds when
    ``numbers``, string budgets when ``budget`` (the request's ``max_new_tokens``) is given, and the
    ``x-max-chars`` / ``x-max-tokens`` extensions always (they leave the copy as ``maxLength``)."""
    if not isinstance(g, dict):
        return
    chars = field_chars(budget, _leaves(g)) if budget else None
    for _, s in iter_subschemas(g):
        t = s.get("type")
        ext = [s.pop(k) for k in EXTENSIONS if k in s]
        if t == "string":
            caps = [int(x) for x in ext if is_number(x) and x >= 0]
            lo = s.get("minLength") if is_number(s.get("minLength")) else 0
            if caps:
                s["maxLength"] = max(lo, min(caps + ([s["maxLength"]] if is_number(s.get("maxLength")) else [])))
            elif chars is not None and not any(k in s for k in _FIXED):
                s["maxLength"] = max(int(lo), chars)
        elif numbers and t in ("integer", "number"):
            _bound_number(s, t)
