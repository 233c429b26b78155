"""Unicode property escapes (``\\p{Letter}``, ``\\P{Lu}``, ``\\p{Script=Greek}``) in JSON Schema
``pattern`` / ``patternProperties``: ECMA-262 (Unicode mode) and llguidance read them, Python's ``re`` (which
runs ``jsonschema``'s checks) does not, so such schemas used to be refused as "not a 'regex'".
:func:`~dgemma_struct.constraints.regex_ascii.re_pattern` spells them out as code-point classes for
validation; the grammar handed to llguidance keeps them as written. The generation side (grammar) and
validation must agree, and neither may accept a value the pattern refuses."""
from __future__ import annotations

import json
import random
import re

import pytest

from dgemma_struct.constraints import Regex, compile_constraint
from dgemma_struct.constraints.json_schema import make_validator
from dgemma_struct.constraints.regex_ascii import re_pattern, re_schema
from dgemma_struct.constraints.schema_checks import iter_subschemas
from dgemma_struct.errors import SchemaError

regex = pytest.importorskip("regex")

LETTERS = {"Hello": True, "héllo": True, "π": True, "Ωμέγα": True, "日本": True,
           "h3llo": False, "123": False, "a b": False, "": False, "h_llo": False}


def test_patterns_without_property_escapes_are_returned_as_they_are():
    for p in (r"^[a-z]+$", r"\d+\.\w", r"\\p{L}", ""):
        assert re_pattern(p) == p


@pytest.mark.parametrize("pattern", [r"\p{NoSuchProperty}", r"\pL", r"\p{L", r"[\p{L}-z]", r"[a-\p{L}]",
                                     r"\P{Any}"])
def test_unknown_unbraced_empty_or_range_endpoint_properties_are_refused(pattern):
    assert re_pattern(pattern) is None


@pytest.mark.parametrize("pattern", [r"^\p{Letter}+$", r"^\p{L}+$", r"^\p{Lu}\p{Ll}*$", r"^[\p{L}\d_]+$",
                                     r"^[^\P{L}]+$", r"^\P{L}+$", r"^[\p{L}-]+$", r"^\p{Script=Greek}+$",
                                     r"^\p{gc=Nd}+$", r"^[^\p{L}\p{Nd}]$", r"\p{Lu}", r"^\p{Letter}\\p$"])
def test_spelled_out_pattern_matches_what_the_regex_module_matches(pattern):
    ours = re.compile(re_pattern(pattern))
    theirs = regex.compile(pattern)
    rnd = random.Random(0)
    samples = list(LETTERS) + ["-", "_", "٣٤", "ǅ", "Σσ", "\U00010330", "𝒜", "\\p", "A\\p"]
    pool = [chr(c) for c in range(0x250)] + [chr(rnd.randrange(0x110000)) for _ in range(3000)]
    samples += ["".join(rnd.choice(pool) for _ in range(rnd.randint(1, 3))) for _ in range(3000)]
    for s in samples:
        assert bool(ours.search(s)) == bool(theirs.search(s)), (pattern, s)


@pytest.fixture(scope="module")
def letters(hf_tok):
    return compile_constraint({"type": "string", "pattern": "^\\p{Letter}+$"}, tokenizer=hf_tok, use_cache=False)


@pytest.mark.parametrize("word, ok", list(LETTERS.items()))
def test_letter_pattern_grammar_and_validation_agree(letters, word, ok):
    text = json.dumps(word, ensure_ascii=False)
    assert letters.grammar_accepts(text) is ok          # llguidance reads \p{Letter} itself
    assert letters.validator.validate(text).ok is ok    # validation spells it out for Python's re
    assert letters.matches(text) is ok


def test_the_grammar_keeps_the_property_escape(letters):
    assert "pattern" not in letters.semantic_keywords   # enforced by the grammar, not left to validation


def test_regex_constraint_reads_property_escapes(hf_tok):
    c = compile_constraint(Regex(r"\p{Letter}+"), tokenizer=hf_tok, use_cache=False)
    assert c.grammar_accepts("héllo") and c.grammar_accepts("π")
    assert not c.grammar_accepts("h3llo")


def test_pattern_properties_with_property_escapes(hf_tok):
    schema = {"type": "object", "patternProperties": {"^\\p{Letter}+$": {"type": "number"}},
              "additionalProperties": False}
    c = compile_constraint(schema, tokenizer=hf_tok, use_cache=False)
    for value, ok in [({"π": 1}, True), ({"héllo": 2, "abc": 3}, True), ({"π": "x"}, False),
                      ({"123": 1}, False), ({"h3llo": 1}, False)]:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        assert c.validator.validate(text).ok is ok, value
        assert c.matches(text) is ok, value
    # the message names the pattern as written, not its 10 kB spelling
    issues = c.validator.validate('{"123":1}').errors
    assert issues and all(len(i.message) < 200 for i in issues), issues
    assert "p{Letter}" in issues[0].message


def test_unevaluated_properties_and_property_names_read_property_escapes():
    v = make_validator({"patternProperties": {"^\\p{Lu}": True}, "unevaluatedProperties": False,
                        "propertyNames": {"pattern": "^\\p{L}+$"}})
    assert v.is_valid({"Émile": 1})
    assert not v.is_valid({"émile": 1})   # not upper-case first: unevaluated
    assert not v.is_valid({"É1": 1})      # property name is not all letters


def test_re_schema_leaves_pattern_free_schemas_and_values_alone():
    plain = {"patternProperties": {"^a": {}}, "const": {"patternProperties": {"\\p{L}": 1}}}
    assert re_schema(plain, iter_subschemas) is plain
    spelled = re_schema({"patternProperties": {"\\p{L}": {"const": {"\\p{L}": 1}}}}, iter_subschemas)
    (key, sub), = spelled["patternProperties"].items()
    assert key.startswith("[\\u0041") and sub == {"const": {"\\p{L}": 1}}


def test_unknown_property_is_a_schema_error(hf_tok):
    with pytest.raises(SchemaError):
        compile_constraint({"type": "string", "pattern": "^\\p{NoSuchProperty}$"}, tokenizer=hf_tok, use_cache=False)
