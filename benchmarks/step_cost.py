"""Per-step cost at the real checkpoint's shape: everything a denoising step does besides the
model forward, as a ratio to that forward, for the code in this tree and (``--old-src``) an older
tree, measured in the same run.

A random-weight DiffusionGemma at real shape (vocab 262,144, canvas 256, 5:1 sliding/full layers,
``model_config.real_shape_config``) with the Gemma 4 tokenizer from ``../shared``; one canvas of
256 positions, a fixed number of denoising steps (the stopper cannot fire on a random model).
Arms: ``free`` (no constraint: the path that must reproduce ``model.generate``) and ``json``
(a JSON-Schema constraint through ``ConstraintGuide``). Not a timed test; numbers go to
``docs/benchmarks.md``.

    # before/after: a worktree of the old commit (never a checkout in the main tree)
    git worktree add --detach /tmp/old <commit>
    OMP_NUM_THREADS=1 python benchmarks/step_cost.py --old-src /tmp/old/src --steps 4
"""
from __future__ import annotations

import argparse
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
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "city": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "city", "age"], "additionalProperties": False}


def worker(steps: int, arms: list[str], repeats: int) -> dict:
    import torch
    from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion

    import dgemma_struct
    from dgemma_struct.api import constraint_for
    from dgemma_struct.guide import ConstraintGuide
    from dgemma_struct.model_config import real_shape_config
    from dgemma_struct.runtime import DiffusionRuntime
    from dgemma_struct.sampler import DiffusionSettings

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(real_shape_config()).eval()
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    rt = DiffusionRuntime(model, tok, name="real-shape")
    # a random model never gets confident: exactly ``steps`` steps per canvas
    rt.settings = DiffusionSettings(max_denoising_steps=steps, entropy_bound=0.1, confidence_threshold=1e-9)
    prompt = rt.encode_prompt("Extract the name, city and age as JSON.\nAda Lovelace, 36, lives in London.")
    out: dict = {"src": str(Path(dgemma_struct.__file__).parent), "arms": {}}
    constraint = constraint_for(SCHEMA, rt) if "json" in arms else None
    for arm in arms:
        rows = []
        for r in range(repeats):
            hook = ConstraintGuide([constraint.canvas_walker()], pad_token_id=rt.pad_token_id or 0) \
                if arm == "json" else None
            t0 = time.perf_counter()
            res = rt.generate_ids([prompt], max_new_tokens=256, seed=r, hook=hook)[0]
            wall = time.perf_counter() - t0
            s = res.stats
            rows.append({"wall_s": wall, "model_s": s.model_s, "steps": s.denoising_steps,
                         "hook_s": s.mask_s})
        best = min(rows, key=lambda x: x["wall_s"] - x["model_s"])
        n = best["steps"]
        out["arms"][arm] = {
            "steps": n, "forward_ms_per_step": 1e3 * best["model_s"] / n,
            "other_ms_per_step": 1e3 * (best["wall_s"] - best["model_s"]) / n,
            "guide_ms_per_step": 1e3 * best["hook_s"] / n,
            "other_over_forward": (best["wall_s"] - best["model_s"]) / best["model_s"], "runs": rows}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--arms", default="free,json")
    ap.add_argument("--old-src", default=None, help="src/ folder of the code to compare against")
    ap.add_argument("--out", default=None, help="write the JSON result here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    arms = a.arms.split(",")
    if a.worker:
        print(json.dumps(worker(a.steps, arms, a.repeats)))
        return
    results = {}
    trees = ([("before", a.old_src)] if a.old_src else []) + [("after", str(ROOT / "src"))]
    for label, src in trees:
        env = dict(os.environ, PYTHONPATH=src, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        cmd = [sys.executable, __file__, "--worker", "--steps", str(a.steps), "--arms", a.arms,
               "--repeats", str(a.repeats)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        results[label] = json.loads(proc.stdout.strip().splitlines()[-1])
    for label, r in results.items():
        for arm, v in r["arms"].items():
            print(f"{label:6s} {arm:4s} forward {v['forward_ms_per_step']:8.1f} ms/step   other "
                  f"{v['other_ms_per_step']:8.1f} ms/step (guide {v['guide_ms_per_step']:6.1f})   "
                  f"other/forward {v['other_over_forward']:.2f}")
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
