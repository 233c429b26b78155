"""Per-step cost at the real checkpoint's shape: everything a denoising step does besides the
model forward (time as a ratio to that forward, host reads of tensors, new canvas-sized buffers),
for the code in this tree and (``--old-src``) an older tree, measured in the same run.

A random-weight DiffusionGemma at real shape (vocab 262,144, canvas 256, 5:1 sliding/full layers,
``model_config.real_shape_config``) with the Gemma 4 tokenizer from ``../shared``; a fixed number
of denoising steps per canvas (the stopper cannot fire on a random model). Timing arms: ``free``
(no constraint: the path that must reproduce ``model.generate``) and ``json`` (a JSON-Schema
constraint through ``ConstraintGuide``, budgeted and closing as the verbs run it), B=1. Probe arms:
the constrained step at each ``--batches`` size under :class:`dgemma_struct.engine.profiling.HostSyncProbe`
and :class:`~dgemma_struct.engine.profiling.AllocationProbe` (the model's forward excluded; the probes are
loaded from this tree, so an old tree is counted the same way). Not a timed test.

    # before/after: a worktree of the old commit (never a checkout in the main tree)
    git worktree add --detach /tmp/old <commit>
    OMP_NUM_THREADS=1 python benchmarks/step_cost.py --old-src /tmp/old/src --steps 4 \
        --out docs/results/step_cost.json
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = next((p for p in (ROOT.parent / "shared" / "data" / "gemma4-tokenizer",
                               Path("/work/shared/data/gemma4-tokenizer")) if p.is_dir()),
                 ROOT.parent / "shared" / "data" / "gemma4-tokenizer")
SCHEMA = {"type": "object", "properties": {"note": {"type": "string", "maxLength": 12},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["note", "n"], "additionalProperties": False}
PROMPT = "Give a note and a number as JSON."


def _probes():
    """The probe module of *this* tree, whatever ``dgemma_struct`` is on the path."""
    spec = importlib.util.spec_from_file_location("_step_cost_profiling", ROOT / "src" / "dgemma_struct" / "engine" / "profiling.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def exclude_forward(model, section) -> None:
    """The model's encoder and decoder forwards run inside ``section`` (not counted by the probes)."""
    for m in (model, model.model.encoder):
        fwd = m.forward

        def wrapped(*a, _fwd=fwd, **k):
            with section():
                return _fwd(*a, **k)
        m.forward = wrapped


def guide_for(rt, constraint, B: int, max_new: int):
    from dgemma_struct.guide.constraint_guide import ConstraintGuide

    return ConstraintGuide([constraint.canvas_walker() for _ in range(B)], pad_token_id=rt.pad_token_id or 0,
                           budgets=[max_new] * B, close_on_budget=True)


def count_step(rt, constraint, B: int, max_new: int, prof) -> dict:
    """Host reads and canvas-sized allocations per denoising step of one constrained batch of B rows."""
    prompt = rt.encode_prompt(PROMPT)
    cfg = rt.model.config
    hook = guide_for(rt, constraint, B, max_new)
    reads, allocs = prof.HostSyncProbe(), prof.AllocationProbe(cfg.canvas_length * cfg.text_config.vocab_size)
    import dgemma_struct.engine.canvas as canvas_mod

    step, in_step = canvas_mod.denoise_step, []

    def counted(*a, **k):  # reads inside each denoising step (the loop's own checks and canvas work aside)
        before = reads.total
        step(*a, **k)
        in_step.append(reads.total - before)
    canvas_mod.denoise_step = counted
    try:
        with reads, allocs:
            res = rt.generate_ids([prompt] * B, max_new_tokens=max_new, seed=list(range(B)), hook=hook)
    finally:
        canvas_mod.denoise_step = step
    steps = res[0].stats.denoising_steps
    return {"B": B, "steps": steps, "host_reads": reads.total, "host_reads_per_step": reads.total / steps,
            "host_reads_in_step_max": max(in_step),
            "reads_by_kind": dict(reads.counts), "canvas_sized_allocs": allocs.count,
            "canvas_rows_allocated": allocs.canvas_rows,
            "canvas_allocs_per_row_step": allocs.canvas_rows / steps / B, "allocs_by_op": dict(allocs.ops)}


