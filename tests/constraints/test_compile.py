"""compile_constraint: every spec kind, typed errors, keyword split, options, cache."""
from __future__ import annotations

import enum
import json
import typing

import pytest
from pydantic import BaseModel, Field

from dgemma_struct.constraints import (Choice, Constraint, Grammar, JsonSchema, Regex, builtin_grammars,
                                       compile_constraint)
from dgemma_struct.errors import (ChoiceError, ConstraintCompileTimeout, ConstraintError, GrammarError, RegexError,
                                  SchemaError, UnsupportedKeywordError)


class Address(BaseModel):
    city: str
    zip: str = Field(pattern=r"^[0-9]{5}$")


class Person(BaseModel):
    name: str
    age: int = Field(ge=0, le=150)
    tags: list[str] = Field(default_factory=list, max_length=3)
    address: Address


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


def test_pydantic_model(hf_tok):
    c = compile_constraint(Person, tokenizer=hf_tok)
    assert isinstance(c, Constraint) and c.kind == "json"
    assert c.schema["title"] == "Person"
    good = '{"name":"Al","age":3,"tags":["x"],"address":{"city":"P","zip":"12345"}}'
    assert c.matches(good)
    out = c.validate_text(good)
    assert out.ok and isinstance(out.value, Person) and out.value.address.zip == "12345"
    assert not c.matches(good.replace('"age":3', '"age":-3'))
    assert not c.matches(good.replace("12345", "1234"))
    assert not c.matches(good.replace('{"name"', '{ "name"'))  # compact whitespace
    bad = c.validate_text(good.replace('"age":3', '"age":200'))
    assert not bad.ok and bad.errors and bad.errors[0].path == ("age",)
    assert c.vocab_size == len(hf_tok) and c.stop_token_ids == (1, 4)
    assert c.new_matcher() is not None


def test_json_schema_dict_and_wrapper(hf_tok):
    s = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    c1 = compile_constraint(s, tokenizer=hf_tok)
    c2 = compile_constraint(JsonSchema(json.dumps(s)), tokenizer=hf_tok)
    for c in (c1, c2):
        assert c.matches('{"n":5}') and not c.matches('{"n":"5"}') and not c.matches('{}')
        assert c.validate_text('{"n":5}').value == {"n": 5}


def test_python_types_literal_enum(hf_tok):
    assert compile_constraint(int, tokenizer=hf_tok).matches("-12")
    c = compile_constraint(list[str], tokenizer=hf_tok)
    assert c.matches('["a","b"]') and not c.matches('["a",1]')
    assert c.validate_text('["a"]').value == ["a"]
    lit = compile_constraint(typing.Literal["yes", "no"], tokenizer=hf_tok)
    assert lit.kind == "choice" and lit.matches("yes") and not lit.matches("maybe")
    en = compile_constraint(Color, tokenizer=hf_tok)
    assert en.kind == "choice" and en.matches("red") and not en.matches("RED")


def test_regex_choice_grammar(hf_tok):
    r = compile_constraint(Regex(r"[0-9]{3}-[a-z]+"), tokenizer=hf_tok)
    assert r.kind == "regex" and r.matches("123-abc") and not r.matches("12-abc")
    assert r.validate_text("123-abc").value == "123-abc"
    ch = compile_constraint(Choice(["a|b", 'say "hi"', "x.y"]), tokenizer=hf_tok)
    assert ch.kind == "choice"
    assert ch.matches("a|b") and ch.matches('say "hi"') and ch.matches("x.y")
    assert not ch.matches("a") and not ch.matches("xzy")
    g = compile_constraint(Grammar('start: "(" NUM ("," NUM)* ")"\nNUM: /[0-9]+/'), tokenizer=hf_tok)
    assert g.kind == "grammar" and g.matches("(1,22)") and not g.matches("(1,)")


