"""Types compile to grammars no wider than their validators (issue #32): for every row of the type table,
the values its validator rejects are refused by the grammar, the values it accepts are accepted, and every
string a type's grammar rule can produce passes pydantic (hypothesis draws them from the rule itself)."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from dgemma_struct.constraints import compile_constraint
from dgemma_struct.constraints.schema_checks import iter_subschemas
from dgemma_struct.constraints.type_rules import GRAMMAR_KEY, RAW_FORMAT_PATTERNS, typed_json_schema
from dgemma_struct.constraints.type_table import type_table

ROWS = {r.name: r for r in type_table()}


def _pydantic_ok(tp, text: str) -> bool:
    try:
        TypeAdapter(tp).validate_json(text)
        return True
    except Exception:  # noqa: BLE001 - pydantic.ValidationError
        return False


@pytest.mark.parametrize("name", list(ROWS))
def test_grammar_refuses_what_the_validator_rejects(hf_tok, name):
    row = ROWS[name]
    c = compile_constraint(row.type, tokenizer=hf_tok)
    for text in row.rejected:
        assert not _pydantic_ok(row.type, text) and not c.validate_text(text).ok, (name, text, "validator accepts it")
        assert not c.grammar_accepts(text), (name, text, "grammar wider than the validator")
    for text in row.accepted:
        assert _pydantic_ok(row.type, text), (name, text, "validator rejects it")
        assert c.grammar_accepts(text) and c.matches(text), (name, text, "grammar narrower than the validator")


def _rules(tp) -> list[dict]:
    return [s[GRAMMAR_KEY] for _, s in iter_subschemas(typed_json_schema(tp)) if GRAMMAR_KEY in s]


def _patterns(rule: dict) -> list[str]:
    return [s["pattern"] for _, s in iter_subschemas(rule) if "pattern" in s]


RULED = [n for n, r in ROWS.items() if any(_patterns(x) for x in _rules(r.type))]


def test_the_table_has_grammar_rules():
    assert {"date", "NaiveDatetime", "UUID4", "Decimal(5, 2)", "HttpUrl", "IPv6Address", "timedelta"} <= set(RULED)


@pytest.mark.parametrize("name", RULED)
def test_every_string_of_a_rule_passes_pydantic(name):
    row = ROWS[name]
    pats = [p for rule in _rules(row.type) for p in _patterns(rule)]

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.one_of(*[st.from_regex(p, fullmatch=True, alphabet=st.characters(codec="ascii")) for p in pats]))
    def check(s):
        assert _pydantic_ok(row.type, json.dumps(s)), (name, s)

    check()


def test_a_type_without_a_rule_keeps_its_schema():
    assert typed_json_schema(int) == {"type": "integer"}
    assert GRAMMAR_KEY in typed_json_schema(TypeAdapter(ROWS["date"].type))


@pytest.mark.parametrize("fmt,good,valid_not_written,bad", [
    ("date", ["0001-01-01", "2024-02-29", "2000-02-29"], ["0000-01-01"], ["2025-02-29", "1900-02-29", "2025-04-31"]),
    ("date-time", ["0001-01-01T00:00:00Z", "2024-02-29T23:59:60Z"], ["0000-01-01T00:00:00Z"], ["2025-02-29T00:00:00Z"]),
])
def test_raw_formats_keep_json_schema_meaning(hf_tok, fmt, good, valid_not_written, bad):
    # raw schemas validate by RFC 3339 (year 0000 included) but are written in the years client date types
    # read (pydantic refuses 0000); the leap second stays; days the format check refuses are never written
    c = compile_constraint({"type": "string", "format": fmt}, tokenizer=hf_tok)
    for v in good:
        assert c.grammar_accepts(json.dumps(v)) and c.matches(json.dumps(v)), v
    for v in valid_not_written:
        assert c.validate_text(json.dumps(v)).ok and not c.grammar_accepts(json.dumps(v)), v
    for v in bad:
        assert not c.validate_text(json.dumps(v)).ok and not c.grammar_accepts(json.dumps(v)), v
    assert fmt in RAW_FORMAT_PATTERNS


@pytest.mark.parametrize("fmt,good,bad", [
    ("uri-template", ["http://x/{+path}/here{?q,r}", "{.dom*}", "{/p:3}", "", "%41"],
     ["completion options", "{a..b}", "{}", "%4", "{a:0}", "{a:10000}"]),
    ("json-pointer", ["", "/", "/a~0b/c~1d", "/a b"], ["a", "/a~2"]),
    ("relative-json-pointer", ["0", "1/a", "0#", "2/"], ["01", "/a", "0a"]),
])
def test_formats_llguidance_does_not_know_are_written_as_the_check_reads_them(hf_tok, fmt, good, bad):
    """llguidance reads these format names as "any string"; the grammar copy gets a pattern that is a subset
    of jsonschema-rs' check, so the grammar never writes what the validator rejects, and every string the
    pattern can produce passes the check."""
    from dgemma_struct.constraints.schema_checks import spec_format_valid

    c = compile_constraint({"type": "string", "format": fmt}, tokenizer=hf_tok)
    for v in good:
        assert spec_format_valid(fmt, v) and c.grammar_accepts(json.dumps(v)) and c.matches(json.dumps(v)), v
    for v in bad:
        assert not c.validate_text(json.dumps(v)).ok and not c.grammar_accepts(json.dumps(v)), v

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.from_regex(RAW_FORMAT_PATTERNS[fmt], fullmatch=True))
    def check(s):
        assert spec_format_valid(fmt, s), (fmt, s)

    check()


def test_a_raw_date_is_one_pydantic_reads(hf_tok):
    """``responses.parse(text_format=Model)`` sends pydantic's schema as a raw dict and parses the answer
    with pydantic: every date the raw grammar writes must be one pydantic's ``date`` takes."""
    import datetime as dt

    pattern = RAW_FORMAT_PATTERNS["date"]

    @settings(max_examples=200, deadline=None, database=None)
    @given(st.from_regex(pattern, fullmatch=True, alphabet=st.characters(codec="ascii")))
    def check(s):
        TypeAdapter(dt.date).validate_json(json.dumps(s))

    check()


def test_a_set_of_a_small_enum_takes_each_member_once(hf_tok):
    """set[IntEnum]: the grammar writes its members once each, in declaration order (a model repeating a
    member ran to the budget; pydantic would have merged the repeats, uniqueItems did not)."""
    import enum

    class Day(enum.IntEnum):
        MON, TUE, WED = 1, 2, 3

    c = compile_constraint(set[Day], tokenizer=hf_tok, bounded_numbers=True)
    for ok in ("[]", "[2]", "[1,3]", "[1,2,3]"):
        assert c.grammar_accepts(ok) and c.matches(ok), ok
    for bad in ("[1,1]", "[3,1]", "[4]", "[1,2,3,1]"):
        assert not c.grammar_accepts(bad), bad
    big = enum.IntEnum("Big", {f"V{i}": i for i in range(12)})  # 4096 subsets: left to uniqueItems
    assert c.grammar_accepts("[1]") and compile_constraint(set[big], tokenizer=hf_tok).grammar_accepts("[3,1]")
