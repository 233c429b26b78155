"""``logprobs=k``: one entry per returned token, log-probabilities under the masked distribution of
the step that committed the token (forced tokens exactly 0.0), top alternatives from the same
distribution; repairs and the AR fallback keep the entries of a kept prefix; free text records
without changing the output."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pydantic import BaseModel, field_validator

from dgemma_struct import Regex, generate
from dgemma_struct.errors import InvalidRequestError
from dgemma_struct.guide.constraint_guide import ConstraintGuide
from dgemma_struct.options import GenerateOptions
from dgemma_struct.repair.preparation import constraint_for

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "tag": {"enum": ["alpha", "beta"]}},
          "required": ["n", "tag"], "additionalProperties": False}


def _check(result, k):
    lp = result.logprobs
    assert lp is not None and [e.token_id for e in lp] == result.token_ids
    for e in lp:
        assert e.logprob <= 0.0
        assert len(e.top_logprobs) <= k
        assert sum(math.exp(a.logprob) for a in e.top_logprobs) <= 1.0 + 1e-5
        vals = [a.logprob for a in e.top_logprobs]
        assert vals == sorted(vals, reverse=True)
        if e.forced:
            assert e.logprob == 0.0 and [a.token_id for a in e.top_logprobs] == ([e.token_id] if k else [])
        if k and e.logprob > vals[-1] + 1e-6:   # better than the k-th alternative: it is one of them
            assert any(a.token_id == e.token_id and abs(a.logprob - e.logprob) < 1e-5 for a in e.top_logprobs)


@pytest.mark.parametrize("mode", ["diffusion", "ar"])
def test_json_entries_align_and_forced_are_zero(tiny_runtime, mode):
    r = generate("Give JSON.", SCHEMA, runtime=tiny_runtime, max_new_tokens=48, logprobs=3, mode=mode,
                 return_details=True, seed=2)
    _check(r, 3)
    text = "".join(e.token for e in r.logprobs)
    assert text == tiny_runtime.tokenizer.decode(r.token_ids, skip_special_tokens=False)
    if mode == "diffusion":
        forced = [e for e in r.logprobs if e.forced]
        assert forced and all(e.logprob == 0.0 for e in forced)
        if r.stats.repairs == 0:   # the count includes a forced stop token, which has no entry
            assert r.stats.forced_tokens - 1 <= len(forced) <= r.stats.forced_tokens
    else:   # the AR loop samples every token; where the mask leaves one choice, the logprob is 0.0
        assert r.logprobs[0].logprob == 0.0 and r.logprobs[0].token == '{"'
    assert any(e.logprob < 0 for e in r.logprobs)
    assert r.to_dict()["logprobs"][0]["token_id"] == r.token_ids[0]


def test_same_output_with_and_without_logprobs(tiny_runtime):
    a = generate("Three digits?", Regex(r"[0-9]{3}"), runtime=tiny_runtime, max_new_tokens=16, seed=5,
                 return_details=True)
    b = generate("Three digits?", Regex(r"[0-9]{3}"), runtime=tiny_runtime, max_new_tokens=16, seed=5,
                 return_details=True, logprobs=0)
    assert a.token_ids == b.token_ids and a.logprobs is None
    _check(b, 0)


def _allowed(mask: np.ndarray, V: int) -> torch.Tensor:
    """The bool allowed set of a packed int32 bitmask row, unpacked by hand."""
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[:V]
    return torch.from_numpy(bits.astype(bool))


class _Spy(ConstraintGuide):
    """Records, independently of the guide's recorder, the masked distribution at the frontier of
    row 0 at each step and the token committed there."""

    seen: list

    def accept(self, view):
        r = self.rows[0]
        before, f = len(r.walker.frozen_tokens), r.n_frozen
        if f < view.frozen.shape[1] and not bool(view.done[0]) and bool(view.active[0]):
            logits = view.logits[0, f].clone()
            allowed = _allowed(r.walker.mask(), logits.shape[-1])
            super().accept(view)
            if len(r.walker.frozen_tokens) > before:
                self.seen.append((before - r.start, r.walker.frozen_tokens[before], logits, allowed))
            return
        super().accept(view)

    def mask_ar_logits(self, logits, active):
        self.drain()  # the look-ahead worker may still be walking row 0's matcher (it is not thread-safe)
        allowed = _allowed(self.rows[0].walker.mask(), logits.shape[-1])
        super().mask_ar_logits(logits, active)
        self._ar = (len(self.rows[0].walker.frozen_tokens) - self.rows[0].start, logits[0].clone(), allowed)

    def ar_token(self, tokens, active):
        i, logits, allowed = self._ar
        if bool(active[0]):
            self.seen.append((i, int(tokens[0]), logits, allowed))
        super().ar_token(tokens, active)


@pytest.mark.parametrize("mode", ["diffusion", "ar"])
def test_logprob_is_the_masked_softmax_recomputed(tiny_runtime, mode):
    rt = tiny_runtime
    c = constraint_for(Regex(r"[a-z]{2,6}-[0-9]{2}"), rt)
    guide = _Spy([c.canvas_walker()], pad_token_id=rt.pad_token_id or 0, logprobs=4)
    guide.seen = []
    rt.generate_ids([rt.encode_prompt("code?")], max_new_tokens=24, seed=[3], mode=mode, hook=guide)
    entries = guide.all_rows[0].lp
    assert guide.seen
    for i, token, logits, allowed in guide.seen:
        p = torch.softmax(logits.float().masked_fill(~allowed, float("-inf")), dim=-1)
        assert bool(allowed[token])
        assert entries[i].token_id == token
        assert math.isclose(math.exp(entries[i].logprob), float(p[token]), rel_tol=1e-4, abs_tol=1e-7)
        top = torch.topk(p, 4)
        assert [a.token_id for a in entries[i].top_logprobs] == [t for t, v in zip(top.indices.tolist(),
                                                                                   top.values.tolist()) if v > 0]


_calls = {"n": 0}


class Flaky(BaseModel):
    """Valid by the grammar; the validator rejects the first value it sees (forces one repair)."""

    n: int
    tag: str

    @field_validator("tag")
    @classmethod
    def _first_fails(cls, v):
        _calls["n"] += 1
        if _calls["n"] == 1:
            raise ValueError("rejected once")
        return v


@pytest.mark.parametrize("max_repairs", [1, 0])   # 1: a repair from a kept prefix; 0: the AR fallback
def test_repair_and_fallback_keep_prefix_entries(tiny_runtime, max_repairs):
    _calls["n"] = 0
    r = generate("Give JSON.", Flaky, runtime=tiny_runtime, max_new_tokens=48, logprobs=2, return_details=True,
                 max_repairs=max_repairs, seed=1)
    assert r.stats.repairs == max_repairs and r.stats.fallback == (max_repairs == 0)
    _check(r, 2)
    assert r.logprobs[0].forced and r.logprobs[0].logprob == 0.0   # the kept prefix's '{"' entry


def test_free_text_records_without_changing_the_output(tiny_runtime):
    rt = tiny_runtime
    ids = [rt.encode_prompt("hello"), rt.encode_prompt("a longer prompt here")]
    for mode in ("diffusion", "ar"):
        plain = rt.generate_ids(ids, max_new_tokens=20, seed=[3, 4], mode=mode)
        rec = rt.generate_ids(ids, max_new_tokens=20, seed=[3, 4], mode=mode, logprobs=2)
        for a, b in zip(plain, rec):
            assert a.token_ids == b.token_ids
            _check(b, 2)
            # the committed token is the argmax (diffusion) / greedy choice (AR) of its distribution
            assert all(e.top_logprobs[0].token_id == e.token_id for e in b.logprobs)


@pytest.mark.parametrize("bad", [-1, 21, True, 1.5])
def test_bad_logprobs_values(tiny_runtime, bad):
    with pytest.raises(InvalidRequestError):
        GenerateOptions(logprobs=bad)
    with pytest.raises(InvalidRequestError):
        tiny_runtime.generate_ids([[5, 6]], max_new_tokens=4, logprobs=bad)


def test_budget_closing_entries_align(tiny_runtime):
    schema = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}
    r = generate("x", schema, runtime=tiny_runtime, max_new_tokens=12, logprobs=1, return_details=True, seed=0)
    assert r.stats.budget_closing        # the closing plan wrote the end of this output
    _check(r, 1)
