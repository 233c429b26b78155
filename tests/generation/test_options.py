"""Python API options: n, seeds, temperature/top_p, argument validation, typed dead ends, LengthError
details and partial streaming (tiny random runtime)."""
import math

import jsonschema
import numpy as np
import pytest
from pydantic import BaseModel

from dgemma_struct import (Choice, GenerationResult, Regex, errors, generate, generate_batch, generate_choice,
                           generate_grammar, generate_json, generate_regex, stream, stream_json)
from dgemma_struct.constraints import WalkResult

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                                             "maximum": 9}},
          "required": ["ok", "n"], "additionalProperties": False}


def test_n_samples_are_independent_valid_and_match_single_calls(tiny_runtime):
    out = generate_json("x", SCHEMA, runtime=tiny_runtime, max_new_tokens=32, seed=3, n=3, return_details=True)
    assert isinstance(out, list) and len(out) == 3
    for i, r in enumerate(out):
        jsonschema.validate(r.value, SCHEMA)
        assert r.stats.seed == 3 + i
    singles = [generate_json("x", SCHEMA, runtime=tiny_runtime, max_new_tokens=32, seed=3 + i, return_details=True)
               for i in range(3)]
    assert [r.text for r in out] == [r.text for r in singles]   # sample i == n=1 with seed+i
    values = generate_regex("x", r"[a-z]{4}", runtime=tiny_runtime, seed=0, n=4)
    assert len(values) == 4 and all(len(v) == 4 for v in values) and len(set(values)) > 1


def test_default_seed_is_deterministic_and_none_is_fresh(tiny_runtime):
    a = generate_regex("x", r"[a-z]{6}", runtime=tiny_runtime, return_details=True)
    b = generate_regex("x", r"[a-z]{6}", runtime=tiny_runtime, return_details=True)
    assert a.text == b.text and a.stats.seed == 0
    fresh = [generate_regex("x", r"[a-z]{6}", runtime=tiny_runtime, seed=None, return_details=True)
             for _ in range(4)]
    assert len({r.stats.seed for r in fresh}) == 4 and len({r.text for r in fresh}) > 1
    again = generate_regex("x", r"[a-z]{6}", runtime=tiny_runtime, seed=fresh[0].stats.seed)
    assert again == fresh[0].text  # a fresh seed is recorded, so the sample can be reproduced


def test_temperature_and_top_p_reach_the_sampler(tiny_runtime):
    base = [generate_regex("x", r"[a-z]{8}", runtime=tiny_runtime, seed=s) for s in range(3)]
    assert base == [generate_regex("x", r"[a-z]{8}", runtime=tiny_runtime, seed=s, temperature=1.0)
                    for s in range(3)]
    hot = [generate_regex("x", r"[a-z]{8}", runtime=tiny_runtime, seed=s, temperature=4.0) for s in range(3)]
    assert hot != base and all(len(h) == 8 for h in hot)
    greedy = generate_regex("x", r"[a-z]{8}", runtime=tiny_runtime, mode="ar", temperature=0)
    nucleus = generate_regex("x", r"[a-z]{8}", runtime=tiny_runtime, mode="ar", temperature=2.0, top_p=1e-9)
    assert greedy == nucleus  # a one-token nucleus is the (masked) argmax


@pytest.mark.parametrize("kwargs", [
    dict(seed=-5), dict(seed="1"), dict(seed=2.0), dict(seed=2**70), dict(timeout_s=0), dict(timeout_s=-1),
    dict(timeout_s="10"), dict(timeout_s=float("nan")), dict(whitespace="lots"), dict(whitespace=None),
    dict(separators=("|", ":")), dict(separators=(",",)), dict(separators=(", x", ":")), dict(runtime="embedded"),
    dict(n=0), dict(n=-1), dict(n=1.5), dict(n=10**6), dict(temperature=-1), dict(temperature=float("inf")),
    dict(top_p=0.0), dict(top_p=2), dict(max_new_tokens=None), dict(max_new_tokens=True), dict(max_repairs=1.5),
    dict(strict="yes"), dict(fallback=None), dict(close_on_budget=1),
])
def test_bad_arguments_raise_invalid_request(tiny_runtime, kwargs):
    kwargs.setdefault("runtime", tiny_runtime)
    with pytest.raises(errors.InvalidRequestError):
        generate_json("x", SCHEMA, **kwargs)


