"""Types compile to grammars no wider than their validators: the one home of the rules (type → grammar rule).

pydantic's JSON Schema says too little for a grammar: ``date`` is ``format: date`` (llguidance's date
admits ``0000-01-01`` and ``2025-02-29``, which pydantic refuses), ``NaiveDatetime`` and ``AwareDatetime``
are both ``format: date-time``, ``UUID4`` is an unknown ``format: uuid4``, a ``Decimal(max_digits=5,
decimal_places=2)`` is any number or any string. :class:`TypedJsonSchema` reads pydantic's *core* schema
as it writes the JSON Schema and puts the grammar rule beside the keyword as ``x-grammar`` (a subschema
the grammar copy uses in place of the one it sits in, :func:`grammar_form`); validation keeps pydantic's
schema and pydantic itself. Raw JSON-Schema dicts keep JSON Schema's meaning for validation; a ``format``
that llguidance reads wider than the format check judging it (:data:`RAW_FORMAT_PATTERNS`: leap days) is
tightened, and dates are generated in years 0001-9999, the years every client's date type reads (a raw
schema usually comes from one: ``responses.parse(text_format=Model)`` sends pydantic's schema, then parses
the answer with pydantic, which refuses year 0000).

>>> import re
>>> bool(re.fullmatch(DATE, "2024-02-29")), bool(re.fullmatch(DATE, "2025-02-29")), bool(re.fullmatch(DATE, "0000-01-01"))
(True, False, False)
>>> typed_json_schema(int)
{'type': 'integer'}
"""
from __future__ import annotations

import datetime as _dt
from typing import Any

from pydantic.json_schema import GenerateJsonSchema

__all__ = ["EMAIL_GRAMMAR_PATTERN", "DATE", "TIME", "DATETIME", "UUID", "RAW_FORMAT_PATTERNS", "TypedJsonSchema", "typed_json_schema",
           "grammar_form", "date_range", "uuid_pattern", "decimal_pattern", "url_pattern"]

#: the key of the grammar rule beside a keyword: the subschema the grammar copy uses instead
GRAMMAR_KEY = "x-grammar"


_YEARS = "(?:000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})"  # 0001-9999
_M31 = "(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
_M30 = "(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
_FEB = "02-(?:0[1-9]|1[0-9]|2[0-8])"
_LEAP = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"  # no 0000


#: a calendar date, years 0001-9999, day of month by month and leap year (pydantic's ``date``)
DATE = f"(?:{_YEARS}-(?:{_M31}|{_M30}|{_FEB})|{_LEAP}-02-29)"
_HMS = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?"
_OFFSET = "(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
#: a time of day, optional offset (pydantic's ``time``: no leap second, at most microseconds)
TIME = f"{_HMS}{_OFFSET}?"
#: date ``T`` time, optional offset (pydantic's ``datetime``)
DATETIME = f"{DATE}T{_HMS}{_OFFSET}?"
_HEX = "[0-9a-fA-F]"
#: any RFC 4122 UUID (pydantic's ``UUID``)
UUID = f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4 = f"{_OCTET}(?:\\.{_OCTET}){{3}}"
_H = f"{_HEX}{{1,4}}"
_IPV6 = "|".join([f"(?:{_H}:){{7}}{_H}", f"(?:{_H}:){{1,7}}:", f"(?:{_H}:){{1,6}}:{_H}",
                  f"(?:{_H}:){{1,5}}(?::{_H}){{1,2}}", f"(?:{_H}:){{1,4}}(?::{_H}){{1,3}}",
                  f"(?:{_H}:){{1,3}}(?::{_H}){{1,4}}", f"(?:{_H}:){{1,2}}(?::{_H}){{1,5}}",
                  f"{_H}:(?::{_H}){{1,6}}", f":(?:(?::{_H}){{1,7}}|:)"])
_IPV6 = f"(?:{_IPV6})"
# a network's host bits must be zero: whole-octet prefixes only (a subset every strict network check takes)
_NET4 = (f"(?:{_IPV4}/32|{_OCTET}(?:\\.{_OCTET}){{2}}\\.0/24|{_OCTET}\\.{_OCTET}\\.0\\.0/16"
         f"|{_OCTET}\\.0\\.0\\.0/8|0\\.0\\.0\\.0/0)")
