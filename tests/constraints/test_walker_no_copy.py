"""The walker without per-step matcher copies (issue #14): every result of a walker driven the way the
guide drives it (draft walk, walk of the accepted run, commit, forced tokens, divergent commits,
closing plans, greedy fill, rollback, EOS) equals a fresh walker's from scratch; in the steady state no
matcher is copied; a walk of a prefix of the cached path and a commit of its leading tokens keep the
cache for the next step."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from dgemma_struct.constraints import closer_ids, closing_plan, compile_constraint, plan_still_closes
from dgemma_struct.constraints.cursor import MatcherCursor

SCHEMA = {"type": "array", "items": {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "age", "tags"], "additionalProperties": False}}
WORDS = ["foo", "bar", "hello world", "name", "x", "y", "city", "a b"]


@pytest.fixture(scope="module")
def cons(hf_tok):
    return compile_constraint(SCHEMA, tokenizer=hf_tok)


def _target(hf_tok, seed: int, n_items: int = 6) -> list[int]:
    rnd = random.Random(seed)
    items = [{"name": rnd.choice(WORDS), "age": rnd.randint(0, 10 ** rnd.randint(1, 5)),
              "tags": [rnd.choice(WORDS) for _ in range(rnd.randint(0, 2))]} for _ in range(n_items)]
    return hf_tok.encode(json.dumps(items, separators=(",", ":")))


def _fresh(cons, frozen):
    w = cons.canvas_walker()
    w.commit(frozen)
    return w


def _same_walk(a, b) -> None:
    assert (a.n_valid, a.stopped, a.accepting) == (b.n_valid, b.stopped, b.accepting)
    np.testing.assert_array_equal(a.bitmasks, b.bitmasks)


def _same_state(w, ref) -> None:
    assert w.frozen_tokens == ref.frozen_tokens
    assert (w.is_accepting(), w.is_stopped(), w.eos_committed) == (ref.is_accepting(), ref.is_stopped(), ref.eos_committed)
    np.testing.assert_array_equal(w.mask(), ref.mask())


@pytest.mark.parametrize("seed", range(6))
def test_guide_driven_walker_equals_fresh_walker(cons, hf_tok, seed):
    rnd = random.Random(seed)
    V = cons.vocab_size
    target = _target(hf_tok, seed)
    pool = sorted(set(target)) + [rnd.randrange(V) for _ in range(8)]
    cands = closer_ids(cons.canvas_walker())
    w = cons.canvas_walker()
    for _step in range(60):
        f = len(w.frozen_tokens)
        if w.eos_committed:
            break
        # the draft from the frontier: right tokens, then noise (sometimes a long right stretch)
        h = rnd.randint(0, 12)
        right = target[f:f + h] if w.frozen_tokens == target[:f] else []
        draft = right + [rnd.choice(pool) for _ in range(rnd.randint(0, 10))]
        res = w.walk(draft)
        _same_walk(res, _fresh(cons, w.frozen_tokens).walk(draft))
        n_valid = res.n_valid
        op = rnd.random()
        if op < 0.55 and n_valid:  # accept: walk a prefix of the draft, commit its valid part, forced tokens
            run = draft[:rnd.randint(1, n_valid)]
            r = w.walk(run)
            _same_walk(r, _fresh(cons, w.frozen_tokens).walk(run))
            w.commit(run[:r.n_valid])
            for _ in range(3):
                max_n = rnd.choice([1, 3, 50])
                forced = w.forced_tokens(max_n)
                assert forced == _fresh(cons, w.frozen_tokens).forced_tokens(max_n)
                if not forced:
                    break
                w.commit(forced)
        elif op < 0.7:  # a commit off the cached path: another allowed token at the frontier
            row = res.bitmasks[0]
            allowed = [t for t in pool if (int(row[t >> 5]) >> (t & 31)) & 1 and t not in w.stop_token_ids]
            if allowed:
                w.commit([rnd.choice(allowed)])
        elif op < 0.8:  # the closing side: plans, a plan re-check, the greedy fill (the borrowed matcher)
            ref = _fresh(cons, w.frozen_tokens)
            plan = closing_plan(w, cands[0], cands[1], 40, cands[2], cands[3])
            assert plan == closing_plan(ref, cands[0], cands[1], 40, cands[2], cands[3])
            if plan is not None:
                assert plan_still_closes(w, plan) and plan_still_closes(w, plan[:-1]) == plan_still_closes(ref, plan[:-1])
            logits = np.random.default_rng(seed * 100 + _step).standard_normal((12, V)).astype(np.float32)
            assert w.greedy_fill(logits, 12) == ref.greedy_fill(logits, 12)
            for i, t in enumerate(draft[:12]):  # a fill that follows the draft (its rows are cached), then leaves it
                logits[i, t] += 100.0
            assert w.greedy_fill(logits, 12) == ref.greedy_fill(logits, 12)
        elif op < 0.85 and f:
            w.rollback(rnd.randint(1, min(f, 6)))
        _same_state(w, _fresh(cons, w.frozen_tokens))
    # the end: complete the output, then EOS
    if not w.eos_committed and w.frozen_tokens == target[:len(w.frozen_tokens)]:
        rest = target[len(w.frozen_tokens):]
        w.walk(rest + [3])
        res = w.walk(rest)  # a prefix of the cached path that ends where the output is complete
        assert res.accepting
        _same_walk(res, _fresh(cons, w.frozen_tokens).walk(rest))
        rest = rest + [w.stop_token_ids[0]]
        res = w.walk(rest)
        _same_walk(res, _fresh(cons, w.frozen_tokens).walk(rest))
        assert res.stopped and res.n_valid == len(rest)
        w.commit(rest)
        assert w.eos_committed
        _same_walk(w.walk([5, 6]), _fresh(cons, w.frozen_tokens).walk([5, 6]))


class _CountingMatcher:
    """Forwards to a matcher, counting its ``deep_copy`` calls."""

    copies = 0

    def __init__(self, m):
        self._m = m

    def deep_copy(self):
        type(self).copies += 1
        return self._m.deep_copy()

    def __getattr__(self, name):
        return getattr(self._m, name)


class _CountingExec:
    def __init__(self, ex):
        self.ex, self.calls = ex, 0

    def unsafe_compute_mask_ptr_with_draft_token(self, *a):
        self.calls += 1
        return self.ex.unsafe_compute_mask_ptr_with_draft_token(*a)


def test_steady_state_copies_no_matcher_and_reuses_the_cache(cons, hf_tok):
    target = _target(hf_tok, 7, n_items=12)
    w = cons.canvas_walker()
    w._frozen = _CountingMatcher(w._frozen)
    w._exec = ex = _CountingExec(w._exec)
    cands = closer_ids(w)
    _CountingMatcher.copies = 0
    while len(w.frozen_tokens) < len(target) - 12:
        f = len(w.frozen_tokens)
        draft = target[f:f + 10] + [3, 3]  # 3: a special token, never allowed
        assert w.walk(draft).n_valid == 10
        calls = ex.calls
        run = draft[:3]
        assert w.walk(run).n_valid == 3 and ex.calls == calls  # a prefix of the cached path: no engine call
        w.commit(run)
        assert w.walk(draft[3:]).n_valid == 7 and ex.calls == calls  # the shifted cache answers the next step
        while forced := w.forced_tokens(50):
            w.commit(forced)
        closing_plan(w, cands[0], cands[1], 30, cands[2], cands[3])
        w.greedy_fill(np.zeros((4, cons.vocab_size), dtype=np.float32), 4)
        assert w.frozen_tokens == target[:len(w.frozen_tokens)]
    assert _CountingMatcher.copies == 0 and isinstance(w._frozen, _CountingMatcher)  # no copy, no rebuild


def test_cursor_restores_the_base_state(cons, hf_tok):
    toks = _target(hf_tok, 3)
    m = cons.new_matcher()
    assert m.consume_tokens(toks[:20])
    before = (m.is_accepting(), m.is_stopped(), bytes(m.compute_bitmask()))
    cur = MatcherCursor(m, frozenset(cons.stop_token_ids))
    assert cur.goto(toks[20:30]) and cur.goto(toks[20:25]) and cur.plan == toks[20:25]
    assert not cur.goto(toks[20:25] + [0])  # refused: the cursor stays on the common prefix
    assert cur.plan == toks[20:25] and not cur.dirty
    assert cur.restore() and (m.is_accepting(), m.is_stopped(), bytes(m.compute_bitmask())) == before


@pytest.mark.parametrize("max_n", [2, 50])
def test_forced_tokens_read_from_the_cached_walk(hf_tok, max_n):
    c = compile_constraint({"type": "object", "properties": {"a": {"enum": ["hello world"]}}, "required": ["a"],
                            "additionalProperties": False}, tokenizer=hf_tok)
    forced = c.canvas_walker().forced_tokens(50)
    assert forced[-1] in c.stop_token_ids and len(forced) > 2  # the whole value, then EOS
    w = c.canvas_walker()
    w.walk(forced[:-1] + [3])  # the draft walk went through the forced tokens: their rows are cached
    assert w.forced_tokens(max_n) == c.canvas_walker().forced_tokens(max_n)
    w.commit(forced[:1])
    assert w.forced_tokens(max_n) == _fresh(c, forced[:1]).forced_tokens(max_n)


def test_prefix_walk_at_a_complete_output(cons, hf_tok):
    target = _target(hf_tok, 11, n_items=2)
    w = cons.canvas_walker()
    w.commit(target[:5])
    rest = target[5:]
    w.walk(rest + [3])
    for draft in (rest, rest[:-1], rest + [w.stop_token_ids[0]], rest):  # prefixes of the cached path, then EOS
        res = w.walk(draft)
        _same_walk(res, _fresh(cons, target[:5]).walk(draft))
    assert w.walk(rest).accepting and not w.walk(rest[:-1]).accepting
    w.commit(rest + [w.stop_token_ids[0]])
    _same_state(w, _fresh(cons, w.frozen_tokens))
