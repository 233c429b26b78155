"""The closing module's pieces (``constraints/closing.py``): JSON string state, state keys, byte
representatives, candidate scans, the guide's closers and the greedy fill, on the walker's public state."""
from __future__ import annotations

import numpy as np

from dgemma_struct.constraints import Regex, closer_ids, closing_candidates, closing_plan, compile_constraint
from dgemma_struct.constraints.closing import (byte_representatives, _has_format, json_string_state,
                                               segment_punct, greedy_fill)


def test_json_string_state():
    assert json_string_state(b'{"a":"x', False, False) == (True, False)
    assert json_string_state(b'{"a":"x\\', False, False) == (True, True)
    assert json_string_state(b'"', True, True) == (True, False)  # an escaped quote stays in the string
    assert json_string_state(b'x"}', True, False) == (False, False)


def test_has_format_and_segment_punct():
    assert _has_format({"properties": {"d": {"type": "string", "format": "date"}}})
    assert _has_format([{"items": [{"format": "email"}]}]) and not _has_format({"type": "string"})
    assert segment_punct(b'"ab"x.y-z@') == b"-.@" and segment_punct(b"") == b""


def test_byte_representatives_order():
    vals = bytes(sorted(b"01aAzZ9@.-"))
    ids = np.arange(100, 100 + len(vals), dtype=np.int64)
    tok = {b: int(t) for t, b in zip(ids, vals)}
    reps = byte_representatives(ids, vals, grammar="x@y")
    # '1' first, then the punctuation the grammar mentions ('@'), then 0 a A, then other punctuation
    assert reps.tolist()[:2] == [tok[ord("1")], tok[ord("@")]]
    assert reps.tolist()[2:5] == [tok[ord("0")], tok[ord("a")], tok[ord("A")]]
    assert set(reps.tolist()[5:]) == {tok[ord("-")], tok[ord(".")]}


def test_candidates_and_closer_ids(hf_tok):
    c = compile_constraint({"type": "object", "properties": {"a": {"type": "string"}}}, tokenizer=hf_tok)
    info = c.tokenizer_info
    quote, bracket, byte_ids, byte_values = closing_candidates(info)
    lt = info.lltok
    assert all(lt.decode_bytes([int(t)])[:1] == b'"' for t in quote)
    assert all(set(lt.decode_bytes([int(t)])) <= set(b"]}") for t in bracket)
    assert [lt.decode_bytes([int(t)]) for t in byte_ids] == [bytes([b]) for b in byte_values]
    w = c.canvas_walker()
    q2, b2, _, _ = closer_ids(w)
    assert set(quote.tolist()) <= set(q2.tolist()) and set(bracket.tolist()) <= set(b2.tolist())
    c.closing_token_ids = (7,)  # a constraint's own closers come first
    try:
        assert closer_ids(w)[1][0] == 7
    finally:
        del c.closing_token_ids


def test_closing_plan_closes_an_open_array_and_then_has_nothing_left(hf_tok):
    c = compile_constraint({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string"}}},
                            "required": ["a"]}, tokenizer=hf_tok)
    w = c.canvas_walker()
    toks = c.tokenize('{"a":["x","y')
    w.commit(toks)
    cand = closing_candidates(c.tokenizer_info)
    plan = closing_plan(w, cand[0], cand[1], 16, cand[2], cand[3])
    assert plan and len(plan) <= 16
    assert c.matches(c.tokenizer_info.lltok.decode_str(toks + plan))
    w.commit(plan + [c.eos_token_id])
    assert closing_plan(w, *cand[:2], 16, *cand[2:]) == []  # finished: nothing left to close


def test_greedy_fill_takes_allowed_argmax(hf_tok):
    c = compile_constraint(Regex("[0-9]{3}"), tokenizer=hf_tok)
    w = c.canvas_walker()
    V = c.vocab_size
    logits = np.full((5, V), -1.0, dtype=np.float32)
    a_tok = c.tokenize("a")[0]
    logits[:, a_tok] = 10.0  # the favourite is never allowed
    seven = c.tokenize("7")[0]
    logits[:, seven] = 5.0
    out = greedy_fill(w, logits, 5)
    assert out == w.greedy_fill(logits, 5)
    text = c.tokenizer_info.lltok.decode_str([t for t in out if t not in c.stop_token_ids])
    assert text == "777" and out[-1] in c.stop_token_ids and w.frontier == 0  # nothing committed
    assert greedy_fill(w, logits, 0) == []