_NET6 = f"(?:{_IPV6}/128|(?:{_H}:){{1,7}}:/(?:16|32|48|64|80|96|112)|::/0)"
_IFACE4 = f"{_IPV4}(?:/(?:3[0-2]|[12]?[0-9]))?"
_IFACE6 = f"{_IPV6}(?:/(?:12[0-8]|1[01][0-9]|[1-9]?[0-9]))?"
# RFC 3339 Appendix A durations (what both pydantic and the ``duration`` format check take), each part <= 6 digits
_D = "[0-9]{1,6}"
_DUR_TIME = f"T(?:{_D}H(?:{_D}M(?:{_D}S)?)?|{_D}M(?:{_D}S)?|{_D}S)"
_DURATION = f"P(?:(?:{_D}D|{_D}M(?:{_D}D)?|{_D}Y(?:{_D}M(?:{_D}D)?)?)(?:{_DUR_TIME})?|{_DUR_TIME}|{_D}W)"


def uuid_pattern(version: int | None = None) -> str:
    """The UUID rule: any UUID, or one of ``version`` (its version digit and the RFC 4122 variant)."""
    if version is None:
        return UUID
    return f"{_HEX}{{8}}-{_HEX}{{4}}-{version}{_HEX}{{3}}-[89abAB]{_HEX}{{3}}-{_HEX}{{12}}"


#: pydantic formats whose rule is fixed by the format name alone (the others read the core schema)
FORMAT_PATTERNS: dict[str, str] = {
    "date": DATE, "uuid": UUID, **{f"uuid{v}": uuid_pattern(v) for v in range(1, 9)},
    "ipv4": _IPV4, "ipv6": _IPV6, "ipvanyaddress": f"(?:{_IPV4}|{_IPV6})",
    "ipv4network": _NET4, "ipv6network": _NET6, "ipvanynetwork": f"(?:{_NET4}|{_NET6})",
    "ipv4interface": _IFACE4, "ipv6interface": _IFACE6, "ipvanyinterface": f"(?:{_IFACE4}|{_IFACE6})",
    "duration": _DURATION,
}

# The grammar copy's ``format: email``: llguidance's email regex has no length limits, so a model that
# rambles in the local part writes grammar-valid addresses that the RFC 5321 check (local part <= 64
# octets) rejects, and repairs repeat it. This dot-atom form is a subset of what :func:`_is_email` accepts:
# local part <= 32 + 2 * 16 = 64, domain labels <= 31 without "--", at most 5 labels, a letter-led top
# label, or an IPv4 address literal ("a@[127.0.0.1]", dotted decimal without leading zeros).
_EMAIL_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_EMAIL_LABEL = r"[A-Za-z0-9](?:-?[A-Za-z0-9]){0,15}"  # no "--": "ab--c" reads as an IDNA label
_EMAIL_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
EMAIL_GRAMMAR_PATTERN = (rf"^{_EMAIL_ATEXT}{{1,32}}(?:\.{_EMAIL_ATEXT}{{1,15}}){{0,2}}"
                         rf"@(?:(?:{_EMAIL_LABEL}\.){{1,4}}[A-Za-z](?:-?[A-Za-z0-9]){{0,15}}"
                         rf"|\[{_EMAIL_OCTET}(?:\.{_EMAIL_OCTET}){{3}}\])$")

# RFC 6570 level 4 (no reserved operators; literals as jsonschema-rs reads them, apostrophe and non-ASCII
# included) and RFC 6901: llguidance does not know these formats and
# would write any string, which the format check then rejects (a JSONSchemaBench MCP request ended in
# GenerationFailed after four distinct rejected uri-templates such as "completion options")
_PCT = "%[0-9A-Fa-f]{2}"
_VARCHAR = f"(?:[A-Za-z0-9_]|{_PCT})"
_VARSPEC = f"{_VARCHAR}(?:\\.?{_VARCHAR})*(?::[1-9][0-9]{{0,3}}|\\*)?"
_URI_TEMPLATE = (f"^(?:[A-Za-z0-9\\-._~:/?#\\[\\]@!$&'()*+,;=\u00a0-\ud7ff\ue000-\ufdcf\ufdf0-\uffef"
                 f"\U00010000-\U0010fffd]|{_PCT}"
                 f"|\\{{[+#./;?&]?{_VARSPEC}(?:,{_VARSPEC})*\\}})*$")
