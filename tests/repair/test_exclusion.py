"""The exclusion rule (issue #32) without a model forward: the JSON path scanner, the repair plan of
each error shape, bans on a real tokenizer (masks and commits agree byte for byte), the forced-point
cut of an enum value, and GenerationFailed naming each rejected value once."""
import numpy as np
import pytest

from dgemma_struct.constraints.bitmask_np import bitmask_allows
from dgemma_struct.constraints.json_locate import Ban, repair_plan
from dgemma_struct.constraints.json_scan import JsonScan
from dgemma_struct.constraints.json_schema import iter_issues  # noqa: F401 - the validator the plans read
from dgemma_struct.errors import GenerationFailed
from dgemma_struct.guide.exclusion import Exclusion, TokenBytes, sharpen
from dgemma_struct.options import GenerateOptions
from dgemma_struct.repair.preparation import constraint_for
from dgemma_struct.repair.session import Attempt, Redo, RepairSession
from dgemma_struct.results import GenerationStats


class Issue:
    def __init__(self, path, message, superfluous=False):
        self.path, self.message, self.superfluous = tuple(path), message, superfluous


def test_the_scanner_reports_each_value_with_its_path_as_it_ends():
    s = JsonScan()
    ended = s.feed(b'{"a":[1,{"b":"x\\"}"}],"n":12')
    assert [(e.path, e.start, e.end) for e in ended] == [(("a", 0), 6, 7), (("a", 1, "b"), 13, 19),
                                                        (("a", 1), 8, 20), (("a",), 5, 21)]
    assert s.in_scalar() and s.open_values()[-1] == (("n",), 26)
    assert [tuple(e)[:3] for e in s.feed(b"}")] == [(("n",), 26, 28), ((), 0, 29)]


@pytest.mark.parametrize("text,issue,offset,bans,rejected", [
    # a leaf: renoise from it, ban it
    ('{"d":"0020-01-01","n":3}', (("d",), "in the past"), 5, [(("d",), b'"0020-01-01"', False)], ("d",)),
    # a number is banned as a delimited literal
    ('{"n":45}', (("n",), "too old"), 5, [(("n",), b"45", False)], ("n",)),
    # uniqueItems: the first duplicate, renoised from the end of the item before it (the array may close
    # there); every earlier item is banned at its position
    ('{"s":["go","sql","go"]}', (("s",), "['go', 'sql', 'go'] has non-unique elements"), 16,
     [(("s", 2), b'"go"', False), (("s", 2), b'"sql"', False)], ("s", 2)),
    # a superfluous item (written once more than the source holds it): from the end of the item before
    # it, its text banned there and at every later place up to one past the written length
    ('{"s":["go","sql","sql","c"]}', (("s", 2), "written more often than the source", True), 16,
     [(("s", 2), b'"sql"', False), (("s", 3), b'"sql"', False), (("s", 4), b'"sql"', False)], ("s", 2)),
    # ... the first item: from just after the array's "["
    ('{"s":["go"]}', (("s", 0), "not there", True), 6, [(("s", 0), b'"go"', False), (("s", 1), b'"go"', False)],
     ("s", 0)),
    # a missing dependency: from the present property the message names (its comma included)
    ('{"n":"a","e":"x","c":"y"}', ((), "'p' is a dependency of 'e'"), 8, [((), b'{"n":"a","e":"x","c":"y"}', False)],
     ()),
    # a model validator: from the last value; the object, and its text through that value as a prefix
    ('{"r":"suite","k":2}', ((), "Value error, a suite needs three nights"), 17,
     [((), b'{"r":"suite","k":2}', False), ((), b'{"r":"suite","k":2', True)], ()),
    # a model validator naming members as words: from the earliest one present, the object banned
    ('{"g":"A","check_in":"2024-08-10","check_out":"0004-01-01"}',
     ((), "Value error, check_out must be after check_in"), 8,
     [((), b'{"g":"A","check_in":"2024-08-10","check_out":"0004-01-01"}', False)], ()),
    # contains: from the last item, the array banned
    ('{"s":["go","c"]}', (("s",), "does not contain items matching"), 11, [(("s",), b'["go","c"]', False)], ("s",)),
    # a path deeper than the text: its deepest ancestor
    ('{"a":{"b":1}}', (("a", "zz", 3), "'zz' is a required property"), 10, [(("a",), b'{"b":1}', False)], ("a",)),
])
def test_the_repair_plan_of_each_error_shape(text, issue, offset, bans, rejected):
    plan = repair_plan(text, [Issue(*issue)])
    assert plan.offset == offset
    assert [(b.path, b.text, b.prefix) for b in plan.bans] == bans
    assert [r.path for r in plan.rejected] == [rejected]
    # only a superfluous item or a duplicate after the first item offers the ban that ends its array before it
    assert [(b.path, b.text, b.prefix) for b, _ in plan.closing] == (
        [(("s",), b'["go","sql",', True)] if issue[1].startswith(("written more", "['go'")) else [])


