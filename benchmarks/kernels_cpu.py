"""CPU timings of the torch path of dgemma_struct.kernels (apply bitmask + masked stats).

Usage::

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/kernels_cpu.py [--reps 7] [--threads 1]

Writes ``docs/results/kernels_cpu.json`` and ``docs/results/kernels_cpu.md`` and replaces the
table between the ``kernels_cpu`` markers in ``docs/kernels.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
try:
    from dgemma_struct.kernels import apply_token_bitmask_, masked_stats  # noqa: E402
except ImportError:  # running from a checkout without the package installed
    sys.path.insert(0, str(ROOT))
    from kernels import apply_token_bitmask_, masked_stats  # type: ignore  # noqa: E402

SHAPES = [(256, 32_768), (256, 151_936), (256, 262_144)]
BEGIN, END = "<!-- kernels_cpu:begin -->", "<!-- kernels_cpu:end -->"


def _time(fn, reps: int, warmup: int = 1) -> dict:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    p99 = float(np.percentile(ts, 99))
    return {"median_ms": statistics.median(ts), "p99_ms": p99, "min_ms": ts[0], "reps": reps}


def run(reps: int) -> dict:
    g = torch.Generator().manual_seed(0)
    results = []
    for rows, vocab in SHAPES:
        logits = torch.randn(rows, vocab, generator=g)
        work = logits.clone()
        width = (vocab + 31) // 32
        bm = torch.randint(-(2**31), 2**31 - 1, (rows, width), generator=g, dtype=torch.int32)
        n = reps if vocab <= 40_000 else max(3, reps // 2)
        gb = rows * vocab * 4 / 1e9
        for name, fn in [
            ("apply_token_bitmask_", lambda: apply_token_bitmask_(work, bm, backend="torch")),
            ("masked_stats", lambda: masked_stats(logits, bm, temperature=0.8, backend="torch")),
            ("masked_stats+gumbel", lambda: masked_stats(logits, bm, temperature=0.8, gumbel=True, seed=1,
                                                         backend="torch")),
        ]:
            r = _time(fn, n)
            r.update(op=name, rows=rows, vocab=vocab, logits_GB=gb, GB_per_s=gb / (r["median_ms"] / 1e3))
            results.append(r)
            print(json.dumps(r), flush=True)
    return {
        "backend": "torch (CPU)",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "note": "shared 2-core machine (a training job was running); p99 over few reps is ~max",
        "results": results,
    }


def to_markdown(summary: dict) -> str:
    lines = [
        f"CPU, torch {summary['torch']}, {summary['threads']} thread(s), {summary['note']}.",
        "",
        "| op | shape | median ms | p99 ms | logits GB/s (median) |",
        "|---|---|---:|---:|---:|",
    ]
    for r in summary["results"]:
        lines.append(f"| {r['op']} | [{r['rows']}, {r['vocab']}] | {r['median_ms']:.1f} | {r['p99_ms']:.1f} | "
                     f"{r['GB_per_s']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    summary = run(args.reps)
    out = ROOT / "docs" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels_cpu.json").write_text(json.dumps(summary, indent=2) + "\n")
    md = to_markdown(summary)
    (out / "kernels_cpu.md").write_text(md)
    doc = ROOT / "docs" / "kernels.md"
    if doc.exists():
        text = doc.read_text()
        if BEGIN in text and END in text:
            head, rest = text.split(BEGIN, 1)
            _, tail = rest.split(END, 1)
            doc.write_text(f"{head}{BEGIN}\n{md}{END}{tail}")
    print(md)


if __name__ == "__main__":
    main()