def test_builtin_grammars(hf_tok):
    names = builtin_grammars()
    assert {"arithmetic", "key_value"} <= set(names)
    a = compile_constraint(Grammar("arithmetic"), tokenizer=hf_tok)
    assert a.matches("1+2*(3-4.5)/-6") and not a.matches("1+*2")
    kv = compile_constraint(Grammar(names["key_value"]), tokenizer=hf_tok)
    assert kv.matches('name=Alice;age=42;city="New York"') and not kv.matches("name=")
    assert kv.matches("mode=fast;level=3") and not kv.matches("mode=fast, level=3")


def test_lark_grammar_files(hf_tok, data_dir):
    # outlines' arithmetic grammar, with its `%import common.*` lines resolved by lark
    p = data_dir / "lark-grammars" / "outlines" / "src" / "outlines" / "grammars" / "arithmetic.lark"
    c = compile_constraint(Grammar(p), tokenizer=hf_tok)
    assert c.matches("1+2*(3-4)") and c.matches("(1.5 - 2) / 3")
    assert not c.matches("1+*2") and not c.matches("(1")


def test_dangling_ref_mentions_path(hf_tok):
    with pytest.raises(SchemaError) as ei:
        compile_constraint({"properties": {"a": {"$ref": "#/$defs/nope"}}}, tokenizer=hf_tok)
    assert "#/properties/a" in str(ei.value)


def test_grammar_error_has_line(hf_tok):
    with pytest.raises(GrammarError) as ei:
        compile_constraint(Grammar('start: "a"\nfoo: bar baz\n'), tokenizer=hf_tok)
    assert "used but not defined" in str(ei.value)
    with pytest.raises(GrammarError) as ei:
        compile_constraint(Grammar('start: "a"\n  | "b" )\n'), tokenizer=hf_tok)
    assert "line 2" in str(ei.value).lower()


def test_semantic_keywords_and_strict(hf_tok):
    s = {"type": "object", "properties": {
        "xs": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
        "k": {"oneOf": [{"type": "integer"}, {"type": "number"}]},
        "f": {"type": "string", "format": "no-such-format"},
        "p": {"type": "string", "pattern": "^(?!bad).*$"},
    }, "required": ["xs"]}
    c = compile_constraint(s, tokenizer=hf_tok)
    assert {"uniqueItems", "oneOf", "format", "pattern"} <= set(c.semantic_keywords)
    assert c.matches('{"xs":[1,2]}') and not c.matches('{"xs":[1,1]}')
    assert c.matches('{"xs":[],"k":1.5}') and not c.matches('{"xs":[],"k":1}')  # 1 matches both branches
    assert c.matches('{"xs":[],"p":"good"}') and not c.matches('{"xs":[],"p":"badx"}')
    with pytest.raises(SchemaError) as ei:
        compile_constraint(s, tokenizer=hf_tok, strict=True)
    assert {"uniqueItems", "oneOf"} <= set(ei.value.keywords)
    plain = compile_constraint({"type": "integer"}, tokenizer=hf_tok, strict=True)
    assert plain.semantic_keywords == []


def test_validation_only_keywords(hf_tok):
    cases = [
        ({"type": "array", "contains": {"const": 3}}, "[1,3]", "[1,2]"),
        ({"if": {"type": "integer"}, "then": {"minimum": 0}, "else": {"type": "string"}}, "5", "-5"),
        ({"not": {"type": "string"}}, "5", '"s"'),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, '{"a":1,"b":2}', '{"a":1}'),
        ({"type": "object", "propertyNames": {"maxLength": 2}}, '{"ab":1}', '{"abc":1}'),
    ]
    for schema, good, bad in cases:
        c = compile_constraint(schema, tokenizer=hf_tok)
        assert c.semantic_keywords, schema
        assert c.matches(good), (schema, good)
        assert not c.matches(bad), (schema, bad)