def test_bad_specs_and_batches_are_typed(tiny_runtime):
    with pytest.raises(errors.ChoiceError):
        generate_choice("x", None, runtime=tiny_runtime)
    with pytest.raises(errors.ChoiceError):
        generate_choice("x", "abc", runtime=tiny_runtime)
    with pytest.raises(errors.InvalidRequestError):
        generate_regex("x", None, runtime=tiny_runtime)
    with pytest.raises(errors.InvalidRequestError):
        generate_grammar("x", 42, runtime=tiny_runtime)
    with pytest.raises(errors.InvalidRequestError):
        generate("x", None, runtime=tiny_runtime)
    with pytest.raises(errors.InvalidRequestError):
        generate_batch("abc", SCHEMA, runtime=tiny_runtime)
    with pytest.raises(errors.InvalidRequestError):
        generate_batch(["a", "b"], SCHEMA, runtime=tiny_runtime, seed=[1])


def test_length_error_always_carries_partial_text_and_stats(tiny_runtime):
    with pytest.raises(errors.LengthError) as info:  # refused up front
        generate("x", Choice(["a very long fixed answer that needs many tokens"]), runtime=tiny_runtime,
                 max_new_tokens=2)
    assert info.value.partial_text == "" and info.value.stats.finish_reason == "length"
    open_schema = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}
    with pytest.raises(errors.LengthError) as info:  # ran out of tokens while generating
        generate("x", open_schema, runtime=tiny_runtime, max_new_tokens=8, close_on_budget=False, max_repairs=0,
                 fallback=False)
    err = info.value
    assert err.partial_text.startswith('{"s":') and err.stats.finish_reason == "length"
    assert err.stats.forward_passes > 0 and err.stats.generated_tokens > 0


class _EmptyAtFrontier:
    """A walker whose engine reports an empty allowed set at the frontier after ``after`` tokens
    (what an llguidance matcher in an error state gives): fault injection for the dead-end path."""

    def __init__(self, walker, after):
        self._w, self._after, self.dead_at = walker, after, None

    def __getattr__(self, name):
        return getattr(self._w, name)

    def _dead(self):
        if len(self._w.frozen_tokens) >= self._after and self.dead_at is None:
            self.dead_at = len(self._w.frozen_tokens)
        return self.dead_at is not None

    def walk(self, draft):
        res = self._w.walk(draft)
        if not self._dead():
            return res
        return WalkResult(0, np.zeros_like(res.bitmasks[:1]), False, False)

    def mask(self):
        m = self._w.mask()
        return np.zeros_like(m) if self._dead() else m

    def forced_tokens(self, n):
        return [] if self._dead() else self._w.forced_tokens(n)


@pytest.mark.parametrize("mode", ["diffusion", "ar"])
def test_an_empty_mask_is_a_dead_end_never_nan(tiny_runtime, mode):
    from dgemma_struct.api import constraint_for
    from dgemma_struct.guide.constraint_guide import ConstraintGuide

    w = _EmptyAtFrontier(constraint_for(SCHEMA, tiny_runtime).canvas_walker(), after=3)
    guide = ConstraintGuide([w], pad_token_id=0)
    res = tiny_runtime.generate("x", max_new_tokens=32, seed=0, mode=mode, hook=guide)
    assert guide.outcome(0).dead_end and guide.all_rows[0].no_allowed
    assert w.dead_at is not None and w.dead_at >= 3
    assert len(w.frozen_tokens) == w.dead_at  # nothing committed past the dead end
    assert res.stats.forward_passes > 0


def test_stream_json_yields_partial_models_then_the_validated_one(tiny_runtime):
    class Rec(BaseModel):
        name: str
        tags: list[str]

    values = list(stream_json("x", Rec, runtime=tiny_runtime, max_new_tokens=64, seed=1))
    assert values and isinstance(values[-1], Rec)
    Rec.model_validate(values[-1].model_dump())
    assert all(isinstance(v, Rec) for v in values)
    events = list(stream("x", Rec, runtime=tiny_runtime, max_new_tokens=64, seed=1))
    assert [e.validated for e in events] == [False] * (len(events) - 1) + [True]
    assert events[-1].done and events[-1].finish_reason == "stop"
    for e in events[:-1]:
        assert e.value is None or isinstance(e.value, dict)


@pytest.mark.parametrize("mode", ["diffusion", "ar"])
def test_mixed_batch_rows_equal_their_single_runs(tiny_runtime, mode):
    # different constraints and prompt lengths (left padding), rows that finish at different steps
    prompts = ["a", "a much longer prompt", "ccc"]
    specs = [SCHEMA, Regex(r"[a-z]{3,5}"), Choice(["x", "yy", "zzz"])]
    batch = generate_batch(prompts, specs, runtime=tiny_runtime, max_new_tokens=32, seed=5, mode=mode,
                           temperature=1.0 if mode == "ar" else None)
    singles = [generate(p, s, runtime=tiny_runtime, max_new_tokens=32, seed=5, mode=mode, return_details=True,
                        temperature=1.0 if mode == "ar" else None) for p, s in zip(prompts, specs)]
    assert [r.text for r in batch] == [r.text for r in singles]
    assert [r.stats.repairs for r in batch] == [r.stats.repairs for r in singles]
