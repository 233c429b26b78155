"""Runaway guards for the grammar copy of a JSON Schema: numbers no longer than their type holds, and
per-field length budgets. Each narrows the grammar only (validation keeps the schema as written) and
never makes a satisfiable schema unsatisfiable: a bound is added only where a value of the
schema's own rule fits under it.

- **Numbers** (``bounded_numbers``): an ``integer`` without a bound on a side gets ``±(2**53 - 1)``
  there (JSON's interoperable integers, I-JSON; inside int64, and exact as the double llguidance reads a
  bound as); a ``number`` gets ``±1e16`` (at most 17 digits before the point, no exponent).
- **Budgets** (``field_budget``): a plain string (no ``pattern`` / ``format`` / ``enum`` / ``const`` /
  ``maxLength``) gets ``maxLength = max(minLength, 16, ceil(3 * max_new_tokens / fields))``, ``fields``
  the number of property and item leaves of the schema (a token holds ~3 characters of text, so
  ``fields`` such strings fill the budget together but one alone cannot).
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

import math
from typing import Any

from .schema_checks import is_number, iter_subschemas

__all__ = ["INT_BOUND", "FLOAT_BOUND", "field_chars", "bound_fields", "EXTENSIONS"]

#: the widest unbounded integer the grammar writes: 2**53 - 1 (llguidance reads bounds as doubles, exact
#: up to 2**53; its range regexes fail near +-2**63)
INT_BOUND = 2 ** 53 - 1
#: the widest unbounded float: 17 significant digits before the point
FLOAT_BOUND = 1e16
#: the length extensions a schema may carry (grammar only)
EXTENSIONS = ("x-max-chars", "x-max-tokens")
_FIXED = ("pattern", "format", "enum", "const", "maxLength", "contentEncoding", "contentMediaType")
_LOW = ("minimum", "exclusiveMinimum")
_HIGH = ("maximum", "exclusiveMaximum")


def field_chars(budget: int, fields: int) -> int:
    """The default ``maxLength`` of a plain string for a request of ``budget`` tokens over ``fields`` leaves.

    >>> field_chars(128, 3), field_chars(16, 20)
    (128, 16)
    """
    return max(16, math.ceil(3 * budget / max(1, fields)))


def _leaves(g: Any) -> int:
    n = 0
    for _, s in iter_subschemas(g):
        t = s.get("type")
        if isinstance(t, str) and t not in ("object", "array"):
            n += 1
    return max(1, n)


def _bound_number(s: dict, t: str) -> None:
    if any(k in s for k in ("enum", "const", "multipleOf")):
        return
    top = INT_BOUND if t == "integer" else FLOAT_BOUND
    lows = [s[k] for k in _LOW if is_number(s.get(k))]
    highs = [s[k] for k in _HIGH if is_number(s.get(k))]
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
