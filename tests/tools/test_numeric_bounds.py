"""Numeric bounds in the tool-call grammar (``minimum`` / ``maximum`` / ``exclusive*``): exact for
integers, exact over exponent-free decimals for numbers, and never narrower than validation."""
import re
from decimal import Decimal

import jsonschema
import pytest
from hypothesis import given, settings, strategies as st

from dgemma_struct.tools import compile_tool_calls, generate_tool_calls
from dgemma_struct.tools.numeric import bounded_number_regex, integer_regex, number_regex

STOPS = [1, 106, 50]
S = '<|"|>'

BOUNDED = {"name": "tune", "parameters": {"type": "object", "properties": {
    "level": {"type": "integer", "minimum": 3, "maximum": 17},
    "offset": {"type": "integer", "minimum": -20, "exclusiveMaximum": -3},
    "step": {"type": "integer", "exclusiveMinimum": -3, "exclusiveMaximum": 5},
    "floor": {"type": "integer", "minimum": 100},
    "ratio": {"type": "number", "exclusiveMinimum": -1.5, "maximum": 2.25},
    "gain": {"type": "number", "minimum": 0},
    "loss": {"type": ["number", "null"], "exclusiveMaximum": -0.5},
    "code": {"type": "string", "pattern": r"^\d{2}-\w$"}}}}


def call(body: str) -> str:
    return f"<|tool_call>call:tune{{{body}}}<tool_call|>"


@pytest.fixture(scope="module")
def bounded(gemma4_tokenizer):
    return compile_tool_calls([BOUNDED], gemma4_tokenizer, tool_choice="required", stop_token_ids=STOPS)


@pytest.mark.parametrize("body, ok", [
    ("level:3", True), ("level:17", True), ("level:10", True),
    ("level:2", False), ("level:18", False), ("level:-5", False), ("level:170", False), ("level:03", False),
    ("offset:-20", True), ("offset:-4", True), ("offset:-3", False), ("offset:-21", False), ("offset:4", False),
    ("step:-2", True), ("step:0", True), ("step:4", True), ("step:-3", False), ("step:5", False),
    ("floor:100", True), ("floor:123456789012345678901234567890", True), ("floor:99", False), ("floor:-100", False),
    ("ratio:2.25", True), ("ratio:2.2", True), ("ratio:2.2500", True), ("ratio:-1.49", True), ("ratio:0", True),
    ("ratio:2.26", False), ("ratio:2.250001", False), ("ratio:-1.5", False), ("ratio:3", False),
    ("gain:0", True), ("gain:1.5e3", True), ("gain:12.75", True), ("gain:-0.5", False), ("gain:-1e3", False),
    ("loss:null", True), ("loss:-0.75", True), ("loss:-1000000000.5", True), ("loss:-0.5", False), ("loss:0", False),
    (f"code:{S}12-x{S}", True), (f"code:{S}١٢-x{S}", False), (f"code:{S}12-é{S}", False),
    ("level:3,offset:-4,step:0,floor:100,ratio:1.5,gain:0.25,loss:-2", True),
])
def test_the_grammar_enforces_numeric_bounds(bounded, body, ok):
    """Checked with llguidance on the Gemma 4 tokenizer (the old grammar took any JSON number here)."""
    text = call(body)
    assert bounded.grammar_accepts(text) is ok
    if ok:  # what the grammar takes, validation takes too: the two agree on the bounds
        assert bounded.validate_text(text).ok


def test_out_of_range_values_no_longer_reach_validation(bounded):
    text = call("level:18")
    assert not bounded.grammar_accepts(text) and not bounded.validate_text(text).ok


@pytest.mark.parametrize("lo, hi", [(3, 17), (-20, -4), (-2, 4), (0, 0), (None, -7), (5, None), (None, None),
                                    (9, 10), (19, 1001), (-1001, -19), (123, 4567), (-99, 100), (7, 6)])
def test_integer_regex_is_exact(lo, hi):
    rx = integer_regex(lo, hi)
    for n in range(-1200, 1201):
        want = (lo is None or n >= lo) and (hi is None or n <= hi)
        assert (rx is not None and re.fullmatch(rx, str(n)) is not None) is want, (lo, hi, n)
    for s in ["03", "-03", "00", "1.0", "1e1", "+1", ""]:
        assert rx is None or re.fullmatch(rx, s) is None


_DECIMALS = sorted({f"{sign}{i}{frac}" for sign in ("", "-") for i in ("0", "1", "2", "9", "10", "99", "100")
                    for frac in ("", ".0", ".05", ".1", ".2", ".25", ".2500", ".26", ".5", ".75", ".999", ".0001")})


