"""#26.2/3/5: every error of the Python API is typed. The issue's seven untyped cases, the regex
dialect (malformed patterns are RegexErrors), fast LengthErrors from the bounds, and a property test
that feeds each public entry point arbitrary arguments: only ``DgemmaStructError`` (or ``TypeError``
for a wrong keyword name) may come out."""
from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dgemma_struct as ds
from dgemma_struct.constraints import JsonSchema, compile_constraint
from dgemma_struct.errors import (DgemmaStructError, GrammarError, InvalidRequestError, LengthError, RegexError,
                                  SchemaError)

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def _k(rt):
    return dict(runtime=rt, max_new_tokens=8, max_repairs=0, fallback=False)


@pytest.mark.parametrize("case", ["pattern_overflow", "regex_surrogate", "grammar_surrogate", "tool_none", "row_stop",
                                  "whitespace", "separators"])
def test_the_seven_untyped_cases_are_typed(rt, case):
    calls = {
        "pattern_overflow": (lambda: ds.generate_json("x", {"type": "string", "pattern": "a{0,4294967296}"}, **_k(rt)),
                             SchemaError),
        "regex_surrogate": (lambda: ds.generate_regex("x", "\ud800", **_k(rt)), RegexError),
        "grammar_surrogate": (lambda: ds.generate_grammar("x", 'start: "\ud800"', **_k(rt)), GrammarError),
        "tool_none": (lambda: ds.generate_tool_calls(None, TOOLS, **_k(rt)), InvalidRequestError),
        "row_stop": (lambda: ds.generate_batch(["a", "b"], ds.Regex("[0-9]"), row_stop=[5, 5], **_k(rt)),
                     InvalidRequestError),
        "whitespace": (lambda: compile_constraint(JsonSchema({"type": "object"}), rt.tokenizer, whitespace="x"),
                       InvalidRequestError),
        "separators": (lambda: compile_constraint(JsonSchema({"type": "object"}), rt.tokenizer, separators=("x",)),
                       InvalidRequestError),
    }
    fn, err = calls[case]
    with pytest.raises(err):
        fn()


@pytest.mark.parametrize("pattern", ["\\", "a**", "[", "(?P<x", "a{2,1}"])
def test_malformed_regexes_are_regex_errors_not_empty_successes(rt, pattern):
    with pytest.raises(RegexError):
        ds.generate_regex("x", pattern, **_k(rt))


@pytest.mark.parametrize("pattern", [r"\p{L}", r"\x{41}", r"[a-z&&[^aeiou]]", r"[[:digit:]]", r"(?<n>a)\z"])
def test_rust_and_ecma_spellings_still_compile(rt, pattern):
    compile_constraint(ds.Regex(pattern), rt.tokenizer)


def test_format_regex_is_ecma_262():
    from dgemma_struct.constraints.json_schema import make_validator

    v = make_validator({"type": "string", "format": "regex"})
    assert v.is_valid(r"\p{L}+") and v.is_valid("^[a-z]+$") and v.is_valid("(?<n>a)")
    # Python-only spellings are not ECMA-262 regular expressions
    assert not v.is_valid("(?P<n>a)") and not v.is_valid(r"\Z") and not v.is_valid("(?i)a")


@pytest.mark.parametrize("schema", [{"type": "string", "minLength": 10 ** 9}, {"type": "array", "minItems": 10 ** 6},
                                    {"type": "object", "minProperties": 10 ** 6},
                                    {"type": "object", "properties": {"a": {"type": "string", "minLength": 10 ** 7}},
                                     "required": ["a"]}])
def test_huge_min_bounds_are_refused_in_milliseconds(rt, schema):
    ds.constraint_for(schema, rt)  # compile (cached) outside the clock
    t = time.perf_counter()
    with pytest.raises(LengthError, match="needs at least"):
        ds.generate_json("x", schema, runtime=rt)
    assert time.perf_counter() - t < 1.0