def _ids(rt, text):
    return rt.tokenizer.encode(text, add_special_tokens=False)


def _exclusion(rt, constraint, bans):
    return Exclusion(bans, TokenBytes.of(constraint.tokenizer_info))


SCHEMA = {"type": "object", "properties": {"d": {"type": "string"}, "n": {"type": "integer"},
                                           "r": {"enum": ["single", "double", "suite"]}},
          "required": ["d", "n", "r"], "additionalProperties": False}


def test_masks_and_commits_agree_on_a_real_tokenizer(tok_runtime):
    c = constraint_for(SCHEMA, tok_runtime)
    ex = _exclusion(tok_runtime, c, [Ban(("d",), b'"ab"'), Ban(("n",), b"12")])
    prefix = _ids(tok_runtime, '{"d":')
    # after '"ab' the mask removes exactly the tokens a commit refuses: those that start with '"'
    full = np.full((1, c.canvas_walker().n_words), -1, dtype=np.int32)
    inside = prefix + _ids(tok_runtime, '"ab')
    masked, n = ex.masks(inside, [], full)
    removed = {t for t in range(c.vocab_size) if not bitmask_allows(masked[0], t)}
    refused = {t for t in range(c.vocab_size) if ex.admissible(inside, [t]) == 0}
    tb = TokenBytes.of(c.tokenizer_info)
    assert removed and refused == {t for t in removed if t < len(tb.bytes) and tb.bytes[t]}
    assert all(tb.bytes[t].startswith(b'"') for t in refused)
    # byte by byte: "ab" in any tokenization is refused at its closing quote, "abc" is not
    for text in ('"ab"', '"a' + 'b"'):
        toks = _ids(tok_runtime, text)
        assert ex.admissible(prefix, toks) < len(toks)
    assert ex.admissible(prefix, _ids(tok_runtime, '"abc",')) == len(_ids(tok_runtime, '"abc",'))
    # a number: 12 only once a byte ends it; 123 and 1 stay allowed
    at_n = _ids(tok_runtime, '{"d":"x","n":')
    assert ex.admissible(at_n, _ids(tok_runtime, "12,")) < len(_ids(tok_runtime, "12,"))
    assert ex.admissible(at_n, _ids(tok_runtime, "123,")) == len(_ids(tok_runtime, "123,"))
    after_12 = at_n + _ids(tok_runtime, "12")
    row, _ = ex.masks(after_12, [], full)
    comma = _ids(tok_runtime, ",")[0]
    assert not bitmask_allows(row[0], comma) and not bitmask_allows(row[0], c.eos_token_id)
    assert bitmask_allows(row[0], _ids(tok_runtime, "3")[0])


def test_an_enum_value_is_banned_where_the_grammar_decides_it(tok_runtime):
    c = constraint_for(SCHEMA, tok_runtime)
    text = '{"d":"x","n":1,"r":"single"}'
    toks = _ids(tok_runtime, text)
    pieces = [tok_runtime.tokenizer.decode([t]) for t in toks]
    start = text.index('"single"')
    ban = sharpen(Ban(("r",), b'"single"'), (start, start + 8), c.canvas_walker(), toks, pieces,
                  TokenBytes.of(c.tokenizer_info))
    assert ban == Ban(("r",), b'"si', prefix=True, delimited=False)   # "s" could still be "suite"
    # nothing after the ban's text can avoid "single": so no token may reach it
    ex = _exclusion(tok_runtime, c, [ban])
    at_r = _ids(tok_runtime, '{"d":"x","n":1,"r":')
    assert ex.admissible(at_r, _ids(tok_runtime, '"single"')) < len(_ids(tok_runtime, '"single"'))
    assert ex.admissible(at_r, _ids(tok_runtime, '"suite"')) == len(_ids(tok_runtime, '"suite"'))


