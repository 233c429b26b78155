"""Choice scoring in bounded memory (issue #36): the rows of one forward never exceed the chunk the
memory budget allows, chunking changes no score, and a list over the cap is a typed error."""
import numpy as np
import pytest

import dgemma_struct.choice_scores as cs
from dgemma_struct.constraints import Choice
from dgemma_struct.errors import ChoiceError
from dgemma_struct.repair.preparation import constraint_for

PROMPT = "Which one?"
OPTIONS = [f"item {i}" for i in range(40)]


def _forward_rows(rt):
    """Batch rows of every decoder and encoder forward while the hook is on."""
    seen = []

    def pre(module, args, kwargs):
        ids = kwargs.get("decoder_input_ids")
        if ids is None:
            ids = kwargs.get("input_ids", args[0] if args else None)
        seen.append((module.__class__.__name__, int(ids.shape[0])))
    return seen, pre


@pytest.mark.parametrize("estimator", ["canvas", "ar"])
def test_rows_per_forward_stay_within_the_chunk(tiny_runtime, monkeypatch, estimator):
    full = cs.score_choices(PROMPT, OPTIONS, runtime=tiny_runtime, estimator=estimator)
    # a budget that fits a handful of rows: the same scores, in many forwards none over the bound
    ids = tiny_runtime.encode_prompt(PROMPT)
    L = tiny_runtime.model.config.canvas_length
    monkeypatch.setattr(cs, "CHUNK_BYTES", 7 * (cs.CHUNK_BYTES // cs.rows_per_forward(tiny_runtime, len(ids), L)))
    c = constraint_for(Choice(OPTIONS), tiny_runtime)
    longest = max(len(p.tokens) for p in cs.option_paths(c, OPTIONS, cs.stop_ids_of(c)[-1]))
    bound = cs.rows_per_forward(tiny_runtime, len(ids), L) if estimator == "canvas" else \
        cs.rows_per_forward(tiny_runtime, 0, len(ids) + longest - 1)
    assert 1 <= bound < len(OPTIONS)
    seen, pre = _forward_rows(tiny_runtime)
    handles = [tiny_runtime.model.model.decoder.register_forward_pre_hook(pre, with_kwargs=True),
               tiny_runtime.model.model.encoder.register_forward_pre_hook(pre, with_kwargs=True)]
    try:
        small = cs.score_choices(PROMPT, OPTIONS, runtime=tiny_runtime, estimator=estimator)
    finally:
        for h in handles:
            h.remove()
    rows = [n for _, n in seen]
    assert len(rows) > 2 and max(rows) <= bound, (rows, bound)
    assert small.forward_passes > full.forward_passes
    assert np.allclose(small.scores, full.scores, atol=1e-4, rtol=1e-5)
    assert small.best == full.best


def test_the_masks_stay_packed(tiny_runtime):
    c = constraint_for(Choice(OPTIONS[:3]), tiny_runtime)
    p = cs.option_paths(c, OPTIONS[:3], cs.stop_ids_of(c)[-1])[0]
    assert p.bitmask.dtype == np.int32 and p.bitmask.shape[1] == -(-p.vocab_size // 32)
    assert tuple(p.allowed.shape) == (len(p.tokens), p.vocab_size)


def test_more_options_than_the_cap_is_a_choice_error(tiny_runtime):
    with pytest.raises(ChoiceError, match="at most"):
        cs.score_choices(PROMPT, [f"o{i}" for i in range(cs.MAX_OPTIONS + 1)], runtime=tiny_runtime)