def worker(steps: int, arms: list[str], repeats: int, batches: list[int]) -> dict:
    import torch
    from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion

    import dgemma_struct
    from dgemma_struct.api import constraint_for
    from dgemma_struct.engine.model_config import real_shape_config
    from dgemma_struct.runtime import DiffusionRuntime
    from dgemma_struct.engine.sampler import DiffusionSettings

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(real_shape_config()).eval()
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    rt = DiffusionRuntime(model, tok, name="real-shape")
    # a random model never gets confident: exactly ``steps`` steps per canvas
    rt.settings = DiffusionSettings(max_denoising_steps=steps, entropy_bound=0.1, confidence_threshold=1e-9)
    prompt = rt.encode_prompt(PROMPT)
    out: dict = {"src": str(Path(dgemma_struct.__file__).parent), "arms": {}, "probes": []}
    constraint = constraint_for(SCHEMA, rt)
    prof = _probes()
    exclude_forward(model, prof.model_section)
    for arm in arms:
        rows = []
        for r in range(repeats):
            hook = guide_for(rt, constraint, 1, 256) if arm == "json" else None
            t0 = time.perf_counter()
            res = rt.generate_ids([prompt], max_new_tokens=256, seed=r, hook=hook)[0]
            wall = time.perf_counter() - t0
            s = res.stats
            rows.append({"wall_s": wall, "model_s": s.model_s, "steps": s.denoising_steps, "hook_s": s.mask_s})
        best = min(rows, key=lambda x: x["wall_s"] - x["model_s"])
        n = best["steps"]
        out["arms"][arm] = {
            "steps": n, "forward_ms_per_step": 1e3 * best["model_s"] / n,
            "other_ms_per_step": 1e3 * (best["wall_s"] - best["model_s"]) / n,
            "guide_ms_per_step": 1e3 * best["hook_s"] / n,
            "other_over_forward": (best["wall_s"] - best["model_s"]) / best["model_s"],
            "other_share": (best["wall_s"] - best["model_s"]) / best["wall_s"], "runs": rows}
    for B in batches:
        out["probes"].append(count_step(rt, constraint, B, 24, prof))
    return out


def markdown(results: dict) -> str:
    lines = ["# Per-step cost outside the forward (real shape, CPU, one thread)", "",
             "`benchmarks/step_cost.py`: random-weight DiffusionGemma at vocab 262,144 / canvas 256, constrained",
             "JSON. Host reads: `.item()` / `.tolist()` / `bool()` / `nonzero` / bool-mask indexing / `.cpu()` ... per",
             "denoising step, everything outside the model's forward counted (canvas start and commit included).", "",
             "| tree | B | host reads / step (all) | most in one `denoise_step` | new canvas rows / row / step |",
             "|---|--:|--:|--:|--:|"]
    for label, r in results.items():
        for p in r["probes"]:
            lines.append(f"| {label} | {p['B']} | {p['host_reads_per_step']:.1f} | {p['host_reads_in_step_max']} | "
                         f"{p['canvas_allocs_per_row_step']:.2f} |")
    lines += ["", "| tree | arm | forward ms/step | other ms/step | other / (forward + other) |", "|---|---|--:|--:|--:|"]
    for label, r in results.items():
        for arm, v in r["arms"].items():
            lines.append(f"| {label} | {arm} | {v['forward_ms_per_step']:.0f} | {v['other_ms_per_step']:.0f} | "
                         f"{v['other_share']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--arms", default="free,json")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--old-src", default=None, help="src/ folder of the code to compare against")
    ap.add_argument("--out", default=None, help="write the JSON result here (and the table next to it as .md)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    arms = [x for x in a.arms.split(",") if x]
    batches = [int(x) for x in a.batches.split(",") if x]
    if a.worker:
        print(json.dumps(worker(a.steps, arms, a.repeats, batches)))
        return
    results = {}
    trees = ([("before", a.old_src)] if a.old_src else []) + [("after", str(ROOT / "src"))]
    for label, src in trees:
        env = dict(os.environ, PYTHONPATH=src, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        cmd = [sys.executable, __file__, "--worker", "--steps", str(a.steps), "--arms", a.arms,
               "--repeats", str(a.repeats), "--batches", a.batches]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"{label}: {proc.stderr[-3000:]}")
        results[label] = json.loads(proc.stdout.strip().splitlines()[-1])
    text = markdown(results)
    print(text)
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))
        Path(a.out).with_suffix(".md").write_text(text)


if __name__ == "__main__":
    main()
