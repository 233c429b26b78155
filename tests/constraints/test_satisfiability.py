"""#26.4: unsatisfiable bounds are an error only where the subschema must hold; extreme number
bounds are refused naming the keyword; choice lists beyond the engine's 2,000-item row compile."""
from __future__ import annotations

import pytest

from dgemma_struct.constraints import Choice, compile_constraint
from dgemma_struct.errors import SchemaError

U = {"type": "integer", "minimum": 5, "maximum": 4}
S = {"type": "string", "minLength": 3, "maxLength": 2}


@pytest.mark.parametrize("schema", [
    {"not": U}, {"anyOf": [U, {"type": "string"}]}, {"oneOf": [U, {"type": "boolean"}]},
    {"type": "object", "properties": {"a": U}}, {"type": "object", "properties": {"a": S, "b": {"type": "integer"}},
                                                 "required": ["b"]},
    {"type": "array", "items": U}, {"if": U, "then": {"type": "string"}},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": U}, "required": ["b"]}}},
    {"not": {"type": "integer", "minimum": 1e308}},
], ids=lambda s: str(s)[:60])
def test_contradictions_in_optional_branches_compile(hf_tok, schema):
    c = compile_constraint(schema, tokenizer=hf_tok)
    assert c is not None


@pytest.mark.parametrize("schema", [
    U, {"allOf": [{"type": "integer"}, U]}, {"type": "object", "properties": {"a": U}, "required": ["a"]},
    {"type": "array", "items": S, "minItems": 1}, {"type": "array", "prefixItems": [U], "minItems": 1},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": U}, "required": ["b"]}},
     "required": ["a"]},
], ids=lambda s: str(s)[:60])
def test_contradictions_that_must_hold_are_schema_errors(hf_tok, schema):
    with pytest.raises(SchemaError, match="unsatisfiable"):
        compile_constraint(schema, tokenizer=hf_tok)


@pytest.mark.parametrize("schema,kw", [({"type": "number", "minimum": 1e308}, "minimum"),
                                       ({"type": "integer", "maximum": -1e308}, "maximum"),
                                       ({"type": "integer", "exclusiveMinimum": 2 ** 63}, "exclusiveMinimum")])
def test_bounds_no_value_would_be_written_for_are_refused_naming_the_keyword(hf_tok, schema, kw):
    with pytest.raises(SchemaError) as ei:
        compile_constraint(schema, tokenizer=hf_tok)
    assert kw in ei.value.keywords and kw in str(ei.value)


def test_vacuous_extreme_bounds_compile(hf_tok):
    # a minimum of -1e308 on an integer used to be "Failed to generate regex for integer range"
    c = compile_constraint({"type": "integer", "minimum": -1e308, "maximum": 10}, tokenizer=hf_tok)
    assert c.matches("7") and not c.matches("11")


@pytest.mark.parametrize("n", [2001, 20000])
def test_choice_lists_beyond_the_row_limit_compile_and_walk(hf_tok, n):
    opts = [f"opt-{i}.x" for i in range(n)]
    c = compile_constraint(Choice(opts), tokenizer=hf_tok)
    assert c.matches("opt-1999.x") and c.matches(f"opt-{n - 1}.x") and not c.matches("opt-1999x")
    ids = c.tokenize("opt-1234.x")
    r = c.canvas_walker().walk(ids)
    assert r.n_valid == len(ids) and r.accepting


@pytest.mark.parametrize("schema,good,bad", [
    ({"type": "number", "multipleOf": 0.1, "minimum": 0.25, "maximum": 0.35}, ["0.3"], ["0.25", "0.4", "0.2"]),
    ({"type": "number", "multipleOf": 0.25, "minimum": 0, "maximum": 1}, ["0", "0.25", "0.75", "1"], ["0.3", "1.25"]),
    ({"type": "number", "multipleOf": 0.1, "exclusiveMinimum": 0.3, "maximum": 0.5}, ["0.4", "0.5"], ["0.3"]),
])
def test_a_decimal_step_between_bounds_compiles_exactly(hf_tok, schema, good, bad):
    # llguidance's own compile of multipleOf 0.1 in [0.25, 0.35] accepted nothing: the grammar is the enum
    c = compile_constraint(schema, tokenizer=hf_tok)
    assert "multipleOf" not in c.semantic_keywords
    assert all(c.grammar_accepts(t) for t in good) and not any(c.matches(t) for t in bad)
