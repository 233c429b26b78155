"""Re-validation closes engine holes (issue 23): known llguidance 1.9.1 bugs never yield an invalid
value as a success -- the independent validator (jsonschema / the grammar's parser) decides."""
from __future__ import annotations

import jsonschema
import pytest

from dgemma_struct import Grammar
from dgemma_struct.constraints import compile_constraint
from dgemma_struct.constraints.grammars import _regroup_stacked_quantifiers

PREFIX_SCHEMAS = [
    # JSON-Schema-Test-Suite draft2020-12 uniqueItems: "uniqueItems with an array of items and additionalItems=false"
    {"$schema": "https://json-schema.org/draft/2020-12/schema",
     "prefixItems": [{"type": "boolean"}, {"type": "boolean"}], "uniqueItems": True, "items": False},
    {"prefixItems": [{"type": "boolean"}, {"type": "boolean"}], "additionalItems": False, "uniqueItems": True},
]
ARRAYS = [[False, True], [True, False], [False, False], [True, True], [False, True, None], [1]]


@pytest.mark.parametrize("schema", PREFIX_SCHEMAS)
def test_prefix_items_engine_hole_is_caught_by_validation(hf_tok, schema):
    import json
    c = compile_constraint(schema, hf_tok)
    holes = 0
    for value in ARRAYS:
        text = json.dumps(value, separators=(",", ":"))
        valid = jsonschema.validators.validator_for(schema)(schema).is_valid(value)
        holes += c.grammar_accepts(text) and not valid
        assert c.matches(text) is valid, text              # never an invalid array as a success
        assert c.validate_text(text).ok is valid, text
    assert holes >= 2  # the engine does accept invalid arrays: this test is about validation catching them


def test_gbnf_to_lark_dropped_parentheses_are_restored(hf_tok):
    from llguidance.gbnf_to_lark import gbnf_to_lark
    assert "/[x]/**" in gbnf_to_lark("root ::= ( [x]* )*")  # the engine bug (llguidance 1.9.1)
    g = compile_constraint(Grammar("root ::= ( [x]* )*"), hf_tok)  # was "invalid Lark grammar"
    for text, ok in [("", True), ("x", True), ("xxxx", True), ("y", False), ("xy", False)]:
        assert g.matches(text) is ok, text
    ab = compile_constraint(Grammar('root ::= ( "ab"+ )* "c"'), hf_tok)
    for text, ok in [("c", True), ("abc", True), ("ababc", True), ("abac", False), ("ab", False)]:
        assert ab.matches(text) is ok, text


def test_regroup_leaves_literals_and_comments_alone():
    assert _regroup_stacked_quantifiers('a: /x*?/ "+*" // c **\n') == 'a: /x*?/ "+*" // c **\n'
    assert _regroup_stacked_quantifiers("a: b?+ (c)*") == "a: (b?)+ (c)*"
    assert _regroup_stacked_quantifiers("a: x (b c)+*") == "a: x ((b c)+)*"


def test_draft7_tuple_with_additional_items_false_accepts_valid_tuples(hf_tok):
    """The grammar copy spells draft-07 tuples as 2020-12 ``prefixItems``; under the draft-07
    ``$schema`` llguidance read the rewritten ``items: false`` as "no items" and refused ``[false,true]``."""
    schema = {"$schema": "http://json-schema.org/draft-07/schema#",
              "items": [{"type": "boolean"}, {"type": "boolean"}], "additionalItems": False}
    c = compile_constraint(schema, hf_tok)
    for text, ok in [("[false,true]", True), ("[true]", True), ("[]", True), ("[false,true,null]", False),
                     ("[1]", False)]:
        assert c.matches(text) is ok, text


STALE_SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                "required": ["b"], "additionalProperties": False}


def _stale_walker(hf_tok):
    """A walker whose frozen matcher went ``{"b":"`` (mask computed), ``"}``, rolled back, then ``a":"``
    -- what a closing search from ``{"`` does before the model writes ``a``."""
    c = compile_constraint(STALE_SCHEMA, hf_tok)
    enc = lambda s: hf_tok.encode(s, add_special_tokens=False)  # noqa: E731
    w = c.canvas_walker()
    w.commit(enc('{"'))
    with w.frozen_cursor() as cur:
        assert cur.advance(enc('b":"'))
        w.mask_of(cur.m)
        assert cur.advance(enc('"}'))
    w.commit(enc('a":"'))
    return c, w, enc


def test_llguidance_mask_after_a_rollback_can_allow_what_it_refuses(hf_tok):
    """The engine bug behind StaleMaskError (llguidance 1.9.1): after the moves above the mask allows
    ``"}`` (``b`` is required), consuming refuses it, and a fresh matcher's mask does not allow it.
    When this fails the engine is mended and the retries on StaleMaskError can go."""
    from dgemma_struct.constraints.bitmask_np import bitmask_allows

    c, w, enc = _stale_walker(hf_tok)
    (close,) = enc('"}')
    fresh = c.new_matcher()
    assert fresh.consume_tokens(w.frozen_tokens)
    assert not bitmask_allows(w.mask_of(fresh), close)
    with w.frozen_cursor() as cur:
        assert bitmask_allows(w.mask_of(cur.m), close) and not cur.advance([close])


def test_a_stale_mask_neither_fails_a_closing_plan_nor_a_walk(hf_tok):
    """A closing plan and a draft walk from that state: the walker rebuilds its matcher and answers;
    before, the plan raised ConstraintEngineError ("refused closing tokens it allowed") and the
    request failed (4 of 90 requests of evaluate_splits(n=30) on the embedded model)."""
    import json

    from dgemma_struct.constraints.closing import closing_plan

    c, w, enc = _stale_walker(hf_tok)
    plan = closing_plan(w, None, None, 16)   # the closing candidates of the constraint's tokenizer
    assert plan is not None
    text = hf_tok.decode(w.frozen_tokens + plan)
    assert json.loads(text)["b"] == "" and c.matches(text), text
    c, w, enc = _stale_walker(hf_tok)
    res = w.walk(enc('"}'))
    assert res.n_valid == 0 and not res.stopped
    assert not res.bitmasks[0][enc('"}')[0] >> 5] >> (enc('"}')[0] & 31) & 1   # the row is exact again
