"""Repair convergence (issue #32): the repair corpus (tests/repair/repair_corpus.py) on the embedded
model, diffusion and AR, several seeds, with the exclusion rule and without it (the rule switched
off: repairs may write a rejected value again, as before #32); plus the hard cases, whose prompt's
fact breaks the rule, so that every attempt is a repair.

Counts per case: requests, GenerationFailed (and LengthError), invalid values returned (must be 0),
distinct rejected values and how many of them an attempt wrote again (the rule keeps it at 0).
Writes docs/results/repair_convergence.{json,md}; docs/repair.md renders its tables.

    OMP_NUM_THREADS=1 python benchmarks/repair_convergence.py --seeds 3
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "repair"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from batch_scaling import write_results  # noqa: E402

from repair_corpus import CASES, HARD_CASES, run_case  # noqa: E402

from dgemma_struct.repair.session import RepairSession  # noqa: E402
from dgemma_struct.runtime import DiffusionRuntime  # noqa: E402

MODES = ("diffusion", "ar")


def run(cases: list, seeds: int, rule: bool, rt: Any, max_repairs: int = 2) -> list[dict]:
    """Every case x mode x seed, with the exclusion rule on or off."""
    original = RepairSession.exclusion
    if not rule:
        RepairSession.exclusion = lambda self: None   # type: ignore[method-assign]
    rows = []
    try:
        for c in cases:
            for mode in MODES:
                for seed in range(seeds):
                    t0 = time.perf_counter()
                    r = run_case(c, mode=mode, seed=seed, runtime=rt, max_repairs=max_repairs)
                    rows.append({"case": c.name, "mode": mode, "seed": seed, "ok": r.ok, "valid": r.valid,
                                 "error": r.error, "attempts": r.attempts, "rejected": r.rejected,
                                 "retried": r.retried, "wall_s": round(time.perf_counter() - t0, 3)})
    finally:
        RepairSession.exclusion = original   # type: ignore[method-assign]
    return rows


def summary(rows: list[dict]) -> dict[str, dict]:
    """Per case: requests, failed, invalid returned, repairs run, rejected and retried values."""
    out: dict[str, dict] = {}
    for r in rows:
        s = out.setdefault(r["case"], {"requests": 0, "failed": 0, "invalid": 0, "repaired": 0, "rejected": 0,
                                       "retried": 0})
        s["requests"] += 1
        s["failed"] += not r["ok"]
        s["invalid"] += r["ok"] and not r["valid"]
        s["repaired"] += r["rejected"] > 0
        s["rejected"] += r["rejected"]
        s["retried"] += r["retried"]
    return out


def _total(s: dict[str, dict]) -> dict:
    keys = ("requests", "failed", "invalid", "repaired", "rejected", "retried")
    return {k: sum(v[k] for v in s.values()) for k in keys}


def markdown(result: dict) -> str:
    lines = [f"Embedded model, CPU, one torch thread; {result['seeds']} seeds x diffusion and AR per case, "
             f"max_new_tokens=64, max_repairs=2. *with* = the exclusion rule, *without* = switched off.", ""]
    lines += ["| rule (corpus case) | requests | repaired | GenerationFailed with / without | "
              "invalid returned | rejected values retried with / without |",
              "|---|--:|--:|--:|--:|--:|"]
    on, off = result["corpus"]["with"], result["corpus"]["without"]
    for name in on:
        a, b = on[name], off[name]
        lines.append(f"| {name} | {a['requests']} | {a['repaired']} | {a['failed']} / {b['failed']} | "
                     f"{a['invalid']} | {a['retried']} / {b['retried']} |")
    ta, tb = _total(on), _total(off)
    lines.append(f"| **all** | {ta['requests']} | {ta['repaired']} | **{ta['failed']}** "
                 f"({100 * ta['failed'] / ta['requests']:.1f}%) / {tb['failed']} "
                 f"({100 * tb['failed'] / tb['requests']:.1f}%) | {ta['invalid']} | {ta['retried']} / {tb['retried']} |")
    lines += ["", "| hard case (the prompt breaks the rule) | requests | GenerationFailed with / without | "
              "invalid returned | distinct values rejected with / without | retried with / without |",
              "|---|--:|--:|--:|--:|--:|"]
    hon, hoff = result["hard"]["with"], result["hard"]["without"]
    for name in hon:
        a, b = hon[name], hoff[name]
        lines.append(f"| {name} | {a['requests']} | {a['failed']} / {b['failed']} | {a['invalid']} | "
                     f"{a['rejected']} / {b['rejected']} | {a['retried']} / {b['retried']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "repair_convergence"))
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    rt = DiffusionRuntime.default()
    t0 = time.perf_counter()
    rows = {rule: run(CASES, args.seeds, rule == "with", rt) for rule in ("with", "without")}
    hard = {rule: run(HARD_CASES, 1, rule == "with", rt) for rule in ("with", "without")}
    result = {"seeds": args.seeds, "wall_s": round(time.perf_counter() - t0, 1),
              "corpus": {k: summary(v) for k, v in rows.items()}, "hard": {k: summary(v) for k, v in hard.items()},
              "rows": rows, "hard_rows": hard}
    write_results(result, args.out, markdown)


if __name__ == "__main__":
    main()
