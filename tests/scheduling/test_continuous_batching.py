"""Continuous batching: rows join a running diffusion batch between canvases, leave it as soon as
they finish, and each row's output is what it gets alone (same seed); rows that stopped denoising
are left out of the forward; a cancelled row or a failing canvas hurts nobody else."""
from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from dgemma_struct import generate
from dgemma_struct.engine.canvas import CanvasBatch
from dgemma_struct.scheduling.requests import BatchFailed, RowRequest, RowStatus
from dgemma_struct.scheduling.scheduler import ContinuousScheduler
from dgemma_struct.errors import GenerationTimeout
from dgemma_struct.guide.constraint_guide import ConstraintGuide
from dgemma_struct.options import GenerateOptions
from dgemma_struct.repair.preparation import prepare
from dgemma_struct.guide.rows import RowState

NOTES = {"type": "object", "properties": {"notes": {"type": "array", "items": {"type": "string", "minLength": 12,
                                                                               "maxLength": 20},
                                                    "minItems": 4, "maxItems": 4}},
         "required": ["notes"], "additionalProperties": False}
PROMPTS = [f"Write four short notes about item {i} as JSON." + " Extra context here." * (i % 3) for i in range(6)]


def _request(rt, prompt, schema, *, seed, max_new_tokens, **kw):
    mode = kw.get("mode", "diffusion")
    opts = GenerateOptions.build(None, {"seed": seed, "max_new_tokens": max_new_tokens,
                                        "mode": "ar" if mode == "ar" else "diffusion"}, verb="generate")
    session = prepare(prompt, schema, rt, opts)
    return RowRequest(prompt_ids=session.prompt_ids, max_new_tokens=max_new_tokens, seed=session.seed,
                      session=session, tag=prompt, **kw)


def test_rows_joining_a_running_batch_get_what_they_get_alone(embedded_runtime):
    rt = embedded_runtime
    singles = {p: generate(p, NOTES, runtime=rt, seed=5, max_new_tokens=160, return_details=True).text
               for p in PROMPTS}
    sched = ContinuousScheduler(rt)
    results = {}
    k = 0
    while not sched.idle or k < len(PROMPTS):
        if k < len(PROMPTS):   # one new request per canvas: each joins a batch that is already running
            sched.submit(_request(rt, PROMPTS[k], NOTES, seed=5, max_new_tokens=160))
        for req, res in sched.step():
            results[req.tag] = res
        k += 1
    assert sched.counters["joined_running"] >= 2           # the test exercises joining, not only fresh batches
    for p in PROMPTS:
        assert results[p].text == singles[p]
        jsonschema.validate(json.loads(results[p].text), NOTES)


def test_finished_rows_leave_and_stopped_rows_skip_the_forward(tiny_runtime):
    rt = tiny_runtime
    L = rt.model.config.canvas_length
    guide = ConstraintGuide([], pad_token_id=rt.pad_token_id, budgets=[])
    batch = CanvasBatch(rt.model, settings=rt.settings, eos_token_ids=rt.eos_token_ids, pad_token_id=rt.pad_token_id,
                        hook=guide)
    sizes = []
    handle = rt.model.model.decoder.register_forward_pre_hook(
        lambda mod, args, kwargs: sizes.append(kwargs["decoder_input_ids"].shape[0]), with_kwargs=True)
    try:
        prompt = rt.encode_prompt("Say something.")
        ids = batch.admit([prompt, prompt, prompt], canvases=[1, 3, 2],
                          generators=[torch.Generator().manual_seed(s) for s in range(3)],
                          rows=[RowState(None), RowState(None), RowState(None)])
        left = []
        while batch.size:
            before = batch.size
            out = batch.run_canvas()
            left.append([r.id for r in out])
            assert batch.size == before - len(out)
    finally:
        handle.remove()
    finished_after = {rid: i for i, rids in enumerate(left) for rid in rids}
    # a row leaves after its own last canvas at the latest (a stop token may end it sooner)
    assert finished_after[ids[0]] == 0 and finished_after[ids[1]] <= 2 and finished_after[ids[2]] <= 1
    assert len(guide.rows) == 0 and len(guide.all_rows) == 3
    assert max(sizes) <= 3 and min(sizes) < 3      # forwards shrink as rows leave or stop denoising
    assert rt.model.config.canvas_length == L


def test_cancelled_row_times_out_and_the_others_finish(embedded_runtime):
    rt = embedded_runtime
    sched = ContinuousScheduler(rt)
    flag = {"stop": False}
    sched.submit(_request(rt, PROMPTS[0], NOTES, seed=1, max_new_tokens=160, stop=lambda: flag["stop"]))
    sched.submit(_request(rt, PROMPTS[1], NOTES, seed=1, max_new_tokens=160))
    results = {}
    steps = 0
    while not sched.idle:
        results.update({req.tag: res for req, res in sched.step()})
        steps += 1
        flag["stop"] = True      # the first request's caller goes away after the first canvas
    assert isinstance(results[PROMPTS[0]], GenerationTimeout) or PROMPTS[0] in results
    jsonschema.validate(json.loads(results[PROMPTS[1]].text), NOTES)


