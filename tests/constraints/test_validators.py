"""The per-kind validators of a compiled constraint (``constraints/constraint.py``) and its kind enum."""
from __future__ import annotations

import pytest
from pydantic import BaseModel, field_validator

from dgemma_struct.constraints import (Choice, ChoiceValidator, Constraint, ConstraintKind, Grammar, GrammarValidator,
                                       JsonValidator, Regex, ValidationOutcome, compile_constraint)
from dgemma_struct.constraints.json_schema import make_validator


def test_kind_is_an_enum_equal_to_its_string(hf_tok):
    c = compile_constraint({"type": "integer"}, tokenizer=hf_tok)
    assert c.kind is ConstraintKind.JSON and c.kind == "json" and f"{c.kind}" == "json" and str(c.kind) == "json"
    assert "kind='json'" in repr(c)
    assert compile_constraint(Regex("a+"), tokenizer=hf_tok).kind is ConstraintKind.REGEX
    assert compile_constraint(Grammar('start: "x"'), tokenizer=hf_tok).kind is ConstraintKind.GRAMMAR
    assert compile_constraint(Choice(["a", "b"]), tokenizer=hf_tok).kind is ConstraintKind.CHOICE
    assert {ConstraintKind.JSON: 1}["json"] == 1  # hashes as its string


def test_each_kind_gets_its_validator(hf_tok):
    assert isinstance(compile_constraint({"type": "integer"}, tokenizer=hf_tok).validator, JsonValidator)
    assert isinstance(compile_constraint(Regex("a+"), tokenizer=hf_tok).validator, GrammarValidator)
    assert isinstance(compile_constraint(Grammar('start: "x"'), tokenizer=hf_tok).validator, GrammarValidator)
    ch = compile_constraint(Choice(["b", "a", "b"]), tokenizer=hf_tok)
    assert isinstance(ch.validator, ChoiceValidator) and ch.choices == ["b", "a"]
    assert compile_constraint({"type": "integer"}, tokenizer=hf_tok).choices is None


def test_json_validator_checks_json_schema_and_model():
    v = JsonValidator(make_validator({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}},
                                      "required": ["n"]}))
    assert v.validate('{"n":3}') == ValidationOutcome(True, {"n": 3}, [])
    bad = v.validate('{"n":-1}')
    assert not bad and bad.value == {"n": -1} and bad.errors[0].path == ("n",)
    assert not v.validate('{"n":1') and "invalid JSON" in v.validate('{"n":1').errors[0].message
    assert not v.validate('{"n":NaN}') and not v.validate('{"n":1e999}')  # not JSON / beyond double
    assert v.schema_issues({"n": -1})[0].path == ("n",) and v.schema_issues({"n": 1}) == []

    class M(BaseModel):
        n: int

        @field_validator("n")
        @classmethod
        def even(cls, x: int) -> int:
            if x % 2:
                raise ValueError("odd")
            return x

    from pydantic import TypeAdapter
    vm = JsonValidator(make_validator(M.model_json_schema()), TypeAdapter(M))
    assert vm.validate('{"n":2}').value == M(n=2)
    out = vm.validate('{"n":3}')
    assert not out and out.errors[0].path == ("n",) and "odd" in out.errors[0].message


def test_json_partial_values():
    p = JsonValidator.partial
    assert p('{"a":[1,2') == {"a": [1, 2]}
    assert p('{"name":"Ad') == {"name": "Ad"}
    assert p("") is None and p("   ") is None and p("}") is None and p(None) is None  # type: ignore[arg-type]


def test_choice_and_grammar_validators(hf_tok):
    v = ChoiceValidator(["yes", "no"])
    assert v.validate("yes").ok and not v.validate("Yes").ok and "not one of" in v.validate("x").errors[0].message
    r = compile_constraint(Regex(r"\d+"), tokenizer=hf_tok)
    assert r.validator.validate("12", r).ok
    out = r.validator.validate("1a", r)
    assert not out and out.errors[0].message == "text does not match the regex"
    with pytest.raises(ValueError):
        r.validator.validate("12")  # a grammar validator needs the constraint


def test_constraint_wraps_raw_validators(hf_tok):
    # subclasses (tool calls, grounding) pass a jsonschema validator or nothing: the kind decides
    c = compile_constraint({"type": "integer"}, tokenizer=hf_tok)
    j = Constraint("json", c.grammar, c.tokenizer_info, schema={"type": "integer"},
                   validator=make_validator({"type": "integer"}))
    assert isinstance(j.validator, JsonValidator) and j.matches("5") and not j.validate_text("x").ok
    g = Constraint("grammar", c.grammar, c.tokenizer_info)
    assert isinstance(g.validator, GrammarValidator) and g.matches("5") and not g.matches("x")