def test_dependent_required_is_compiled_exactly_over_declared_properties(hf_tok):
    """dependentRequired as the anyOf it means: the grammar refuses an email without its phone (the
    repair corpus' case, where the model kept leaving the phone out and spent every repair)."""
    props = {k: {"type": "string"} for k in ("name", "email", "phone", "fax")}
    s = {"type": "object", "properties": props, "required": ["name"], "additionalProperties": False,
         "dependentRequired": {"email": ["phone"], "fax": ["phone", "email"]}}
    c = compile_constraint(s, tokenizer=hf_tok, strict=True)   # nothing left to validation: strict accepts it
    assert not c.semantic_keywords
    for text, ok in (('{"name":"a"}', True), ('{"name":"a","email":"e","phone":"p"}', True),
                     ('{"name":"a","phone":"p"}', True), ('{"name":"a","email":"e"}', False),
                     ('{"name":"a","email":"e","phone":"p","fax":"f"}', True),
                     ('{"name":"a","phone":"p","fax":"f"}', False)):
        assert c.grammar_accepts(text) is ok and c.matches(text) is ok, text
    # more keys than DEPENDENT_BRANCHES, or an undeclared name: left to validation, as before
    many = dict(s, properties={**props, "x": {"type": "string"}},
                dependentRequired={"email": ["phone"], "fax": ["x"], "phone": ["x"], "x": ["name"]})
    assert "dependentRequired" in compile_constraint(many, tokenizer=hf_tok).semantic_keywords
    undeclared = {"type": "object", "properties": {"a": {}}, "dependentRequired": {"a": ["b"]}}
    assert "dependentRequired" in compile_constraint(undeclared, tokenizer=hf_tok).semantic_keywords


def test_one_of_required_lists_is_compiled_exactly_over_declared_properties(hf_tok):
    """"either radius, or length and width": exactly one branch holds, in the grammar (llguidance reads
    oneOf as anyOf, so a draft with both alternatives was refused by validation and repaired)."""
    props = {k: {"type": "number"} for k in ("length", "radius", "width")}
    s = {"type": "object", "properties": props, "oneOf": [{"required": ["length", "width"]}, {"required": ["radius"]}]}
    c = compile_constraint(s, tokenizer=hf_tok, strict=True)
    assert not c.semantic_keywords
    for text, ok in (('{"length":1,"width":2}', True), ('{"radius":3}', True), ('{"length":1,"radius":3}', True),
                     ('{"length":1,"width":2,"radius":3}', False), ('{}', False), ('{"width":2}', False)):
        assert c.grammar_accepts(text) is ok and c.matches(text) is ok, text
    # no pattern meets it where the object must be written: an error; where it is optional: left out
    sat = {"type": "object", "properties": {"m": dict(s, required=["length", "radius", "width"]), "n": {}},
           "required": ["m"]}
    with pytest.raises(SchemaError, match="unsatisfiable"):
        compile_constraint(sat, tokenizer=hf_tok)
    c = compile_constraint(dict(sat, required=["n"]), tokenizer=hf_tok)
    assert c.matches('{"n":1}') and not c.grammar_accepts('{"m":{"length":1,"radius":3,"width":2},"n":1}')
    # an undeclared name, other keywords in a branch, or too many names: left to validation, as before
    for one_of in ([{"required": ["x"]}, {"required": ["radius"]}], [{"required": ["radius"], "minProperties": 2},
                                                                      {"required": ["length"]}]):
        assert "oneOf" in compile_constraint(dict(s, oneOf=one_of), tokenizer=hf_tok).semantic_keywords
    wide = {"type": "object", "properties": {k: {} for k in "abcdef"},
            "oneOf": [{"required": ["a", "b", "c"]}, {"required": ["d", "e", "f"]}]}
    assert "oneOf" in compile_constraint(wide, tokenizer=hf_tok).semantic_keywords