@pytest.mark.parametrize("lo, hi", [
    (("2.25", False), None), (None, ("2.25", False)), (None, ("2.25", True)), (("-1.5", True), ("2.25", False)),
    (("0", True), None), (("0", False), ("0", False)), (None, ("-0.5", True)), (("0.05", False), ("0.1", True)),
    (("-10", False), ("-9.999", False)), (("1", True), ("1.0001", True)), (("99.999", False), ("100", True)),
])
def test_number_regex_is_exact_over_decimals(lo, hi):
    lo = None if lo is None else (Decimal(lo[0]), lo[1])
    hi = None if hi is None else (Decimal(hi[0]), hi[1])
    rx = number_regex(lo, hi)
    for s in _DECIMALS:
        v = Decimal(s)
        want = (lo is None or (v > lo[0] if lo[1] else v >= lo[0])) and (hi is None or (v < hi[0] if hi[1] else v <= hi[0]))
        assert (rx is not None and re.fullmatch(rx, s) is not None) is want, (lo, hi, s)
    for s in ["1e0", "-2.5E+1", "25e-1", "0e0"]:  # exponent forms only where all they spell is in range
        v = Decimal(s)
        inside = (lo is None or (v > lo[0] if lo[1] else v >= lo[0])) and (hi is None or (v < hi[0] if hi[1] else v <= hi[0]))
        assert inside or rx is None or re.fullmatch(rx, s) is None


_bound = st.one_of(st.integers(-10**20, 10**20), st.floats(-1e6, 1e6, allow_nan=False),
                   st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([0.1, -0.1, 0.3, 2.25, 1e-7, 2 ** 53 + 1]))
_value = st.one_of(st.integers(-10**22, 10**22), st.integers(-50, 50), st.floats(allow_nan=False, allow_infinity=False),
                   st.floats(-100, 100))


def _spell(v):
    return str(v) if isinstance(v, int) else format(Decimal(repr(v)), "f")


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(["integer", "number"]), st.dictionaries(
    st.sampled_from(["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]), _bound, max_size=3),
    st.lists(_value, min_size=1, max_size=8))
def test_bounds_are_never_narrower_than_validation(kind, bounds, values):
    """Sound: each value the validator takes (int, or float compared as float) has its exponent-free
    spelling accepted; exact for integers away from the 1e40 cap."""
    schema = {"type": kind, **bounds}
    validator = jsonschema.Draft202012Validator(schema)
    rx = bounded_number_regex(schema, kind == "integer")
    for v in values:
        if kind == "integer" and isinstance(v, float):
            continue  # the grammar writes integers as integers
        ok = validator.is_valid(v)
        took = rx is None or re.fullmatch(rx, _spell(v)) is not None
        if ok:
            assert took, (schema, v, rx)
        elif kind == "integer" and rx is not None and all(abs(b) < 1e39 for b in bounds.values()):
            assert not took, (schema, v)


def test_draft4_boolean_exclusive_and_empty_ranges_stay_sound():
    assert bounded_number_regex({"minimum": 3, "exclusiveMinimum": True}, True) == integer_regex(3, None)
    assert bounded_number_regex({"minimum": 5, "maximum": 4}, True) is None  # empty: left to validation
    assert bounded_number_regex({"type": "number"}, False) is None


ANSWER = {"name": "setDial", "parameters": {"type": "object", "properties": {
    "level": {"type": "integer", "minimum": 3, "maximum": 17},
    "offset": {"type": "integer", "minimum": -9, "exclusiveMaximum": -4},
    "ratio": {"type": "number", "exclusiveMinimum": -0.5, "maximum": 0.25}},
    "required": ["level", "offset", "ratio"]}}


@pytest.mark.parametrize("mode", ["ar", "diffusion"])
def test_random_weights_call_with_in_range_arguments(gemma4_random_runtime, mode):
    """Random weights write random digits; without repairs every call is still in range."""
    res = generate_tool_calls("Set the dial.", [ANSWER], tool_choice="required", runtime=gemma4_random_runtime,
                              max_new_tokens=48, mode=mode, max_repairs=0, seed=3)
    assert res.calls and res.finish_reason == "tool_calls"
    for c in res.calls:
        a = c.arguments
        assert 3 <= a["level"] <= 17 and -9 <= a["offset"] < -4 and -0.5 < a["ratio"] <= 0.25, a