def _session(rt, spec, **knobs):
    return RepairSession(rt, [], constraint_for(spec, rt), GenerateOptions(**knobs), seed=0, deadline=None)


def test_generation_failed_names_each_rejected_value_once(tok_runtime):
    s = _session(tok_runtime, {"type": "object", "properties": {"n": {"type": "integer", "maximum": 10}},
                               "required": ["n"]})
    for text in ('{"n":45}', '{"n":46}', '{"n":45}'):   # the third could only come without the rule
        v = s.judge(Attempt(_ids(tok_runtime, text), True, False, GenerationStats()))
        assert isinstance(v, Redo)
    assert s.bans == [Ban(("n",), b"45"), Ban(("n",), b"46")]
    err = s.give_up(None, 0.0).error
    assert isinstance(err, GenerationFailed)
    assert [(r["path"], r["value"], r["times"]) for r in err.rejected] == [("/n", "45", 2), ("/n", "46", 1)]
    assert len(err.errors) == 2 and str(err).count("45") == 2   # once as the value, once in its message
    assert s.exclusion() is not None and s.guide_for([]).rows[0].exclusion is not None


def test_a_dead_end_in_exhausted_values_moves_the_ban_back(tok_runtime):
    from typing import Literal

    from pydantic import BaseModel, model_validator

    class Stay(BaseModel):
        r: Literal["single", "suite"]
        b: bool

        @model_validator(mode="after")
        def _no_suite(self):
            if self.r == "suite":
                raise ValueError("no suite")
            return self

    s = _session(tok_runtime, Stay)
    for text in ('{"r":"suite","b":false}', '{"r":"suite","b":true}'):
        assert isinstance(s.judge(Attempt(_ids(tok_runtime, text), True, False, GenerationStats())), Redo)
    # the booleans were banned where the grammar decides them: at their first byte
    assert {b.text for b in s.bans if b.prefix} >= {b'{"r":"suite","b":f', b'{"r":"suite","b":t'}
    # the next attempt stops where both are gone: the ban moves to where "suite" is decided
    v = s.judge(Attempt(_ids(tok_runtime, '{"r":"suite","b":'), False, True, GenerationStats()))
    assert Ban((), b'{"r":"su', prefix=True, delimited=False) in s.bans
    kept = tok_runtime.tokenizer.decode(v.prefix)
    assert not kept.startswith('{"r":"su')


def test_two_rejections_sharing_a_start_ban_that_start(tok_runtime):
    """An AfterValidator ("no spaces") rejected ' ', then ' Ito': each banned alone, the model kept the
    leading space; the start both share is banned too, so the next attempt cannot begin that way."""
    from typing import Annotated

    from pydantic import AfterValidator, BaseModel

    def _no_space(v: str) -> str:
        if " " in v:
            raise ValueError("no spaces allowed")
        return v

    class Account(BaseModel):
        handle: Annotated[str, AfterValidator(_no_space)]

    s = RepairSession(tok_runtime, [], constraint_for(Account, tok_runtime), GenerateOptions(), seed=0, deadline=None)
    for text in ('{"handle":" "}', '{"handle":" Ito"}'):
        s.judge(Attempt(_ids(tok_runtime, text), True, False, GenerationStats()))
    assert Ban(("handle",), b'" ', prefix=True, delimited=False) in s.bans
    ex = _exclusion(tok_runtime, s.c, s.bans)
    assert ex.admissible([], _ids(tok_runtime, '{"handle":" x"}')) < len(_ids(tok_runtime, '{"handle":" x"}'))
    ok = _ids(tok_runtime, '{"handle":"jdoe"}')
    assert ex.admissible([], ok) == len(ok)