def test_whitespace_and_separators(hf_tok):
    s = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
         "required": ["a", "b"], "additionalProperties": False}
    compact = compile_constraint(s, tokenizer=hf_tok)
    assert compact.matches('{"a":1,"b":2}') and not compact.matches('{"a": 1, "b": 2}')
    spaced = compile_constraint(s, tokenizer=hf_tok, separators=(", ", ": "))
    assert spaced.matches('{"a": 1, "b": 2}') and not spaced.matches('{"a":1,"b":2}')
    flexible = compile_constraint(s, tokenizer=hf_tok, whitespace="model")
    assert flexible.matches('{ "a" : 1 ,\n "b": 2}') and flexible.matches('{"a":1,"b":2}')
    # property order follows the schema
    assert not compact.matches('{"b":2,"a":1}')


def test_cache(hf_tok):
    s = {"type": "object", "properties": {"zz": {"type": "boolean"}}}
    a = compile_constraint(s, tokenizer=hf_tok)
    before = compile_constraint.cache_info()
    b = compile_constraint(json.loads(json.dumps(s)), tokenizer=hf_tok)
    assert a is b and compile_constraint.cache_info().hits == before.hits + 1
    c = compile_constraint(s, tokenizer=hf_tok, whitespace="model")
    assert c is not a


def test_custom_stop_ids_and_vocab_padding(hf_tok):
    c = compile_constraint(Regex("ab"), tokenizer=hf_tok, stop_token_ids=[4], vocab_size=1300)
    assert c.stop_token_ids == (4,) and c.vocab_size == 1300
    w = c.canvas_walker()
    assert bitmask_bits(w.mask(), 1300) == {hf_tok.convert_tokens_to_ids("a"), *_starts(hf_tok, "ab")}
    w.commit(hf_tok.encode("ab"))
    assert bitmask_bits(w.mask(), 1300) == {4}  # only the custom stop id; never eos=1, never ids >= 1186


def _starts(tok, text):
    return {i for s, i in tok.get_vocab().items() if s and text.startswith(s) and i > 5}


def bitmask_bits(row, V):
    from dgemma_struct.constraints import bitmask_to_bool
    import numpy as np
    return set(np.flatnonzero(bitmask_to_bool(row[None], V)[0]).tolist())


def test_compile_limits_are_typed(hf_tok, monkeypatch):
    # with tiny engine limits a large grammar / schema must fail fast with a typed error
    import dgemma_struct.constraints.safety as S

    monkeypatch.setattr(S, "PARSER_LIMITS", dict(max_grammar_size=200, initial_lexer_fuel=2_000, max_lexer_states=50))
    with pytest.raises(ConstraintCompileTimeout):
        compile_constraint(Grammar("start: " + " | ".join(f'"w{i}"' for i in range(300))), tokenizer=hf_tok,
                           use_cache=False)
    big = {"type": "object", "properties": {f"k{i}": {"type": "string", "pattern": "[a-z]{3,40}"} for i in range(40)},
           "required": [f"k{i}" for i in range(40)]}
    with pytest.raises(ConstraintCompileTimeout):
        compile_constraint(big, tokenizer=hf_tok, use_cache=False)


def test_outlines_output_types_are_specs(hf_tok):
    ot = pytest.importorskip("outlines.types", reason="outlines is not installed (pip install outlines)")
    r = compile_constraint(ot.Regex(r"\d{3}-\d{4}"), tokenizer=hf_tok)
    assert r.matches("555-1234") and not r.matches("5551234")
    js = compile_constraint(ot.JsonSchema({"type": "object", "properties": {"a": {"type": "integer"}},
                                           "required": ["a"]}), tokenizer=hf_tok)
    assert js.matches('{"a":3}') and not js.matches('{"a":"3"}')
    g = compile_constraint(ot.CFG('start: "a"+'), tokenizer=hf_tok)
    assert g.matches("aaa") and not g.matches("ab")
    e = compile_constraint(ot.either("yes", "no"), tokenizer=hf_tok)
    assert e.matches("yes") and not e.matches("maybe")
    i = compile_constraint(ot.integer, tokenizer=hf_tok)
    assert i.matches("-42") and not i.matches("4.2")
