"""Batched constrained diffusion vs one row at a time, on the embedded model: same outputs?
repairs per row? valid outputs per second? For this tree and (``--old-src``) an older one, in the
same run. Not a timed test. ``--out X.json`` also writes ``X.md`` (the table docs/benchmarks.md renders
through scripts/render_docs.py).

    OMP_NUM_THREADS=1 python benchmarks/batch_rows.py --n 16 --batch 8 --out docs/results/batch_rows.json
    git worktree add --detach /tmp/old <commit>       # optional: an older tree as a "before" column
    OMP_NUM_THREADS=1 python benchmarks/batch_rows.py --old-src /tmp/old/src --n 16 --batch 8
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


def worker(n: int, batch: int, seed: int) -> dict:
    import torch

    from dgemma_struct import DiffusionRuntime, generate, generate_batch
    from dgemma_struct.training.corpus import make_corpus
    from dgemma_struct.training.evaluate import HELD_OUT_SEED

    torch.set_num_threads(1)
    rt = DiffusionRuntime.default()
    corpus = [e for e in make_corpus(400, seed=HELD_OUT_SEED) if e.get("schema")][:n]
    prompts, schemas = [e["prompt"] for e in corpus], [e["schema"] for e in corpus]
    generate(prompts[0], schemas[0], runtime=rt, seed=seed)  # warm-up: compile caches, first-call costs
    t0 = time.perf_counter()
    single = [generate(p, s, runtime=rt, seed=seed, return_details=True) for p, s in zip(prompts, schemas)]
    t_single = time.perf_counter() - t0
    t0 = time.perf_counter()
    batched = []
    for i in range(0, n, batch):
        batched += generate_batch(prompts[i:i + batch], schemas[i:i + batch], runtime=rt, seed=seed,
                                  return_exceptions=True)
    t_batch = time.perf_counter() - t0
    ok_b = [r for r in batched if not isinstance(r, Exception)]
    return {"n": n, "batch": batch,
            "same_text": sum(1 for a, b in zip(single, batched) if not isinstance(b, Exception) and a.text == b.text),
            "repairs_single": sum(r.stats.repairs for r in single), "repairs_batch": sum(r.stats.repairs for r in ok_b),
            "valid_single": len(single), "valid_batch": len(ok_b),
            "valid_per_s_single": len(single) / t_single, "valid_per_s_batch": len(ok_b) / t_batch}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--old-src", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.n, a.batch, a.seed)))
        return
    results = {}
    for label, src in ([("before", a.old_src)] if a.old_src else []) + [("after", str(ROOT / "src"))]:
        env = dict(os.environ, PYTHONPATH=src, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        proc = subprocess.run([sys.executable, __file__, "--worker", "--n", str(a.n), "--batch", str(a.batch),
                               "--seed", str(a.seed)], env=env, capture_output=True, text=True, check=True)
        results[label] = r = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{label:6s} same text {r['same_text']}/{r['n']}  repairs single {r['repairs_single']} batch "
              f"{r['repairs_batch']}  valid/s single {r['valid_per_s_single']:.2f} batch(B={r['batch']}) "
              f"{r['valid_per_s_batch']:.2f}")
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))
        Path(a.out).with_suffix(".md").write_text(markdown(results))


def markdown(results: dict) -> str:
    """The results as a table, one column per tree (``before`` when measured, ``after``)."""
    cols = list(results)
    first = results[cols[0]]
    rows = [("batched output == single-row output", lambda r: f"{r['same_text']}/{r['n']}"),
            ("repairs, single rows / batched", lambda r: f"{r['repairs_single']} / {r['repairs_batch']}"),
            ("valid outputs, single rows / batched", lambda r: f"{r['valid_single']} / {r['valid_batch']}"),
            (f"valid outputs/s, single rows / batched (B={first['batch']})",
             lambda r: f"{r['valid_per_s_single']:.2f} / {r['valid_per_s_batch']:.2f}")]
    lines = ["# Batched constrained canvases vs one row at a time (benchmarks/batch_rows.py)", "",
             f"{first['n']} held-out JSON prompts on the embedded model, seed 0, one torch thread; one at a time vs "
             f"`generate_batch` in batches of {first['batch']}.", "",
             "| | " + " | ".join({"after": "this tree", "before": "--old-src tree"}.get(c, c) for c in cols) + " |",
             "|---|" + "--:|" * len(cols)]
    lines += [f"| {label} | " + " | ".join(f(results[c]) for c in cols) + " |" for label, f in rows]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