def test_a_repeated_grounded_item_is_renoised_so_the_list_may_close(tok_runtime):
    """A grounded list whose last item the model drafted twice ("rendering" is written once): the repair
    keeps the list up to the first "rendering", and from there the list may close but not repeat it."""
    from dgemma_struct.grounding import compile_grounded

    schema = {"type": "object", "properties": {"b": {"type": "array", "items": {"type": "string"}}},
              "required": ["b"], "additionalProperties": False}
    c = compile_grounded(schema, tok_runtime.tokenizer, source="Bindings: collapse, rendering.", ground="strings")
    s = RepairSession(tok_runtime, [], c, GenerateOptions(), seed=0, deadline=None)
    v = s.judge(Attempt(_ids(tok_runtime, '{"b":["collapse","rendering","rendering"]}'), True, False,
                        GenerationStats()))
    assert isinstance(v, Redo) and s.bans == [Ban(("b", 2), b'"rendering"'), Ban(("b", 3), b'"rendering"')]
    kept = tok_runtime.tokenizer.decode(v.prefix)
    assert '{"b":["collapse","rendering'.startswith(kept) and kept.startswith('{"b":["collapse"')
    ex = _exclusion(tok_runtime, c, s.bans)
    at = _ids(tok_runtime, '{"b":["collapse","rendering"')
    assert ex.admissible(at, _ids(tok_runtime, "]}")) == len(_ids(tok_runtime, "]}"))
    again = _ids(tok_runtime, ',"rendering"]}')
    assert ex.admissible(at, again) < len(again)


def test_a_second_repeated_grounded_item_in_the_same_list_ends_the_list_there(tok_runtime):
    """The model repeats an item on the repair too (a longer list, the repeat one place on): the
    second repair keeps the list up to the item before it and may only close it there, so the
    repairs converge without the AR fallback. The first repair does not close it: another item may follow."""
    from dgemma_struct.grounding import compile_grounded

    schema = {"type": "object", "properties": {"b": {"type": "array", "items": {"type": "string"}}},
              "required": ["b"], "additionalProperties": False}
    c = compile_grounded(schema, tok_runtime.tokenizer, source="Bindings: collapse, rendering, scale.",
                         ground="strings")
    s = RepairSession(tok_runtime, [], c, GenerateOptions(), seed=0, deadline=None)
    first = s.judge(Attempt(_ids(tok_runtime, '{"b":["collapse","rendering","rendering"]}'), True, False,
                            GenerationStats()))
    assert isinstance(first, Redo) and not any(b.prefix for b in s.bans)
    at = _ids(tok_runtime, '{"b":["collapse","rendering"')
    another = _ids(tok_runtime, ',"scale"]}')
    assert _exclusion(tok_runtime, c, s.bans).admissible(at, another) == len(another)
    second = s.judge(Attempt(_ids(tok_runtime, '{"b":["collapse","rendering","scale","collapse"]}'), True, False,
                             GenerationStats()), 1)
    assert isinstance(second, Redo)
    assert Ban(("b",), b'["collapse","rendering","scale",', prefix=True, delimited=False) in s.bans
    ex = _exclusion(tok_runtime, c, s.bans)
    at = _ids(tok_runtime, '{"b":["collapse","rendering","scale"')
    assert ex.admissible(at, _ids(tok_runtime, "]}")) == len(_ids(tok_runtime, "]}"))
    for more in (',"collapse"]}', ',"scale"]}'):
        assert ex.admissible(at, _ids(tok_runtime, more)) == 0, more
    # a list that differs before that point is not closed by it
    assert ex.admissible(_ids(tok_runtime, '{"b":["scale"'), _ids(tok_runtime, ',"collapse"]}')) > 0


def test_a_second_duplicate_in_the_same_unique_list_ends_the_list_there(tok_runtime):
    """uniqueItems: the first repair restarts after the item before the duplicate (the list may go on
    with another item); a duplicate again in that list on the next attempt ends the list there."""
    schema = {"type": "object", "properties": {"s": {"type": "array", "items": {"type": "string"},
                                                     "uniqueItems": True}}, "required": ["s"]}
    c = constraint_for(schema, tok_runtime)
    s = RepairSession(tok_runtime, [], c, GenerateOptions(), seed=0, deadline=None)
    assert isinstance(s.judge(Attempt(_ids(tok_runtime, '{"s":["go","sql","go"]}'), True, False, GenerationStats())),
                      Redo)
    assert not any(b.prefix for b in s.bans)
    assert isinstance(s.judge(Attempt(_ids(tok_runtime, '{"s":["go","sql","c","sql"]}'), True, False,
                                      GenerationStats()), 1), Redo)
    assert Ban(("s",), b'["go","sql","c",', prefix=True, delimited=False) in s.bans
    ex = _exclusion(tok_runtime, c, s.bans)
    at = _ids(tok_runtime, '{"s":["go","sql","c"')
    assert ex.admissible(at, _ids(tok_runtime, "]}")) == len(_ids(tok_runtime, "]}"))
    assert ex.admissible(at, _ids(tok_runtime, ',"x"]}')) == 0
