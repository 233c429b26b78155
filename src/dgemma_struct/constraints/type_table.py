"""The type table: each type with a grammar rule in :mod:`.type_rules`, its grammar rule in words, and JSON texts its
validator accepts and rejects (the values of issue #32 among them).

>>> len(type_table()) >= 19
True
"""
from __future__ import annotations

import datetime as dt
import decimal
import enum
import ipaddress
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import pydantic as p
from pydantic import Field


__all__ = ["TypeRule", "type_table"]


@dataclass(frozen=True)
class TypeRule:
    """One row of the type table: a type, its grammar rule in words, what judges it, JSON texts the
    validator accepts (the grammar must too) and ones it rejects (the grammar must too)."""

    name: str
    type: Any
    rule: str
    accepted: tuple[str, ...]
    rejected: tuple[str, ...]
    validator: str = "pydantic"


class _Colour(enum.Enum):
    RED = "red"
    GREEN = "green"


class _Level(enum.IntEnum):
    LOW = 1
    HIGH = 3


def _q(*xs: str) -> tuple[str, ...]:
    return tuple(f'"{x}"' for x in xs)


def type_table() -> list[TypeRule]:
    """The type table: every pydantic / standard-library type with a grammar rule (docs/constraints.md lists it;
    tests and benchmarks walk it). Built on each call: Past/Future dates read today.

    >>> [r.name for r in type_table()][:3]
    ['date', 'datetime', 'NaiveDatetime']
    """
    today = dt.date.today()
    past, future = today - dt.timedelta(days=400), today + dt.timedelta(days=400)
    return [
        TypeRule("date", dt.date, "YYYY-MM-DD, years 0001-9999, day of month by month and leap year",
                 _q("2024-02-29", "2000-02-29", "0001-01-01", "9999-12-31", "2025-04-30"),
                 _q("0000-01-01", "2025-02-29", "1900-02-29", "2025-04-31", "2025-13-01", "2025-1-1")),
        TypeRule("datetime", dt.datetime, "date T hh:mm:ss[.ffffff], offset optional",
                 _q("2025-01-02T03:04:05", "2025-01-02T03:04:05Z", "2025-01-02T03:04:05.123+02:00"),
                 _q("0000-01-01T00:00:00Z", "2025-02-29T00:00:00", "2025-01-02T24:00:00", "2025-01-02T03:04:60")),
        TypeRule("NaiveDatetime", p.NaiveDatetime, "date T time, no offset",
                 _q("2025-01-02T03:04:05", "2024-02-29T23:59:59.5"),
                 _q("2025-01-02T03:04:05Z", "2025-01-02T03:04:05+01:00")),
        TypeRule("AwareDatetime", p.AwareDatetime, "date T time, offset required",
                 _q("2025-01-02T03:04:05Z", "2025-01-02T03:04:05-05:30"), _q("2025-01-02T03:04:05")),
        TypeRule("PastDate", p.PastDate, "a date range ending two days before today (at compile time)",
                 _q(past.isoformat(), "1999-12-31"), _q(future.isoformat(), "9999-12-31")),
        TypeRule("FutureDate", p.FutureDate, "a date range starting two days after today (at compile time)",
                 _q(future.isoformat(), "9999-12-31"), _q(past.isoformat(), "1999-12-31")),
        TypeRule("time", dt.time, "hh:mm:ss[.ffffff], offset optional",
                 _q("12:30:00", "23:59:59.999999", "00:00:00Z"), _q("24:00:00", "12:60:00", "12:00:00+24:00")),
        TypeRule("timedelta", dt.timedelta, "RFC 3339 durations (P1DT2H, PT30M, P2W), parts <= 6 digits",
                 _q("P1D", "PT1H", "P1DT2H3M4S", "P2W", "P1Y2M3D"), _q("PT", "P", "1 fortnight", "P1.5.5D")),
        TypeRule("UUID", uuid.UUID, "8-4-4-4-12 hex digits",
                 _q("123e4567-e89b-12d3-a456-426614174000"), _q("123e4567-e89b-12d3-a456-42661417400", "xyz")),
        TypeRule("UUID1", p.UUID1, "version digit 1, variant 8-b",
                 _q("123e4567-e89b-12d3-a456-426614174000"), _q("123e4567-e89b-42d3-a456-426614174000")),
        TypeRule("UUID4", p.UUID4, "version digit 4, variant 8-b",
                 _q("123e4567-e89b-42d3-a456-426614174000"),
                 _q("123e4567-e89b-12d3-a456-426614174000", "123e4567-e89b-42d3-c456-426614174000")),
        TypeRule("UUID5", p.UUID5, "version digit 5, variant 8-b",
                 _q("123e4567-e89b-52d3-a456-426614174000"), _q("123e4567-e89b-42d3-a456-426614174000")),
        TypeRule("Decimal(5, 2)", Annotated[decimal.Decimal, Field(max_digits=5, decimal_places=2)],
                 "an integer of <= 3 digits, or a string of <= 3 + 2 digits",
                 ("123", '"123.45"', '"-1.5"', '"0.25"'), ('"1234.56"', '"1.234"', "1234", '"abc"')),
        TypeRule("Decimal", decimal.Decimal, "a number, or a decimal string",
                 ("1.5", '"1.5"', '"-12"'), ('"abc"', '"1e5x"')),
        TypeRule("HttpUrl", p.HttpUrl, "http(s)://host[:port][/path][?query][#fragment]",
                 _q("https://example.com", "http://a.example.org:8080/x/y?q=1#top"),
                 _q("ftp://example.com", "example.com", "http://")),
        TypeRule("AnyUrl", p.AnyUrl, "scheme://host[:port][/path][?query][#fragment]",
                 _q("ftp://example.com/a", "https://example.com"), _q("example.com", "://x")),
        TypeRule("IPv4Address", ipaddress.IPv4Address, "dotted decimal, octets 0-255, no leading zeros",
                 _q("192.168.0.1", "0.0.0.0"), _q("256.1.1.1", "1.2.3", "01.2.3.4")),
        TypeRule("IPv6Address", ipaddress.IPv6Address, "eight hex groups, one :: compression",
                 _q("::1", "2001:db8::8a2e:370:7334", "fe80:0:0:0:0:0:0:1"), _q("2001:db8:::1", "1:2:3:4:5:6:7:8:9", "g::1")),
        TypeRule("IPvAnyAddress", p.IPvAnyAddress, "IPv4 or IPv6 address", _q("10.0.0.1", "::1"), _q("10.0.0.256")),
        TypeRule("IPv4Network", ipaddress.IPv4Network, "address/32 or whole-octet prefixes with zero host bits",
                 _q("10.0.0.0/8", "192.168.1.0/24", "1.2.3.4/32"), _q("10.0.0.1/8", "10.0.0.0/33")),
        TypeRule("IPv4Interface", ipaddress.IPv4Interface, "address[/0-32]",
                 _q("10.0.0.1/8", "10.0.0.1"), _q("10.0.0.1/33")),
        TypeRule("PositiveInt", p.PositiveInt, "JSON Schema exclusiveMinimum 0 (llguidance)", ("1", "42"), ("0", "-1")),
        TypeRule("NonNegativeFloat", p.NonNegativeFloat, "JSON Schema minimum 0 (llguidance)",
                 ("0", "1.5"), ("-0.5",)),
        TypeRule("conint(multiple_of=5)", Annotated[int, Field(multiple_of=5)], "multipleOf (llguidance)",
                 ("10", "-5"), ("7",)),
        TypeRule("confloat(multiple_of=0.5)", Annotated[float, Field(multiple_of=0.5)],
                 "multipleOf (llguidance; one-place or single-digit steps, else validation)",
                 ("1.5", "-2", "0"), ("0.3", "1.25")),
        TypeRule("set[IntEnum]", set[_Level], "enum of its members' subsets, each once, in declaration order",
                 ("[]", "[1]", "[1,3]"), ("[2]", "[1,2]")),
        TypeRule("Literal", Literal["a", 1], "enum", ('"a"', "1"), ('"b"', "2")),
        TypeRule("list[Enum]", list[_Colour], "enum of its values (a bare str Enum is a Choice)", ('["red","green"]',),
                 ('["blue"]', '["RED"]')),
        TypeRule("IntEnum", _Level, "enum of its values", ("1", "3"), ("2",)),
        TypeRule("tuple[int, str]", tuple[int, str], "prefixItems, exactly two items",
                 ('[1,"a"]',), ('["a",1]', "[1]", '[1,"a",2]')),
        TypeRule("constr(pattern, max_length)", Annotated[str, Field(pattern=r"^[a-z]+$", max_length=4)],
                 "pattern and maxLength (llguidance)", _q("abcd"), _q("abcde", "ab1")),
        TypeRule("bytes", bytes, "any string (pydantic reads JSON bytes as UTF-8)", _q("abc", ""), ("1",)),
    ]
