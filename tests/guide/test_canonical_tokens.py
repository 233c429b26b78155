"""The AR guide writes canonical tokens where the grammar forces what follows (``canonical_tokens``):
``":`` before a string value (the grammar then forces ``"``) is replaced by the one piece ``":"``."""
from pathlib import Path

import pytest
import torch

import dgemma_struct.embedded
from dgemma_struct import generate
from dgemma_struct.constraints import CanvasWalker, compile_constraint
from dgemma_struct.guide.canonical import merge_noncanonical, merged_token
from dgemma_struct.guide.constraint_guide import ConstraintGuide

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "ref": {"type": "string"}},
          "required": ["n", "ref"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(Path(dgemma_struct.embedded.__file__).parent))


def _one(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == 1, (text, ids)
    return ids[0]


def _walker(tok, prefix):
    w = CanvasWalker(compile_constraint(SCHEMA, tok))
    w.commit(tok.encode(prefix, add_special_tokens=False))
    return w


def test_a_colon_before_a_forced_quote_merges_into_one_piece(tok):
    colon, colon_quote, quote = _one(tok, '":'), _one(tok, '":"'), _one(tok, '"')
    assert merged_token(_walker(tok, '{"n":1,"ref'), colon) == colon_quote   # a string comes: '"' is forced
    assert merged_token(_walker(tok, '{"n'), colon) is None                   # a number comes: nothing forced
    assert merged_token(_walker(tok, '{"n":1,"ref'), quote) == colon_quote    # '"' then ':"' forced
    assert merged_token(_walker(tok, '{"n":1,"ref'), colon_quote) is None     # already canonical
    assert merged_token(_walker(tok, '{"n'), _one(tok, "{")) is None          # refused by the grammar


def test_the_likeliest_noncanonical_token_moves_onto_its_piece_when_the_piece_can_be_chosen(tok):
    colon, colon_quote = _one(tok, '":'), _one(tok, '":"')
    walkers = [_walker(tok, '{"n":1,"ref'), _walker(tok, '{"n')]
    logits = torch.full((2, len(tok)), float("-inf"))
    for b in range(2):
        logits[b, colon], logits[b, colon_quote] = 5.0, 1.0
    assert merge_noncanonical(logits, [0, 1], walkers) == 1
    assert logits.argmax(-1).tolist() == [colon_quote, colon]   # the number row keeps '":'
    assert float(logits[0, colon_quote]) == pytest.approx(float(torch.logaddexp(torch.tensor(5.0), torch.tensor(1.0))))
    assert float(logits[0, colon]) == float("-inf") and float(logits[1, colon_quote]) == 1.0
    # the piece masked out (a closing plan, an exclusion): the token stays, the row is never emptied
    logits = torch.full((1, len(tok)), float("-inf"))
    logits[0, colon] = 5.0
    assert merge_noncanonical(logits, [0], walkers[:1]) == 0 and int(logits.argmax()) == colon


@pytest.mark.parametrize("canonical", [True, False])
def test_the_ar_guide_chooses_the_canonical_piece_only_when_asked(tok, canonical):
    colon, colon_quote = _one(tok, '":'), _one(tok, '":"')
    guide = ConstraintGuide([_walker(tok, '{"n":1,"ref')], pad_token_id=0, canonical_tokens=canonical)
    logits = torch.zeros(1, len(tok))
    logits[0, colon], logits[0, colon_quote] = 5.0, 1.0
    guide.mask_ar_logits(logits, torch.ones(1, dtype=torch.bool))
    guide.drain()
    assert int(logits.argmax()) == (colon_quote if canonical else colon)


def _forced_merges(tok, token_ids):
    """Positions where the output has a token that a forced continuation merges with."""
    w = CanvasWalker(compile_constraint(SCHEMA, tok))
    out = []
    for i, t in enumerate(token_ids):
        if t in w.stop_token_ids:
            break
        if merged_token(w, t) is not None:
            out.append(i)
        w.commit([t])
    return out


def test_ar_outputs_of_the_embedded_model_hold_no_forced_merge(tok, embedded_runtime):
    """Every AR output is canonical at each forced boundary, on prompts whose string field the model
    tends to open with a number's ``":`` (a number right before it in the source)."""
    rt = embedded_runtime
    prompts = [f"Here is a photo record:\nThis photo: with message ref U-{66195 + i} and the n is {12718 + 7 * i}.\n"
               "Give me a JSON object with n and ref." for i in range(6)]
    for p in prompts:
        r = generate(p, SCHEMA, runtime=rt, mode="ar", return_details=True)
        assert _forced_merges(tok, r.token_ids) == [], r.text


def test_its_host_reads_do_not_grow_with_the_batch(tok):
    """Each row's check is host work on its walker; the logits are read a fixed number of times per round
    (each a sync on a GPU), the same for one row as for eight, a move in every row included."""
    from dgemma_struct.engine.profiling import HostSyncProbe

    colon, colon_quote = _one(tok, '":'), _one(tok, '":"')
    totals = []
    for B in (1, 8):
        walkers = [_walker(tok, '{"n":1,"ref') for _ in range(B)]
        logits = torch.zeros(B, len(tok))
        logits[:, colon], logits[:, colon_quote] = 5.0, 1.0
        with HostSyncProbe() as probe:
            assert merge_noncanonical(logits, list(range(B)), walkers) == B
        totals.append(probe.total)
    assert totals[0] == totals[1], totals
