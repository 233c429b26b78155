"""CanvasWalker: walk() rows equal fresh-matcher masks, incremental == from scratch, commit/rollback,
forced tokens, EOS/special-token rules, greedy_fill. Property-based with Hypothesis."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dgemma_struct.constraints import Grammar, Regex, bitmask_to_bool, compile_constraint
from dgemma_struct.errors import ConstraintError

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["foo", "bar", "hello world"]},
                 "maxItems": 4},
        "ok": {"type": "boolean"},
        "score": {"type": "number"},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def cons(hf_tok):
    return compile_constraint(SCHEMA, tokenizer=hf_tok)


@st.composite
def instances(draw):
    d = {"name": draw(st.text(st.characters(codec="ascii", categories=["L", "N", "Zs", "P"]), max_size=12)),
         "age": draw(st.integers(0, 10 ** 6)),
         "tags": draw(st.lists(st.sampled_from(["foo", "bar", "hello world"]), max_size=4))}
    if draw(st.booleans()):
        d["ok"] = draw(st.booleans())
    if draw(st.booleans()):
        d["score"] = draw(st.floats(-1e3, 1e3, allow_nan=False).map(lambda x: round(x, 3)))
    return json.dumps(d, separators=(",", ":"))


def reference_walk(c, frozen, draft):
    """Position-by-position fresh-matcher walk with the documented semantics."""
    m = c.new_matcher()
    assert m.consume_tokens(list(frozen))
    stops = set(c.stop_token_ids)
    rows = []
    n = 0
    for t in draft:
        row = np.frombuffer(m.compute_bitmask(), dtype=np.int32).copy()
        rows.append(row)
        if t < 0 or t >= c.vocab_size or not (row[t >> 5] >> (t & 31)) & 1:
            return n, np.stack(rows)
        n += 1
        if t in stops:
            stop_row = np.zeros_like(row)
            for s in stops:
                stop_row[s >> 5] |= np.int32(1 << (s & 31)) if (s & 31) < 31 else np.int32(-2 ** 31)
            rows.append(stop_row)
            return n, np.stack(rows)
        assert m.consume_token(t)
    rows.append(np.frombuffer(m.compute_bitmask(), dtype=np.int32).copy())
    return n, np.stack(rows)


def corrupt(draw, toks, V):
    toks = list(toks)
    for _ in range(draw(st.integers(0, 3))):
        if not toks:
            break
        i = draw(st.integers(0, len(toks) - 1))
        toks[i] = draw(st.one_of(st.integers(0, V - 1), st.sampled_from([0, 1, 2, 3, 4, 5, V + 7, -1])))
    if draw(st.booleans()):
        toks = toks[: draw(st.integers(0, len(toks)))]
    return toks


def check_rows(c, rows, draft, n_valid, stopped):
    V = c.vocab_size
    allowed = bitmask_to_bool(rows, V)
    # pad, bos, start_of_turn, unk are never allowed
    assert not allowed[:, [0, 2, 3, 5]].any()
    # every token of the valid prefix was allowed at its position ...
    for i in range(n_valid):
        assert allowed[i, draft[i]], (i, draft[i])
    # ... and the walk stopped at the first token its mask forbids (or after a stop token)
    if not stopped and n_valid < len(draft) and 0 <= draft[n_valid] < V:
        assert not allowed[n_valid, draft[n_valid]]
    return allowed


@SETTINGS
@given(data=st.data(), text=instances())
def test_walk_equals_fresh_matcher(cons, hf_tok, data, text):
    toks = hf_tok.encode(text) + [data.draw(st.sampled_from([1, 4]))] + [1, 7]
    draft = corrupt(data.draw, toks, cons.vocab_size)
    w = cons.canvas_walker()
    res = w.walk(draft)
    n_ref, rows_ref = reference_walk(cons, [], draft)
    assert res.n_valid == n_ref
    assert res.bitmasks.shape == (n_ref + 1, (cons.vocab_size + 31) // 32)
    np.testing.assert_array_equal(res.bitmasks, rows_ref)
    check_rows(cons, res.bitmasks, draft, res.n_valid, res.stopped)
    if draft == toks:
        assert res.n_valid == len(hf_tok.encode(text)) + 1 and res.stopped and res.accepting


@SETTINGS
@given(data=st.data(), text=instances())
def test_incremental_equals_scratch(cons, hf_tok, data, text):
    toks = hf_tok.encode(text) + [1]
    w = cons.canvas_walker()
    draft = list(toks)
    committed = 0
    for _step in range(6):
        draft = corrupt(data.draw, toks, cons.vocab_size) if data.draw(st.booleans()) else list(toks)
        suffix = draft[committed:] if draft[:committed] == toks[:committed] else toks[committed:]
        res = w.walk(suffix)
        n_ref, rows_ref = reference_walk(cons, toks[:committed], suffix)
        assert res.n_valid == n_ref
        np.testing.assert_array_equal(res.bitmasks, rows_ref)
        if data.draw(st.booleans()) and committed < len(toks) - 1:
            k = data.draw(st.integers(1, min(5, len(toks) - 1 - committed)))
            w.commit(toks[committed: committed + k])
            committed += k
            assert w.frozen_tokens == toks[:committed]
        if committed and data.draw(st.integers(0, 4)) == 0:
            k = data.draw(st.integers(1, committed))
            w.rollback(k)
            committed -= k
            assert w.frozen_tokens == toks[:committed]


@SETTINGS
@given(text=instances())
def test_eos_only_where_accepting(cons, hf_tok, text):
    toks = hf_tok.encode(text)
    res = cons.canvas_walker().walk(toks)
    assert res.n_valid == len(toks)
    allowed = bitmask_to_bool(res.bitmasks, cons.vocab_size)
    decoded = [hf_tok.decode(toks[:i]) for i in range(len(toks) + 1)]
    for i, prefix in enumerate(decoded):
        complete = cons.matches(prefix) if prefix.endswith("}") else False
        assert allowed[i, 1] == allowed[i, 4] == complete, (i, prefix)
    assert res.accepting


def test_forced_tokens_and_commit(cons, hf_tok):
    w = cons.canvas_walker()
    forced = w.forced_tokens(10)
    # llguidance holds back a token that a longer BPE merge could still swallow
    assert forced and '{"name":"'.startswith(hf_tok.decode(forced)) and len(hf_tok.decode(forced)) >= 5
    assert w.frozen_tokens == []  # not committed
    w.commit(forced)
    w.rollback(len(forced))
    w.commit(hf_tok.encode('{"name":"abc","age":1,"tags":["foo","bar","foo","bar"'))
    f = w.forced_tokens(10)
    assert "]".startswith(hf_tok.decode(f))
    with pytest.raises(ConstraintError):
        w.commit(hf_tok.encode(',"nope'))
    # state unchanged after a failed commit
    assert hf_tok.decode(w.forced_tokens(10)) == hf_tok.decode(f)


def test_forced_eos(hf_tok):
    c = compile_constraint(Regex("abc"), tokenizer=hf_tok)
    w = c.canvas_walker()
    f = w.forced_tokens(20)
    assert f[-1] == 1 and hf_tok.decode(f[:-1]) == "abc"
    assert w.forced_tokens(1) != [1]
    w.commit(f[:-1])
    assert w.is_accepting() and w.forced_tokens(3) == [1]
    w.commit([4])  # <end_of_turn> counts as EOS
    assert w.is_stopped() and w.is_accepting() and w.forced_tokens(3) == []
    res = w.walk([1, 1])
    assert res.n_valid == 0 and res.stopped
    assert set(np.flatnonzero(bitmask_to_bool(res.bitmasks, c.vocab_size)[0])) == {1, 4}
    w.commit([1, 4])  # EOS padding after EOS is fine
    with pytest.raises(ConstraintError):
        w.commit(hf_tok.encode("a"))
    w.rollback(1)
    assert w.frozen_tokens == f[:-1] and w.forced_tokens(3) == [1]  # "abc" is stopped but EOS not yet committed


def test_special_tokens_never_allowed_even_if_grammar_names_them(hf_tok):
    c = compile_constraint(Grammar('start: "a" <[2]> "b" | "a" "c"'), tokenizer=hf_tok)
    w = c.canvas_walker()
    a = hf_tok.convert_tokens_to_ids("a")
    res = w.walk([a, 2])
    assert res.n_valid == 1
    assert not bitmask_to_bool(res.bitmasks, c.vocab_size)[:, [0, 2, 3, 5]].any()
    with pytest.raises(ConstraintError):
        w.commit([a, 2])


@SETTINGS
@given(seed=st.integers(0, 2 ** 31 - 1), n=st.integers(1, 60))
def test_greedy_fill_is_grammar_accepted(cons, seed, n):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, cons.vocab_size + 50, generator=g)  # model vocab wider than tokenizer
    w = cons.canvas_walker()
    out = w.greedy_fill(logits, n)
    assert len(out) <= n and all(t < cons.vocab_size for t in out)
    m = cons.new_matcher()
    assert m.consume_tokens(out) and not m.is_error()
    # greedy == argmax over the allowed set at each step
    m = cons.new_matcher()
    for i, t in enumerate(out):
        allowed = bitmask_to_bool(np.frombuffer(m.compute_bitmask(), dtype=np.int32)[None], cons.vocab_size)[0]
        row = logits[i, : cons.vocab_size].numpy().copy()
        row[~allowed] = -np.inf
        assert t == int(np.argmax(row))
        m.consume_token(t)


def test_greedy_fill_from_frozen_state_finishes(cons, hf_tok):
    w = cons.canvas_walker()
    w.commit(hf_tok.encode('{"name":"x","age":7,"tags":[]'))
    logits = torch.zeros(8, cons.vocab_size)
    logits[:, 1] = 5.0  # the model wants EOS everywhere, then "}"
    logits[:, hf_tok.convert_tokens_to_ids("}")] = 4.0
    out = w.greedy_fill(logits, 8)
    assert out and out[-1] == 1
    assert cons.matches(hf_tok.decode(w.frozen_tokens + out[:-1]))


def test_walk_bitmask_is_readonly_view(cons, hf_tok):
    res = cons.canvas_walker().walk(hf_tok.encode('{"name"'))
    with pytest.raises(ValueError):
        res.bitmasks[0, 0] = 1