_JSON_POINTER = "(?:/(?:[^~/]|~[01])*)*"

#: raw JSON-Schema formats llguidance reads wider than the format check that judges them (leap days) or does
#: not know (uri-template, json-pointer): a subset of what the check accepts; RFC 3339's year 0000 validates but
#: is not generated (client date types refuse it); the leap second is kept
RAW_FORMAT_PATTERNS: dict[str, str] = {
    "email": EMAIL_GRAMMAR_PATTERN, "idn-email": EMAIL_GRAMMAR_PATTERN,
    "uri-template": _URI_TEMPLATE, "json-pointer": f"^{_JSON_POINTER}$",
    "relative-json-pointer": f"^(?:0|[1-9][0-9]*)(?:#|{_JSON_POINTER})$",
    "date": f"^{DATE}$",
    "date-time": (f"^{DATE}[Tt](?:[01][0-9]|2[0-3]):[0-5][0-9]:(?:[0-5][0-9]|60)(?:\\.[0-9]{{1,18}})?"
                  f"(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])$"),
}


def _fixed_range(lo: str, hi: str) -> str:
    """A regex for the fixed-width digit strings from ``lo`` to ``hi`` (inclusive, same length)."""
    if len(lo) == 1:
        return lo if lo == hi else f"[{lo}-{hi}]"
    if lo[0] == hi[0]:
        return lo[0] + _fixed_range(lo[1:], hi[1:])
    n = len(lo) - 1
    parts = [lo[0] + _fixed_range(lo[1:], "9" * n)]
    if int(hi[0]) - int(lo[0]) > 1:
        a, b = int(lo[0]) + 1, int(hi[0]) - 1
        parts.append(f"{a if a == b else f'[{a}-{b}]'}[0-9]{{{n}}}")
    parts.append(hi[0] + _fixed_range("0" * n, hi[1:]))
    return "(?:" + "|".join(parts) + ")"


