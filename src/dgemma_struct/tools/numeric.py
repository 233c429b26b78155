r"""Regexes for JSON numbers within the JSON Schema bounds ``minimum`` / ``maximum`` /
``exclusiveMinimum`` / ``exclusiveMaximum`` (used by the tool-call grammar; ``multipleOf`` is left
to validation).

* ``integer``: exact. :func:`integer_regex` accepts the canonical decimal spellings (``0`` or no
  leading zero, ``-0`` too where 0 is in range) of exactly the integers in range (Python ints: no
  float rounding, however long the bound).
* ``number``: exact over exponent-free decimals. :func:`number_regex` accepts ``I[.F]`` (and ``-``)
  exactly when the decimal value is in range; trailing zeros are fine (``2.2500``). Exponent forms
  (``1e3``) are allowed for the positive numbers only when all of them are in range (no maximum, a
  minimum <= 0), likewise for the negatives; elsewhere (and for zero) a value is written without an
  exponent, which every finite decimal has.

Bounds are read by :func:`schema_bounds` the way the validator compares: a float bound is the
value its shortest repr spells (floats compared with floats), widened to the float's exact binary
value where an integer (compared exactly) lies in between; so the language is never narrower than
what validation accepts. Bounds past ``1e40`` are dropped and ones with more than 30 decimals are
rounded outward: a superset, left to validation.

>>> import re
>>> [s for s in ["2", "3", "17", "18", "-5"] if re.fullmatch(integer_regex(3, 17), s)]
['3', '17']
>>> from decimal import Decimal
>>> [s for s in ["2.2", "2.25", "2.2500", "2.26"] if re.fullmatch(number_regex(None, (Decimal("2.25"), False)), s)]
['2.2', '2.25', '2.2500']
"""
from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, localcontext
from typing import Any, Mapping, Optional, Tuple

__all__ = ["Bound", "integer_regex", "number_regex", "schema_bounds", "bounded_number_regex"]

#: a bound: (value, strict); strict is True for ``exclusiveMinimum`` / ``exclusiveMaximum``
Bound = Tuple[Decimal, bool]
_Tail = Optional[Tuple[str, bool]]  # a bound on a fraction's digits: (digits without trailing zeros, strict)

_MAX_INT_DIGITS = 40  # bounds at or past 10**40 in size are dropped (a superset)
_MAX_FRAC_DIGITS = 30  # bounds with more decimals are rounded outward (a superset)
_EXP = "([eE][+-]?[0-9]+)?"


def _cls(lo: int, hi: int) -> str:
    """A character class for the digits ``lo..hi``."""
    return str(lo) if lo == hi else f"[{lo}-{hi}]"


def _any(n: int) -> str:
    return "" if n == 0 else "[0-9]" if n == 1 else f"[0-9]{{{n}}}"


