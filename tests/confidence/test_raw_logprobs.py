"""The recording behind per-field confidence (issue #36): the AR path's one-log-softmax-per-step
entries equal the general path's, token names are decoded once per tokenizer, and the debug
capture of unrenormalised logprobs (``capture_raw``) records the pre-mask distribution without
changing any output."""
import math

import pytest
import torch

from dgemma_struct import generate_batch, generate_json
from dgemma_struct.engine.token_logprobs import RAW, RawTokenLogprob, capture_raw, entries_from_logits, named
from dgemma_struct.results import TokenLogprob

MODES = ["diffusion", "ar"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "n": {"type": "integer"}, "ok": {"type": "boolean"}},
          "required": ["name", "n", "ok"]}
PROMPTS = ["Answer as JSON.", "Write a record as JSON.", "JSON please."]


def test_ar_entries_without_alternatives_equal_the_general_path(tiny_runtime):
    """``logprobs=0`` in AR reads one batched log-softmax per step; ``logprobs=2`` takes the per-row
    path (top-k): same tokens, same logprobs, every row of a batch, sampled at a temperature."""
    kw = dict(runtime=tiny_runtime, mode="ar", max_new_tokens=48, seed=[1, 2, 3], temperature=0.7)
    fast = generate_batch(PROMPTS, SCHEMA, logprobs=0, **kw)
    full = generate_batch(PROMPTS, SCHEMA, logprobs=2, **kw)
    for a, b in zip(fast, full):
        assert a.token_ids == b.token_ids
        assert len(a.logprobs) == len(b.logprobs) == len(a.token_ids)
        for x, y in zip(a.logprobs, b.logprobs):
            assert x.token_id == y.token_id and x.token == y.token
            assert math.isclose(x.logprob, y.logprob, rel_tol=1e-5, abs_tol=1e-5), (x, y)


def test_names_are_decoded_once_per_tokenizer():
    class Tok:
        calls = 0

        def decode(self, ids, skip_special_tokens=False):
            Tok.calls += 1
            return f"<{ids[0]}>"

    tok = Tok()
    entries = [TokenLogprob(t, -0.5) for t in (1, 2, 1, 3)]
    first = named(entries, tok)
    again = named(entries, tok)
    assert [e.token for e in first] == [e.token for e in again] == ["<1>", "<2>", "<1>", "<3>"]
    assert Tok.calls == 3


def test_raw_rows_are_the_unmasked_copy_of_a_slice():
    logits = torch.randn(2, 5, 7)
    with capture_raw():
        RAW.keep(logits)
        logits[:, :, 0] = float("-inf")   # the guide masks in place
        got = RAW.rows_of(logits[1, 2:])
        assert torch.equal(got, RAW.raw[1, 2:])
        assert got[0, 0] != float("-inf")
        assert RAW.rows_of(logits[1, 2:].clone()) is None   # not a slice of the kept logits
        e = entries_from_logits(logits[1, 2:], [3, 4], 0, raw=got)
        assert all(isinstance(x, RawTokenLogprob) and x.raw_logprob < x.logprob for x in e)
    assert RAW.raw is None and not RAW.on


@pytest.mark.parametrize("mode", MODES)
def test_capture_raw_records_the_pre_mask_logprob_and_changes_nothing(tiny_runtime, mode):
    kw = dict(runtime=tiny_runtime, mode=mode, max_new_tokens=96, return_details=True, logprobs=0, seed=5)
    plain = generate_json(PROMPTS[0], SCHEMA, **kw)
    assert all(type(e) is TokenLogprob for e in plain.logprobs)   # off: plain entries
    with capture_raw():
        raw = generate_json(PROMPTS[0], SCHEMA, **kw)
    assert raw.token_ids == plain.token_ids
    assert [e.logprob for e in raw.logprobs] == pytest.approx([e.logprob for e in plain.logprobs])
    chosen = [e for e in raw.logprobs if not e.forced]
    assert chosen and all(isinstance(e, RawTokenLogprob) and e.raw_logprob is not None for e in chosen)
    assert all(e.raw_logprob is None for e in raw.logprobs if e.forced)
    if not raw.stats.budget_closing:   # a closing bias may raise a token above its raw share
        # the mask only removes mass: the renormalised probability is at least the raw one
        assert all(e.raw_logprob <= e.logprob + 1e-4 for e in chosen)
    assert any(e.raw_logprob < e.logprob - 0.05 for e in chosen)   # a random model's mass is mostly masked


def test_tokens_past_the_walkers_valid_prefix_are_recorded_unmasked():
    """A budget-closing plan can commit tokens the walker's mask refuses (its walk stops early):
    every token still gets an entry, the refused ones from the unmasked distribution."""
    import numpy as np

    from dgemma_struct.engine.token_logprobs import GuideLogprobs
    from dgemma_struct.kernels import pack_bool_mask

    allowed = torch.zeros(1, 6, dtype=torch.bool)
    allowed[0, [1, 2]] = True

    class Walk:
        n_valid = 1
        bitmasks = np.concatenate([pack_bool_mask(allowed).numpy()] * 2)   # rows 0..n_valid

    class Walker:
        def walk(self, tokens):
            return Walk()

    class Row:
        lp_top = 0
        lp: list = []

    logits = torch.zeros(3, 6)
    GuideLogprobs.record(Row, Walker(), [1, 4, 5], logits)
    assert [e.token_id for e in Row.lp] == [1, 4, 5]
    assert [round(e.logprob, 4) for e in Row.lp] == [round(math.log(1 / 2), 4)] + [round(math.log(1 / 6), 4)] * 2
