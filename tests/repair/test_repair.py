"""Offsets, the junk detector and the per-attempt verdicts (no model forward)."""
import pytest

from dgemma_struct.constraints import Regex
from dgemma_struct.options import GenerateOptions
from dgemma_struct.constraints.json_locate import char_to_token_index, error_char_offset, junk_paths, value_offsets
from dgemma_struct.repair.session import Accept, Attempt, Redo, RepairSession, min_length_tokens
from dgemma_struct.repair.preparation import constraint_for
from dgemma_struct.results import GenerationStats


def test_value_offsets_cover_every_path():
    text = '{"a": 1, "b": [true, {"c": "x"}], "d": null}'
    off = value_offsets(text)
    assert off[()] == 0 and text[off[("a",)]] == "1" and text[off[("b", 1, "c")]] == '"'
    assert text.startswith("null", off[("d",)])


def test_value_offsets_of_a_truncated_text_keep_what_was_seen():
    off = value_offsets('{"a":1,"b":[2,')
    assert ("a",) in off and ("b", 0) in off and ("c",) not in off


def test_error_char_offset_is_the_earliest_offending_value():
    text = '{"a":1,"b":"x","c":[1,2]}'
    assert error_char_offset(text, [("c", 1), ("b",)]) == text.index('"x"')
    # a missing property: its deepest known ancestor (the root)
    assert error_char_offset(text, [("zzz",)]) == 0
    assert error_char_offset(text, [("c", 7)]) == text.index("[1")
    assert error_char_offset(text, []) == len(text)


@pytest.mark.parametrize("offset,index", [(0, 0), (1, 0), (2, 1), (4, 2), (6, 3), (99, 3)])
def test_char_to_token_index(offset, index):
    assert char_to_token_index(["ab", "cd", "ef"], offset) == index


def test_junk_paths():
    assert junk_paths({"a": "ok", "b": ["x}", "y"]}) == [("b", 0)]
    assert junk_paths({"a": "x\x01"}) == [("a",)]
    assert junk_paths({"n": 3, "t": "10:30"}) == []


def _session(rt, spec, **knobs):
    opts = GenerateOptions(**knobs)
    return RepairSession(rt, [], constraint_for(spec, rt), opts, seed=0, deadline=None)


def _attempt(rt, text, complete=True, dead_end=False):
    return Attempt(rt.tokenizer.encode(text, add_special_tokens=False), complete, dead_end, GenerationStats())


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "s": {"type": "string"}},
          "required": ["a", "s"]}


def test_a_valid_attempt_is_accepted(tok_runtime):
    s = _session(tok_runtime, SCHEMA)
    v = s.judge(_attempt(tok_runtime, '{"a":1,"s":"hi"}'))
    assert isinstance(v, Accept) and v.outcome.value == {"a": 1, "s": "hi"}


def test_an_invalid_attempt_is_redone_from_the_offending_value(tok_runtime):
    s = _session(tok_runtime, {**SCHEMA, "properties": {**SCHEMA["properties"], "a": {"type": "integer",
                                                                                     "maximum": 5}}})
    a = _attempt(tok_runtime, '{"a":9,"s":"hi"}')
    v = s.judge(a)
    assert isinstance(v, Redo) and v.reasons and s.errors == v.reasons
    assert tok_runtime.tokenizer.decode(v.prefix) == '{"a":'  # the tokens before the bad value are kept


@pytest.mark.parametrize("dead_end", [True, False])
def test_a_dead_end_or_unfinished_attempt_keeps_half(tok_runtime, dead_end):
    s = _session(tok_runtime, SCHEMA)
    a = _attempt(tok_runtime, '{"a":1,"s":"hello wor', complete=False, dead_end=dead_end)
    v = s.judge(a)
    assert isinstance(v, Redo) and v.prefix == a.tokens[: len(a.tokens) // 2]


def test_junk_is_redone_while_repairs_remain_then_the_least_junk_value_wins(tok_runtime):
    s = _session(tok_runtime, SCHEMA, max_repairs=1)
    junky = _attempt(tok_runtime, '{"a":1,"s":"x}"}')
    v = s.judge(junky, attempt=0)
    assert isinstance(v, Redo) and s.stats.junk_repairs == 1 and s.least_junk.junk == 1
    worse = _attempt(tok_runtime, '{"a":2,"s":"}{"}')
    final = s.judge(worse, attempt=1)  # repairs spent: the valid value with the least junk
    assert isinstance(final, Accept) and final.attempt is junky


def test_give_up_without_a_valid_value_is_a_typed_error(tok_runtime):
    from dgemma_struct.errors import GenerationFailed, LengthError

    s = _session(tok_runtime, SCHEMA)
    unfinished = _attempt(tok_runtime, '{"a":1', complete=False)
    s.judge(unfinished)
    assert isinstance(s.give_up(unfinished, 0.0).error, LengthError)
    dead = _attempt(tok_runtime, '{"a":1', complete=False, dead_end=True)
    assert isinstance(s.give_up(dead, 0.0).error, GenerationFailed)


def test_min_length_tokens_counts_the_forced_prefix_and_eos(tok_runtime):
    c = constraint_for(Regex("hello"), tok_runtime)
    assert min_length_tokens(c) == len(tok_runtime.tokenizer.encode("hello", add_special_tokens=False)) + 1