def test_a_failing_canvas_hands_its_rows_back_and_the_scheduler_goes_on(embedded_runtime, monkeypatch):
    rt = embedded_runtime
    sched = ContinuousScheduler(rt)
    sched.submit(_request(rt, PROMPTS[0], NOTES, seed=1, max_new_tokens=64))
    sched.submit(_request(rt, PROMPTS[1], NOTES, seed=1, max_new_tokens=64))

    def boom(self, *a, **k):
        raise RuntimeError("native crash stand-in")
    monkeypatch.setattr(CanvasBatch, "run_canvas", boom)
    out = sched.step()
    assert len(out) == 2 and all(isinstance(res, BatchFailed) for _, res in out)
    assert sched.idle and sched.counters["failed_batches"] == 1
    monkeypatch.undo()
    sched.submit(_request(rt, PROMPTS[2], NOTES, seed=1, max_new_tokens=160))
    results = []
    while not sched.idle:
        results += sched.step()
    jsonschema.validate(json.loads(results[0][1].text), NOTES)


def test_free_text_rows_are_capped_and_share_the_batch(embedded_runtime):
    rt = embedded_runtime
    sched = ContinuousScheduler(rt)
    ids = rt.encode_prompt("Tell me about the weather.")
    sched.submit(RowRequest(prompt_ids=ids, max_new_tokens=5, seed=0, tag="free"))
    sched.submit(_request(rt, PROMPTS[0], NOTES, seed=2, max_new_tokens=160))
    results = {}
    while not sched.idle:
        results.update({req.tag: res for req, res in sched.step()})
    free = results["free"]
    assert len(free.token_ids) <= 5 and free.value == free.text
    assert free.stats.finish_reason in ("stop", "length")
    jsonschema.validate(json.loads(results[PROMPTS[0]].text), NOTES)
    assert sched.counters["largest_batch"] == 2


def test_a_prompt_longer_than_the_batch_opens_a_new_batch(embedded_runtime):
    rt = embedded_runtime
    sched = ContinuousScheduler(rt, max_pad=0)
    sched.submit(_request(rt, "Short.", NOTES, seed=0, max_new_tokens=160))
    sched.step()
    long = "Write four short notes about this long text as JSON. " + "More words here. " * 40
    sched.submit(_request(rt, long, NOTES, seed=0, max_new_tokens=160))
    done = sched.step()
    assert sched.counters["batches_opened"] == 2 or any(r.tag == "Short." for r, _ in done)
    while not sched.idle:
        sched.step()


@pytest.mark.parametrize("bad", [0, -1])
def test_bad_max_rows(embedded_runtime, bad):
    with pytest.raises(ValueError):
        ContinuousScheduler(embedded_runtime, max_rows=bad)


def test_ar_rows_joining_a_running_batch_get_what_they_get_alone(embedded_runtime):
    rt = embedded_runtime
    singles = {p: generate(p, NOTES, runtime=rt, seed=1, mode="ar", max_new_tokens=160, return_details=True).text
               for p in PROMPTS}
    sched = ContinuousScheduler(rt)
    results, k = {}, 0
    while not sched.idle or k < 2:
        if k < 2:   # half, then the other half joins after the first 32 tokens
            for p in PROMPTS[3 * k:3 * k + 3]:
                sched.submit(_request(rt, p, NOTES, seed=1, max_new_tokens=160, mode="ar"))
        results.update({req.tag: res for req, res in sched.step()})
        k += 1
    assert sched.counters["rows_ar"] >= len(PROMPTS) and sched.counters["rows_diffusion"] == 0
    assert sched.counters["joined_running"] >= 1
    for p in PROMPTS:
        assert results[p].text == singles[p] and results[p].stats.mode == "ar"
        jsonschema.validate(json.loads(results[p].text), NOTES)


def test_auto_mode_runs_both_modes_and_every_output_is_valid(embedded_runtime):
    from dgemma_struct.scheduling.mode_choice import ModeChooser
    from dgemma_struct.training.corpus import make_corpus
    from dgemma_struct.training.evaluate import HELD_OUT_SEED

    rt = embedded_runtime
    corpus = [e for e in make_corpus(200, seed=HELD_OUT_SEED) if e.get("schema")][:8]
    sched = ContinuousScheduler(rt, chooser=ModeChooser(min_seconds=0.0), max_pad=0)
    results = {}
    for e in corpus:            # one at a time: every request opens a batch, so both modes get explored
        sched.submit(_request(rt, e["prompt"], e["schema"], seed=0, max_new_tokens=128, mode="auto"))
        while not sched.idle:
            results.update({req.tag: res for req, res in sched.step()})
    assert sched.counters["rows_ar"] >= 1 and sched.counters["rows_diffusion"] >= 1
    assert set(sched.chooser.summary()["ar"]) and set(sched.chooser.summary()["diffusion"])
    for e in corpus:
        jsonschema.validate(json.loads(results[e["prompt"]].text), e["schema"])


