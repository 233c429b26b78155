"""Strict objects: pydantic-derived schemas forbid undeclared keys; raw dicts keep JSON Schema's
meaning unless ``strict_objects=True``; the re-validator never returns an undeclared key as success."""
from __future__ import annotations

import pytest
from pydantic import BaseModel

from dgemma_struct.constraints import compile_constraint
from dgemma_struct.constraints.strict_objects import close_objects


class Address(BaseModel):
    city: str


class Person(BaseModel):
    name: str
    age: int
    home: Address


RAW = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_close_objects_adds_false_everywhere_including_defs():
    s = close_objects(Person.model_json_schema())
    assert s["additionalProperties"] is False
    assert s["$defs"]["Address"]["additionalProperties"] is False
    assert "additionalProperties" not in Person.model_json_schema()  # the input is not modified


def test_close_objects_keeps_explicit_openness_and_values():
    s = {"type": "object", "properties": {"properties": {"type": "object", "properties": {"x": {}}}},
         "patternProperties": {"^x": {}}, "default": {"properties": {"y": 1}}}
    out = close_objects(s)
    assert "additionalProperties" not in out
    assert out["properties"]["properties"]["additionalProperties"] is False
    assert out["default"] == {"properties": {"y": 1}}
    for kw in ("additionalProperties", "unevaluatedProperties"):
        assert close_objects({"properties": {"a": {}}, kw: True})[kw] is True
    assert close_objects({"type": "object"}) == {"type": "object"}  # no properties: left open


def test_pydantic_model_forbids_undeclared_keys(hf_tok):
    c = compile_constraint(Person, hf_tok)
    assert c.matches('{"name":"a","age":1,"home":{"city":"x"}}')
    assert not c.grammar_accepts('{"name":"a","age":1,"home":{"city":"x"},"x":1}')
    assert not c.grammar_accepts('{"name":"a","age":1,"home":{"city":"x","":1}}')
    assert not c.matches('{"name":"a","age":1,"home":{"city":"x"},"":1,"":2}')


def test_raw_dict_keeps_json_schema_meaning_unless_asked(hf_tok):
    assert compile_constraint(RAW, hf_tok).matches('{"a":1,"b":2}')
    strict = compile_constraint(RAW, hf_tok, strict_objects=True)
    assert not strict.grammar_accepts('{"a":1,"b":2}') and not strict.matches('{"a":1,"b":2}')
    assert strict.matches('{"a":1}')
    opened = compile_constraint(Person, hf_tok, strict_objects=False)
    assert opened.matches('{"name":"a","age":1,"home":{"city":"x"},"x":1}')


def test_strict_objects_is_typed(hf_tok):
    from dgemma_struct.errors import ConstraintError
    with pytest.raises(ConstraintError):
        compile_constraint(RAW, hf_tok, strict_objects="yes")


@pytest.mark.parametrize("text", ['{"a":1,"b":2,"b":3}', '{"a":1,"":2,"":3}', '{"b":{"":1,"":1}}'])
def test_duplicate_keys_never_valid_in_any_mode(hf_tok, text):
    """llguidance 1.9.1 lets undeclared keys repeat; the re-validator refuses them (a repair, not an answer)."""
    c = compile_constraint({"type": "object", "properties": {"a": {"type": "integer"}}}, hf_tok)
    out = c.validate_text(text)
    assert not out.ok and "duplicate key" in out.errors[0].message
    assert not c.matches(text)