def _days(year: int, month: int) -> int:
    nxt = _dt.date(year + month // 12, month % 12 + 1, 1)
    return (nxt - _dt.timedelta(days=1)).day


def date_range(lo: _dt.date | None, hi: _dt.date | None) -> str:
    """A regex for the ISO dates from ``lo`` to ``hi`` (inclusive; None: 0001-01-01 / 9999-12-31). Years
    strictly inside the range take any valid date but 29 February (a subset)."""
    lo = lo or _dt.date(1, 1, 1)
    hi = hi or _dt.date(9999, 12, 31)
    if lo > hi:
        raise ValueError("empty date range")
    alts: list[str] = []

    def month_days(y: int, m: int, d0: int, d1: int) -> None:
        if d0 <= d1:
            alts.append(f"{y:04d}-{m:02d}-{_fixed_range(f'{d0:02d}', f'{d1:02d}')}")

    def year_part(y: int, a: _dt.date, b: _dt.date) -> None:  # a, b inside year y
        for m in range(a.month, b.month + 1):
            month_days(y, m, a.day if m == a.month else 1, b.day if m == b.month else _days(y, m))

    if lo.year == hi.year:
        year_part(lo.year, lo, hi)
    else:
        year_part(lo.year, lo, _dt.date(lo.year, 12, 31))
        if hi.year - lo.year > 1:
            mid = _fixed_range(f"{lo.year + 1:04d}", f"{hi.year - 1:04d}")
            alts.append(f"{mid}-(?:{_M31}|{_M30}|{_FEB})")
        year_part(hi.year, _dt.date(hi.year, 1, 1), hi)
    return "(?:" + "|".join(alts) + ")"


def decimal_pattern(max_digits: int | None, places: int | None) -> str:
    """A decimal string with at most ``max_digits`` digits, at most ``places`` of them after the point
    (pydantic's ``Decimal`` constraints; ``0`` before the point counts as a digit: a subset).

    >>> import re
    >>> [bool(re.fullmatch(decimal_pattern(5, 2), x)) for x in ("123.45", "1234.5", "1.234", "-0.5")]
    [True, False, False, True]
    """
    total = max_digits if max_digits is not None else 34
    frac = places if places is not None else total
    whole_max = total - places if places is not None else total
    if whole_max <= 0:
        return "-?0" + (f"(?:\\.[0-9]{{1,{min(frac, total)}}})?" if total > 0 else "")
    alts = []
    for k in range(1, whole_max + 1):
        f = min(frac, total - k)
        alts.append(("[0-9]" if k == 1 else f"[1-9][0-9]{{{k - 1}}}") + (f"(?:\\.[0-9]{{1,{f}}})?" if f > 0 else ""))
    return "-?(?:" + "|".join(alts) + ")"


_HOST = "(?:[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?\\.){1,4}[a-z](?:[a-z0-9-]{0,14}[a-z0-9])?"
_PCHAR = "(?:%[0-9A-Fa-f]{2}|[A-Za-z0-9._~!$&'()*+,;=:@-])"


def url_pattern(schemes: list[str] | None) -> str:
    """A URL with one of ``schemes`` (None: a plain lowercase scheme), a DNS host, an optional port, path,
    query and fragment, every character one RFC 3986 allows unescaped there."""
    scheme = "(?:" + "|".join(sorted(schemes)) + ")" if schemes else "[a-z][a-z0-9+.-]{0,15}"
    return (f"{scheme}://{_HOST}(?::[1-9][0-9]{{0,3}})?(?:/{_PCHAR}*)*"
            f"(?:\\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?")


def _rule(schema: dict, pattern: str, **extra: Any) -> dict:
    rule = {"type": "string", "pattern": f"^{pattern}$"}
    for k in ("minLength", "maxLength"):
        if k in schema:
            rule[k] = schema[k]
    return {**schema, **extra, GRAMMAR_KEY: {**rule}}


#: a set of at most this many enum members compiles to the enum of its sorted subsets (2**n arrays)
MAX_SET_MEMBERS = 8


def set_members(items: Any) -> list | None:
    """The JSON values of a set's items when they are a small enum or ``Literal`` (else None)."""
    kind = items.get("type") if isinstance(items, dict) else None
    vals = [getattr(m, "value", m) for m in items.get("members", ())] if kind == "enum" else \
        list(items.get("expected", ())) if kind == "literal" else []
    ok = vals and len(vals) <= MAX_SET_MEMBERS and all(type(v) in (int, str) for v in vals)
    return vals if ok and len(set(vals)) == len(vals) else None


def _set_rule(out: dict, schema: Any) -> dict:
    """A ``set`` of a small enum: the grammar takes its members once each, in declaration order (any set
    can be written so), where ``uniqueItems`` alone is left to validation and repair. Without it a model
    repeating a member wrote ``[6,5,4,4,4,...]`` until the budget ran out.

    >>> from enum import IntEnum
    >>> class D(IntEnum):
    ...     MON = 1
    ...     TUE = 2
    >>> typed_json_schema(set[D])["x-grammar"]
    {'enum': [[], [1], [2], [1, 2]]}
    """
    from itertools import combinations

    vals = set_members(schema.get("items_schema"))
    if vals is None:
        return out
    lo, hi = schema.get("min_length") or 0, schema.get("max_length")
    hi = len(vals) if hi is None else min(hi, len(vals))
    subsets = [list(c) for n in range(lo, hi + 1) for c in combinations(vals, n)]
    return {**out, GRAMMAR_KEY: {"enum": subsets}} if subsets else out


class TypedJsonSchema(GenerateJsonSchema):
    """pydantic's JSON Schema, each type whose rule a grammar can express carrying it as ``x-grammar``
    (``format`` s pydantic judges differently are left out: ``date-time`` requires an offset that
    ``datetime`` and ``time`` do not, ``NaiveDatetime`` forbids)."""

    def date_schema(self, schema: Any) -> Any:
        out = super().date_schema(schema)
        op = schema.get("now_op")
        if op is None:
            return _rule(out, DATE)
        today = _dt.date.today()  # a day of slack each side: pydantic reads "today" in local time
        lo, hi = (None, today - _dt.timedelta(days=2)) if op == "past" else (today + _dt.timedelta(days=2), None)
        return _rule(out, date_range(lo, hi))

    def datetime_schema(self, schema: Any) -> Any:
        out = {k: v for k, v in super().datetime_schema(schema).items() if k != "format"}
        tz = schema.get("tz_constraint")
        offset = "" if tz == "naive" else _OFFSET if tz is not None else f"{_OFFSET}?"
        op = schema.get("now_op")
        day = DATE
        if op is not None:
            today = _dt.date.today()
            day = date_range(None, today - _dt.timedelta(days=2)) if op == "past" else \
                date_range(today + _dt.timedelta(days=2), None)
        return _rule(out, f"{day}T{_HMS}{offset}")

    def time_schema(self, schema: Any) -> Any:
        out = {k: v for k, v in super().time_schema(schema).items() if k != "format"}
        tz = schema.get("tz_constraint")
        return _rule(out, _HMS if tz == "naive" else f"{_HMS}{_OFFSET}" if tz is not None else TIME)

    def uuid_schema(self, schema: Any) -> Any:
        return _rule(super().uuid_schema(schema), uuid_pattern(schema.get("version")))

    def decimal_schema(self, schema: Any) -> Any:
        out = super().decimal_schema(schema)
        md, dp = schema.get("max_digits"), schema.get("decimal_places")
        if md is None and dp is None or any(k in schema for k in ("multiple_of", "gt", "ge", "lt", "le")):
            text = {"type": "string", "pattern": "^-?(?:0|[1-9][0-9]{0,16})(?:\\.[0-9]{1,17})?$"}
            if any(k in schema for k in ("multiple_of", "gt", "ge", "lt", "le")):
                return out  # bounds on a number-or-string: validation judges the string branch
            return {**out, GRAMMAR_KEY: {"anyOf": [{"type": "number"}, text]}}
        whole = (md - (dp or 0)) if md is not None else None
        branches: list[dict] = [{"type": "string", "pattern": f"^{decimal_pattern(md, dp)}$"}]
        if whole is not None and 1 <= whole <= 15:  # wider bounds are left out of the grammar copy
            branches.insert(0, {"type": "integer", "minimum": -(10 ** whole - 1), "maximum": 10 ** whole - 1})
        return {**out, GRAMMAR_KEY: {"anyOf": branches}}

    def url_schema(self, schema: Any) -> Any:
        out = super().url_schema(schema)
        if schema.get("host_required") is False:
            return out
        return _rule(out, url_pattern(schema.get("allowed_schemes")))

    def set_schema(self, schema: Any) -> Any:
        return _set_rule(super().set_schema(schema), schema)

    def frozenset_schema(self, schema: Any) -> Any:
        return _set_rule(super().frozenset_schema(schema), schema)

    def generate_inner(self, schema: Any) -> Any:
        out = super().generate_inner(schema)
        if isinstance(out, dict) and GRAMMAR_KEY not in out and out.get("type") == "string":
            pat = FORMAT_PATTERNS.get(out.get("format"))  # types pydantic describes by a format name only
            if pat is not None:
                return _rule(out, pat)
        return out


def typed_json_schema(spec: Any) -> dict:
    """The JSON Schema of a pydantic model or python type, with its grammar rules (:class:`TypedJsonSchema`)."""
    from pydantic import BaseModel, TypeAdapter
    if isinstance(spec, type) and issubclass(spec, BaseModel):
        return spec.model_json_schema(schema_generator=TypedJsonSchema)
    ad = spec if isinstance(spec, TypeAdapter) else TypeAdapter(spec)
    return ad.json_schema(schema_generator=TypedJsonSchema)


def grammar_form(s: dict) -> None:
    """Rewrite the grammar-copy subschema ``s`` in place: its ``x-grammar`` rule in place of the keyword it
    sits beside; a raw ``format`` llguidance reads too wide as its pattern (unless ``s`` has its own)."""
    rule = s.pop(GRAMMAR_KEY, None)
    if isinstance(rule, dict):
        keep = {k: s[k] for k in ("title", "description") if k in s}
        s.clear()
        s.update(rule, **keep)
        return
    fmt = s.get("format")
    if isinstance(fmt, str) and fmt in RAW_FORMAT_PATTERNS and "pattern" not in s:
        s.pop("format")  # still validated (format assertion)
        s["pattern"] = RAW_FORMAT_PATTERNS[fmt]