def test_requests_with_different_guide_knobs_never_share_a_batch(embedded_runtime):
    """The batch's guide is built from its first request's options: a request whose progress or
    closing rule differs opens its own batch instead of silently running under the other's."""
    rt = embedded_runtime

    def req(prompt, **knobs):
        opts = GenerateOptions.build(None, {"seed": 0, "max_new_tokens": 160, **knobs}, verb="generate")
        session = prepare(prompt, NOTES, rt, opts)
        return RowRequest(prompt_ids=session.prompt_ids, max_new_tokens=160, seed=session.seed, session=session,
                          tag=prompt)

    sched = ContinuousScheduler(rt)
    sched.submit(req(PROMPTS[0]))
    sched.submit(req(PROMPTS[1], progress=False))
    sched.submit(req(PROMPTS[2], close_on_budget=False))
    sched.submit(req(PROMPTS[3]))                      # same knobs as the first: joins it
    sched.step()
    guides = {b.guide: b for b in sched.batches}
    assert len(sched.batches) == 3 and len(guides) == 3
    for b in sched.batches:
        for r in b.rows.values():
            assert (b.guide.progress, b.guide.close_on_budget) == (r.session.opts.progress,
                                                                   r.session.opts.close_on_budget)
    while not sched.idle:
        sched.step()


def test_a_request_names_its_phase(embedded_runtime, monkeypatch):
    """waiting → running → (repairing) → done / cancelled / failed, as the scheduler moves it."""
    rt = embedded_runtime
    sched = ContinuousScheduler(rt)
    ok = _request(rt, PROMPTS[1], NOTES, seed=1, max_new_tokens=160)
    gone = _request(rt, PROMPTS[2], NOTES, seed=1, max_new_tokens=160, stop=lambda: True)
    for r in (ok, gone):
        sched.submit(r)
    assert ok.status is RowStatus.WAITING and not ok.status.finished
    seen = []
    while not sched.idle:
        for req, res in sched.step():
            seen.append((req.tag, req.status, res))
        if ok.status is RowStatus.RUNNING:
            seen.append(("running", ok.status, None))
    statuses = {tag: st for tag, st, _ in seen}
    assert statuses[PROMPTS[2]] is RowStatus.CANCELLED
    assert statuses[PROMPTS[1]] is RowStatus.DONE and statuses[PROMPTS[1]].finished
    assert ("running", RowStatus.RUNNING, None) in seen

    bad = _request(rt, PROMPTS[0], NOTES, seed=1, max_new_tokens=64)
    sched.submit(bad)
    monkeypatch.setattr(CanvasBatch, "run_canvas", lambda self, *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    assert [req.status for req, _ in sched.step()] == [RowStatus.FAILED]


def test_a_repair_row_is_repairing(embedded_runtime):
    from pydantic import BaseModel, field_validator

    calls = {"n": 0}

    class OnceBad(BaseModel):
        n: int

        @field_validator("n")
        @classmethod
        def first_is_rejected(cls, v):
            calls["n"] += 1
            if calls["n"] == 1:
                raise ValueError("the first value is rejected (forces one repair)")
            return v

    rt = embedded_runtime
    opts = GenerateOptions.build(None, {"seed": 1, "max_new_tokens": 32}, verb="generate")
    session = prepare("A number as JSON.", OnceBad, rt, opts)
    sched = ContinuousScheduler(rt)
    sched.submit(RowRequest(prompt_ids=session.prompt_ids, max_new_tokens=32, seed=session.seed, session=session))
    statuses, out = [], []
    while not sched.idle:
        out += sched.step()
        statuses += [r.status for b in sched.batches for r in b.rows.values()] + [r.status for r in sched.waiting]
    assert RowStatus.REPAIRING in statuses and calls["n"] >= 2
    assert [req.status for req, _ in out] == [RowStatus.DONE]


@pytest.mark.parametrize("mode", ["diffusion", "ar"])
def test_free_text_rows_record_logprobs_as_alone(embedded_runtime, mode):
    """A free-text row with ``logprobs`` next to a constrained row: its tokens and entries are the
    runtime's for the row alone (the server's free-text logprobs run on this road)."""
    rt = embedded_runtime
    ids = rt.encode_prompt("Say hello.")
    alone = rt.generate_ids([ids], max_new_tokens=20, seed=[4], mode=mode, logprobs=3)[0]
    sched = ContinuousScheduler(rt)
    sched.submit(_request(rt, PROMPTS[0], NOTES, seed=1, max_new_tokens=64, mode=mode))
    sched.submit(RowRequest(prompt_ids=ids, max_new_tokens=20, seed=4, mode=mode, logprobs=3, tag="free"))
    results = {}
    while not sched.idle:
        results.update({req.tag: res for req, res in sched.step()})
    free = results["free"]
    assert free.token_ids == alone.token_ids
    assert [e.token_id for e in free.logprobs] == free.token_ids
    assert all(abs(a.logprob - b.logprob) < 2e-3 for a, b in zip(free.logprobs, alone.logprobs))
    assert [len(e.top_logprobs) for e in free.logprobs] == [len(e.top_logprobs) for e in alone.logprobs]
