"""Runaway guards (issue #32): numbers no longer than their type, per-field string budgets and the
``x-max-chars`` / ``x-max-tokens`` extensions -- the grammar narrows, validation keeps the schema, and a
satisfiable schema stays satisfiable."""
from __future__ import annotations

import json

import pytest

from dgemma_struct.constraints import compile_constraint
from dgemma_struct.constraints.field_bounds import INT_BOUND, field_chars
from dgemma_struct.errors import ConstraintError

OBJ = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                        "score": {"type": "number"}}, "required": ["name", "age", "score"]}


def _text(name="Ann", age=3, score=1.5):
    return '{"name":%s,"age":%s,"score":%s}' % (json.dumps(name), age, score)


def test_numbers_are_bounded_only_when_asked(hf_tok):
    long_int, long_float = "1" * 40, "1" * 30 + ".5"
    plain = compile_constraint(OBJ, tokenizer=hf_tok)
    bounded = compile_constraint(OBJ, tokenizer=hf_tok, bounded_numbers=True)
    assert plain.grammar_accepts(_text(age=long_int)) and plain.grammar_accepts(_text(score=long_float))
    assert not bounded.grammar_accepts(_text(age=long_int)) and not bounded.grammar_accepts(_text(score=long_float))
    for ok in (_text(), _text(age=INT_BOUND), _text(age=-INT_BOUND), _text(score="-1234567890123456.5"),
               _text(score="3.1415926536"), _text(score="-0.0000000001"), _text(score="123456789.1234567")):
        assert bounded.grammar_accepts(ok) and bounded.matches(ok), ok
    # at most 17 significant digits: the long fractions of #32's benchmark are refused
    for long in ("-1234567890123456.25", "11.99999111459999", "0.00000000001", "123456789.12345678"):
        assert plain.grammar_accepts(_text(score=long)) and not bounded.grammar_accepts(_text(score=long)), long
    assert not bounded.grammar_accepts(_text(age=INT_BOUND + 1))


def test_bounded_numbers_keep_the_schema_bounds(hf_tok):
    schema = {"type": "integer", "minimum": 10 ** 12, "maximum": 10 ** 12 + 5}
    c = compile_constraint(schema, tokenizer=hf_tok, bounded_numbers=True)
    assert c.grammar_accepts(str(10 ** 12 + 3)) and not c.grammar_accepts("3")
    one_sided = compile_constraint({"type": "integer", "minimum": 5}, tokenizer=hf_tok, bounded_numbers=True)
    assert one_sided.grammar_accepts("6") and not one_sided.grammar_accepts("4")
    assert not one_sided.grammar_accepts("1" * 17)


def test_a_plain_string_gets_its_share_of_the_budget(hf_tok):
    cap = field_chars(64, 3)
    c = compile_constraint(OBJ, tokenizer=hf_tok, field_budget=64)
    assert c.grammar_accepts(_text(name="x" * cap)) and not c.grammar_accepts(_text(name="x" * (cap + 1)))
    assert c.validate_text(_text(name="x" * (cap + 1))).ok  # validation keeps the schema
    wide = compile_constraint(OBJ, tokenizer=hf_tok, field_budget=512)
    assert wide.grammar_accepts(_text(name="x" * (cap + 1)))


def test_a_budget_never_makes_a_schema_unsatisfiable(hf_tok):
    schema = {"type": "object", "properties": {"a": {"type": "string", "minLength": 200},
                                               "b": {"type": "string", "pattern": "^x{300}$"}},
              "required": ["a", "b"]}
    c = compile_constraint(schema, tokenizer=hf_tok, field_budget=16)
    text = json.dumps({"a": "y" * 200, "b": "x" * 300}, separators=(",", ":"))
    assert c.grammar_accepts(text) and c.matches(text)


def test_budget_buckets_share_a_cache_entry(hf_tok):
    a = compile_constraint(OBJ, tokenizer=hf_tok, field_budget=100)
    assert compile_constraint(OBJ, tokenizer=hf_tok, field_budget=127) is a
    assert compile_constraint(OBJ, tokenizer=hf_tok, field_budget=128) is not a


