"""Issue 22: a denoising step's host reads of tensors (each a host-device sync on a GPU) and its new
canvas-sized buffers, outside the model's forward, do not grow with the batch. Counted on CPU by
:mod:`dgemma_struct.engine.profiling` at the real shape (vocab 262,144, canvas 256, random weights),
constrained JSON, B=1 and B=8, two denoising steps (the B=8 case takes ~40 s on one core, nearly all of it
the model). A whole run's host reads outside the steps (starting and ending canvases, the greedy fills,
the results) do not grow with the batch either: B identical rows read as often as one."""
from __future__ import annotations

import pytest
import torch

import dgemma_struct.engine.canvas as canvas_mod
from dgemma_struct.api import constraint_for
from dgemma_struct.guide.constraint_guide import ConstraintGuide
from dgemma_struct.engine.profiling import AllocationProbe, HostSyncProbe, model_section
from dgemma_struct.engine.sampler import DiffusionSettings

SCHEMA = {"type": "object", "properties": {"note": {"type": "string", "maxLength": 12},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["note", "n"], "additionalProperties": False}
STEPS = 2
MAX_READS_PER_STEP = 8
# a whole run's reads outside the steps at the real shape (one canvas): 4 fixed (a canvas's start and
# end, the results) + the rounds of the rows' greedy fills, read side by side (the most one row needs:
# 8-9 here). Before issue 22 they were per row: 22 at B=1, 129 at B=8.
MAX_READS_OUTSIDE_STEPS = 24


def test_the_probe_counts_every_kind_of_host_read():
    x = torch.arange(6.0)
    mask = x > 2
    with HostSyncProbe() as probe:
        x[1].item(), x.tolist(), bool(mask[0]), int(x[2]), float(x[3]), x.nonzero(), torch.where(mask)
        x[mask], x.cpu(), x.numpy(), torch.equal(x, x)
        x[mask] = 0.0
        if mask.any():
            pass
        x[torch.tensor([1, 2])], x[1:3], torch.where(mask, x, 0.0)  # index tensors, slices, masked ops: free
        with model_section():
            x.tolist()                                                  # inside the forward: not counted
    assert probe.counts == {"item": 1, "tolist": 1, "__bool__": 2, "__int__": 1, "__float__": 1, "nonzero": 1,
                            "where[nonzero]": 1, "__getitem__[bool]": 1, "cpu": 1, "numpy": 1, "equal": 1,
                            "__setitem__[bool]": 1}
    assert probe.total == 13


def test_the_allocation_probe_counts_new_buffers_not_views_or_in_place():
    x = torch.zeros(4, 100)
    with AllocationProbe(unit=400) as probe:
        x.add_(1), x[1:], x.view(-1)                   # in place, views: free
        y = x + 1                                       # one canvas-sized buffer
        torch.softmax(x[:2], dim=-1)                    # half of one
        with model_section():
            x * 2                                       # inside the forward: not counted
    assert probe.count == 1 and probe.canvas_rows == 1.5 and y.shape == x.shape


def _measure(rt, B: int, monkeypatch,
             seeds: list[int] | None = None) -> tuple[list[int], AllocationProbe, HostSyncProbe]:
    # a random model never gets confident: exactly STEPS steps
    monkeypatch.setattr(rt, "settings", DiffusionSettings(max_denoising_steps=STEPS, confidence_threshold=1e-9))
    constraint = constraint_for(SCHEMA, rt)
    guide = ConstraintGuide([constraint.canvas_walker() for _ in range(B)], pad_token_id=rt.pad_token_id or 0,
                            budgets=[40] * B, close_on_budget=True)
    cfg = rt.model.config
    reads, allocs = HostSyncProbe(), AllocationProbe(unit=cfg.canvas_length * cfg.text_config.vocab_size)
    step, per_step = canvas_mod.denoise_step, []

    def counted(*a, **k):
        before = reads.total
        step(*a, **k)
        per_step.append(reads.total - before)
    monkeypatch.setattr(canvas_mod, "denoise_step", counted)
    prompt = rt.encode_prompt("Give a note and a number as JSON.")
    with reads, allocs:
        res = rt.generate_ids([prompt] * B, max_new_tokens=40, seed=seeds or list(range(B)), hook=guide)
    assert res[0].stats.denoising_steps == len(per_step) >= 2
    monkeypatch.undo()
    return per_step, allocs, reads


@pytest.mark.parametrize("B", [1, 8])
def test_host_reads_and_canvas_buffers_per_step_do_not_grow_with_the_batch(gemma4_random_runtime, monkeypatch, B):
    per_step, allocs, reads = _measure(gemma4_random_runtime, B, monkeypatch)
    assert max(per_step) <= MAX_READS_PER_STEP, per_step
    assert allocs.canvas_rows / (len(per_step) * B) <= 1.0, dict(allocs.ops)
    assert reads.total - sum(per_step) <= MAX_READS_OUTSIDE_STEPS, dict(reads.counts)


@pytest.fixture(scope="module")
def tiny_rt():
    from dgemma_struct.testing import tiny_runtime

    return tiny_runtime()


def test_a_whole_runs_host_reads_outside_the_steps_do_not_grow_with_the_batch(tiny_rt, monkeypatch):
    """B copies of one row (same prompt, same seed: the same work per row, whoever shares the batch)
    read the device as often as the row alone, steps and everything around them (the greedy fills
    that end canvases, the results)."""
    runs = {B: _measure(tiny_rt, B, monkeypatch, seeds=[7] * B) for B in (1, 4, 8)}
    per_step = {B: p for B, (p, _, _) in runs.items()}
    outside = {B: r.total - sum(p) for B, (p, _, r) in runs.items()}
    assert per_step[1] == per_step[4] == per_step[8]
    assert outside[1] == outside[4] == outside[8], {B: dict(r.counts) for B, (_, _, r) in runs.items()}
    assert runs[8][2].counts == runs[1][2].counts