def _alt(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


def _fixed_ge(s: str) -> str:
    """Digit strings of ``len(s)`` digits that are >= ``s``."""
    if not s.strip("0"):
        return _any(len(s))
    d, rest = int(s[0]), s[1:]
    parts = [s[0] + _fixed_ge(rest)]
    if d < 9:
        parts.append(_cls(d + 1, 9) + _any(len(rest)))
    return _alt(parts)


def _fixed_le(s: str) -> str:
    """Digit strings of ``len(s)`` digits that are <= ``s``."""
    if not s.strip("9"):
        return _any(len(s))
    d, rest = int(s[0]), s[1:]
    parts = [s[0] + _fixed_le(rest)]
    if d > 0:
        parts.insert(0, _cls(0, d - 1) + _any(len(rest)))
    return _alt(parts)


def _fixed_range(a: str, b: str) -> str:
    """Digit strings of one length between ``a`` and ``b`` (same length, ``a <= b``)."""
    p = 0
    while p < len(a) and a[p] == b[p]:
        p += 1
    if p == len(a):
        return a
    a0, b0, ra, rb = int(a[p]), int(b[p]), a[p + 1:], b[p + 1:]
    parts = []
    lo_d = a0 if not ra.strip("0") else a0 + 1
    hi_d = b0 if not rb.strip("9") else b0 - 1
    if lo_d != a0:
        parts.append(a[p] + _fixed_ge(ra))
    if lo_d <= hi_d:
        parts.append(_cls(lo_d, hi_d) + _any(len(ra)))
    if hi_d != b0:
        parts.append(b[p] + _fixed_le(rb))
    return a[:p] + _alt(parts)


def _uint_range(lo: int, hi: int | None) -> str | None:
    """Canonical decimal spellings (no leading zero) of the integers in ``[lo, hi]`` (``lo >= 0``;
    ``hi=None``: unbounded); None when empty."""
    if hi is not None and hi < lo:
        return None
    la = len(str(lo))
    lb = len(str(hi)) if hi is not None else None
    parts = [_fixed_range(str(lo), str(hi) if lb == la else "9" * la)]
    if lb is None:
        parts.append(f"[1-9][0-9]{{{la},}}")
    elif lb > la:
        if lb > la + 1:
            parts.append(f"[1-9][0-9]{{{la},{lb - 2}}}" if lb - 2 > la else f"[1-9]{_any(la)}")
        parts.append(_fixed_range("1" + "0" * (lb - 1), str(hi)))
    return "|".join(parts)


def integer_regex(lo: int | None, hi: int | None) -> str | None:
    """A regex (Rust and Python syntax) for the JSON integers in ``[lo, hi]`` (None: unbounded);
    None when the range is empty."""
    parts = []
    if (lo is None or lo <= 0) and (hi is None or hi >= 0):
        parts.append("-?0")
    pos = _uint_range(max(lo, 1) if lo is not None else 1, hi)
    if pos is not None:
        parts.append(pos)
    neg = _uint_range(max(-hi, 1) if hi is not None else 1, -lo if lo is not None else None)
    if neg is not None:
        parts.append(f"-({neg})")
    return "|".join(f"({p})" for p in parts) if parts else None


def _tail(lo: _Tail, hi: _Tail) -> tuple[bool, str | None]:
    """Digit strings ``T`` (the fraction's digits) with ``0.T`` between the bounds: (whether the
    empty ``T`` is in, a regex for the non-empty ones or None)."""
    if lo == ("", False):
        lo = None
    if hi is not None and hi[0] == "":  # 0.T <= 0 (or < 0)
        return (False, None) if hi[1] or lo is not None else (True, "0+")
    if hi is None:
        if lo is None:
            return True, "[0-9]+"
        if lo == ("", True):
            return False, "[0-9]*[1-9][0-9]*"
    groups: dict[tuple[_Tail, _Tail], list[int]] = {}
    for c in range(10):
        if lo is None or (lo[0] == "" and c > 0) or (lo[0] and c > int(lo[0][0])):
            lo2: _Tail = None
        elif lo[0] == "":
            lo2 = lo
        elif c == int(lo[0][0]):
            lo2 = (lo[0][1:], lo[1])
        else:
            continue
        if hi is None or c < int(hi[0][0]):
            hi2: _Tail = None
        elif c == int(hi[0][0]):
            hi2 = (hi[0][1:], hi[1])
        else:
            continue
        groups.setdefault((lo2, hi2), []).append(c)
    parts = []
    for (lo2, hi2), digits in groups.items():
        empty, rest = _tail(lo2, hi2)
        if not empty and rest is None:
            continue
        head = _cls(digits[0], digits[-1]) if digits[-1] - digits[0] == len(digits) - 1 else \
            "[" + "".join(map(str, digits)) + "]"
        parts.append(head + ("" if rest is None else f"({rest})" + ("?" if empty else "")))
    return lo is None, ("|".join(parts) if parts else None)


def _split(d: Decimal) -> tuple[int, str]:
    """A non-negative decimal -> (integer part, fraction digits without trailing zeros)."""
    i, _, f = format(d, "f").partition(".")
    return int(i), f.rstrip("0")


def _frac(t: tuple[bool, str | None]) -> str | None:
    empty, rest = t
    if rest is None:
        return "" if empty else None
    return f"(\\.({rest}))" + ("?" if empty else "")


def _magnitude(lo: Bound, hi: Bound | None) -> str | None:
    """Exponent-free spellings ``I[.F]`` of the decimals in the range (``lo`` >= 0; ``hi=None``:
    unbounded); None when empty."""
    li, lf = _split(lo[0])
    parts = []
    if hi is None:
        head = _frac(_tail((lf, lo[1]), None))
        if head is not None:
            parts.append(str(li) + head)
        parts.append(f"({_uint_range(li + 1, None)})(\\.[0-9]+)?")
    else:
        hi_i, hf = _split(hi[0])
        if li == hi_i:
            head = _frac(_tail((lf, lo[1]), (hf, hi[1])))
            if head is not None:
                parts.append(str(li) + head)
        elif li < hi_i:
            head, tail = _frac(_tail((lf, lo[1]), None)), _frac(_tail(None, (hf, hi[1])))
            if head is not None:
                parts.append(str(li) + head)
            mid = _uint_range(li + 1, hi_i - 1)
            if mid is not None:
                parts.append(f"({mid})(\\.[0-9]+)?")
            if tail is not None:
                parts.append(str(hi_i) + tail)
    return "|".join(parts) if parts else None


def number_regex(lo: Bound | None, hi: Bound | None) -> str | None:
    """A regex (Rust and Python syntax) for JSON numbers in the range (None: unbounded side): exact
    over exponent-free spellings; None when the range is empty."""
    zero = Decimal(0)
    parts = []
    if (lo is None or lo[0] < zero or (lo[0] == zero and not lo[1])) and \
            (hi is None or hi[0] > zero or (hi[0] == zero and not hi[1])):
        parts.append("-?0(\\.0+)?")
    if hi is None or hi[0] > zero:  # v > 0: its magnitude is v
        pos_lo = lo if lo is not None and lo[0] > zero else (zero, True)
        pos = _magnitude(pos_lo, hi)
        if pos is not None:
            unbounded = pos_lo == (zero, True) and hi is None
            parts.append(f"({pos}){_EXP}" if unbounded else pos)
    if lo is None or lo[0] < zero:  # v < 0: its magnitude is -v
        neg_lo = (hi[0].copy_negate(), hi[1]) if hi is not None and hi[0] < zero else (zero, True)
        neg_hi = (lo[0].copy_negate(), lo[1]) if lo is not None else None
        neg = _magnitude(neg_lo, neg_hi)
        if neg is not None:
            parts.append(f"-({neg})" + (_EXP if neg_lo == (zero, True) and neg_hi is None else ""))
    return "|".join(f"({p})" for p in parts) if parts else None


def _tighter(a: Bound | None, b: Bound | None, lower: bool) -> Bound | None:
    if a is None or b is None:
        return a if b is None else b
    if a[0] != b[0]:
        return a if (a[0] > b[0]) == lower else b
    return a if a[1] else b


def _as_decimal(v: Any, integer: bool, lower: bool) -> Decimal | None:
    """A schema bound as the decimal the validator compares against (see the module docstring);
    None for a non-number, a non-finite float or a bound past 1e40 (dropped: a superset)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return None
    exact = Decimal(v)
    d = exact
    if isinstance(v, float) and not integer:
        d = Decimal(repr(v))
        # integers are compared with the float's exact value: widen where one lies in between
        if (lower and exact < d and math.ceil(exact) < d) or (not lower and exact > d and math.floor(exact) > d):
            d = exact
    if abs(d) >= Decimal(10) ** _MAX_INT_DIGITS:
        return None
    q = Decimal(1).scaleb(-_MAX_FRAC_DIGITS)
    if not integer and d != d.quantize(q, rounding=ROUND_FLOOR):  # integer bounds are rounded to ints later
        d = d.quantize(q, rounding=ROUND_FLOOR if lower else ROUND_CEILING)
    return d


def schema_bounds(s: Mapping[str, Any], integer: bool) -> tuple[Bound | None, Bound | None]:
    """(lower, upper) bounds of a schema's numeric keywords (the tighter of ``minimum`` and
    ``exclusiveMinimum``, likewise for the maximum); draft-4 boolean ``exclusive*`` is ignored
    (the bound is read inclusive: a superset)."""
    with localcontext() as ctx:
        ctx.prec = 200
        bounds = []
        for inc, exc, lower in (("minimum", "exclusiveMinimum", True), ("maximum", "exclusiveMaximum", False)):
            a, b = _as_decimal(s.get(inc), integer, lower), _as_decimal(s.get(exc), integer, lower)
            bounds.append(_tighter(None if a is None else (a, False), None if b is None else (b, True), lower))
        return bounds[0], bounds[1]


def bounded_number_regex(s: Mapping[str, Any], integer: bool) -> str | None:
    """The regex for an ``integer`` / ``number`` schema's bounds, or None when it has none (or none
    the range can use: an empty range is left to validation)."""
    lo, hi = schema_bounds(s, integer)
    if lo is None and hi is None:
        return None
    with localcontext() as ctx:
        ctx.prec = 200
        if integer:
            ilo = None if lo is None else (math.floor(lo[0]) + 1 if lo[1] else math.ceil(lo[0]))
            ihi = None if hi is None else (math.ceil(hi[0]) - 1 if hi[1] else math.floor(hi[0]))
            return integer_regex(ilo, ihi)
        return number_regex(lo, hi)