@pytest.mark.parametrize("kw", ["x-max-chars", "x-max-tokens"])
def test_length_extensions(hf_tok, kw):
    schema = {"type": "object", "properties": {"note": {"type": "string", kw: 5}}, "required": ["note"]}
    c = compile_constraint(schema, tokenizer=hf_tok)
    assert c.grammar_accepts('{"note":"abcde"}') and not c.grammar_accepts('{"note":"abcdef"}')
    assert c.validate_text('{"note":"abcdef"}').ok


@pytest.mark.parametrize("bad", [0, -3, True, "64", 1.5])
def test_bad_field_budget_is_a_typed_error(hf_tok, bad):
    with pytest.raises(ConstraintError):
        compile_constraint(OBJ, tokenizer=hf_tok, field_budget=bad)
    with pytest.raises(ConstraintError):
        compile_constraint(OBJ, tokenizer=hf_tok, bounded_numbers="yes")


@pytest.mark.parametrize("step,off", [("0.5", "0.3"), ("0.2", "0.3"), ("1.5", "2"), ("0.05", "0.12"), ("2.5", "3"),
                                      ("12.5", "13"), ("0.25", None), ("0.15", None)])
def test_a_decimal_step_is_kept_where_the_engine_enforces_it_exactly(hf_tok, step, off):
    """llguidance's multipleOf is exact for one-place and single-digit steps; 0.25 refused 0.5 (left to
    validation then). Every multiple stays accepted either way."""
    from decimal import Decimal

    c = compile_constraint({"type": "number", "multipleOf": float(step)}, tokenizer=hf_tok)
    d = Decimal(step)
    for k in range(-12, 13):
        text = format((k * d).normalize(), "f")
        assert c.grammar_accepts(text) and c.matches(text), (step, text)
    if off is not None:
        assert not c.grammar_accepts(off) and "multipleOf" not in c.semantic_keywords
    else:
        assert "multipleOf" in c.semantic_keywords


def test_a_recursive_definitions_strings_share_the_budget_as_a_tree_would():
    """A category tree has one ``name`` leaf: with the whole budget's characters a model wrote 300 of
    them; a recursive definition's leaves count RECURSIVE_WEIGHT times."""
    from dgemma_struct.constraints.field_bounds import RECURSIVE_WEIGHT, bound_fields

    node = {"type": "object", "properties": {"name": {"type": "string"},
                                             "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}
    tree = {"$defs": {"Node": json.loads(json.dumps(node))}, "$ref": "#/$defs/Node"}
    flat = {"$defs": {"Node": {"type": "object", "properties": {"name": {"type": "string"}}}},
            "$ref": "#/$defs/Node"}
    bound_fields(tree, budget=128)
    bound_fields(flat, budget=128)
    assert tree["$defs"]["Node"]["properties"]["name"]["maxLength"] == field_chars(128, RECURSIVE_WEIGHT) == 96
    assert flat["$defs"]["Node"]["properties"]["name"]["maxLength"] == field_chars(128, 1) == 384


def test_a_number_bound_beyond_the_bands_is_kept(hf_tok):
    """A schema that asks for numbers beyond 1e16 gets them (the digit bands stop there)."""
    wide = compile_constraint({"type": "number", "minimum": 0, "maximum": 10 ** 18}, tokenizer=hf_tok,
                              bounded_numbers=True)
    assert wide.grammar_accepts(str(5 * 10 ** 17)) and not wide.grammar_accepts("-1")
    narrow = compile_constraint({"type": "number", "minimum": 0, "maximum": 100}, tokenizer=hf_tok,
                                bounded_numbers=True)
    assert narrow.grammar_accepts("99.5") and not narrow.grammar_accepts("100.5")
    assert not narrow.grammar_accepts("1.12345678901")   # 11 decimals: beyond the band's 10