def test_a_huge_bound_in_an_optional_branch_is_not_refused(rt):
    # the bound is only a lower bound where it must hold: a null is a valid answer here
    from dgemma_struct.constraints.length_bound import min_json_chars

    assert min_json_chars({"anyOf": [{"type": "string", "minLength": 10 ** 9}, {"type": "null"}]}) == 1
    assert min_json_chars({"type": "object", "properties": {"a": {"type": "string", "minLength": 10 ** 9}}}) == 2


@pytest.mark.parametrize("call", [
    lambda rt: ds.generate_grounded([1, 2], {"type": "object"}, runtime=rt),
    lambda rt: ds.generate_grounded(("x",), {"type": "object"}, runtime=rt),
    lambda rt: ds.generate_grounded("x", {"type": "object"}, runtime=rt, max_new_tokens=None),
    lambda rt: ds.generate_grounded("x", {"type": "object"}, runtime=rt, max_new_tokens="abc"),
    lambda rt: ds.generate_grounded("x", {"type": "object"}, runtime=rt, max_new_tokens=[1, 2]),
    lambda rt: ds.generate_grounded("x", {"type": "object"}, runtime=rt, strict=[1, 2]),
    lambda rt: ds.generate_grounded_batch(5, {"type": "object"}, runtime=rt),
    lambda rt: compile_constraint({"type": "integer"}, rt.tokenizer, strict=[1, 2]),
], ids=["list-prompt", "tuple-prompt", "mnt-none", "mnt-str", "mnt-list", "strict-list", "batch-int", "compile-strict"])
def test_the_adversarial_benchmarks_untyped_cases_are_typed(rt, call):
    # found by benchmarks/adversarial.py (the property test below keeps max_new_tokens an int)
    with pytest.raises(DgemmaStructError):
        call(rt)


ARGS = st.one_of(st.none(), st.booleans(), st.integers(-10, 10 ** 20), st.floats(allow_nan=True),
                 st.text(max_size=12), st.binary(max_size=4), st.lists(st.integers(-3, 3), max_size=3),
                 st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
                 st.sampled_from([{"type": "integer", "const": -1e308}, "start: %json {\"const\": -1e308}", "\ud800",
                                  "a**", ["yes", "no"], {"type": "string", "minLength": 10 ** 9}, {"$ref": "#"},
                                  {"type": "object"}, "[0-9]", [5, 5], ("x",), -1, 0, 10 ** 30]))
KNOBS = ["max_new_tokens", "seed", "mode", "strict", "whitespace", "separators", "temperature", "top_p", "n",
         "max_repairs", "timeout_s", "thinking", "logprobs", "fallback", "not_a_knob"]


@settings(max_examples=120, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(["generate", "generate_json", "generate_regex", "generate_grammar", "generate_choice",
                        "generate_batch", "generate_tool_calls", "compile_constraint", "constraint_for",
                        "generate_grounded"]), ARGS, ARGS, st.dictionaries(st.sampled_from(KNOBS), ARGS, max_size=3))
def test_public_entry_points_raise_only_typed_errors(rt, fn, a, b, knobs):
    knobs.setdefault("max_new_tokens", 4)
    if not isinstance(knobs["max_new_tokens"], int) or knobs["max_new_tokens"] > 16:
        knobs["max_new_tokens"] = 4
    knobs.pop("n", None) if isinstance(knobs.get("n"), int) and knobs["n"] > 4 else None
    try:
        if fn == "compile_constraint":
            knobs = {k: v for k, v in knobs.items() if k in ("strict", "whitespace", "separators")}
            compile_constraint(a, rt.tokenizer, **knobs)
        elif fn == "constraint_for":
            ds.constraint_for(a, rt, **{k: v for k, v in knobs.items() if k in ("strict", "whitespace")})
        elif fn == "generate_grounded":
            ds.generate_grounded(a, b, source="some text 12", runtime=rt, **knobs)
        elif fn == "generate_batch":
            ds.generate_batch(a if isinstance(a, list) else [a], b, runtime=rt, **knobs)
        else:
            getattr(ds, fn)(a, b, runtime=rt, **knobs)
    except DgemmaStructError:
        pass
    except TypeError as e:
        assert "unexpected keyword" in str(e) or "not_a_knob" in str(e), repr(e)
