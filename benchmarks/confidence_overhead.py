"""Wall-time overhead of per-field confidence (issue #36): the same requests with
``confidence=True`` and without, interleaved (off, on, on, off, ...) so the shared machine's load
hits both alike; embedded model, held-out JSON prompts, B=1 (``generate_json`` one request at a
time) and B=16 (``generate_batch``), both modes. Also checks that the outputs are identical.

Run::

    OMP_NUM_THREADS=1 python benchmarks/confidence_overhead.py --rounds 3
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from batch_scaling import held_out, write_results  # noqa: E402


def _one(rt: Any, e: dict, i: int, mode: str, confidence: bool) -> tuple[float, Any]:
    from dgemma_struct.api import generate_json

    t0, c0 = time.perf_counter(), time.process_time()
    r = generate_json(e["prompt"], e["schema"], runtime=rt, mode=mode, seed=i, return_details=True,
                      confidence=confidence)
    return time.perf_counter() - t0, r.token_ids, time.process_time() - c0


def _run(rt: Any, examples: list[dict], mode: str, confidence: bool) -> tuple[float, list]:
    """One ``generate_batch`` of all the requests (B=16)."""
    from dgemma_struct.api import generate_batch

    t0, c0 = time.perf_counter(), time.process_time()
    out = generate_batch([e["prompt"] for e in examples], [e["schema"] for e in examples], runtime=rt, mode=mode,
                         seed=list(range(len(examples))), return_exceptions=True, confidence=confidence)
    return time.perf_counter() - t0, [getattr(r, "token_ids", type(r).__name__) for r in out], \
        time.process_time() - c0


def markdown(r: dict) -> str:
    lines = [f"# Confidence overhead ({r['device']})", "",
             f"{r['requests']} held-out JSON requests, {r['rounds']} rounds; B=1: each request with and without "
             "back to back (alternating order), B=16: one generate_batch each (alternating order); median wall "
             "per round. CPU: this process's CPU time (all its threads), which the shared machine's load "
             "disturbs far less than the wall.", "",
             "| mode | B | wall off (s) | wall on (s) | wall overhead | CPU off (s) | CPU on (s) | CPU overhead | "
             "outputs identical |", "|---|---|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        lines.append(f"| {row['mode']} | {row['batch']} | {row['off_s']} | {row['on_s']} | {row['overhead']:+.1%} | "
                     f"{row['cpu_off_s']} | {row['cpu_on_s']} | {row['cpu_overhead']:+.1%} | {row['identical']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", nargs="+", default=["diffusion", "ar"])
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "confidence_overhead"))
    args = ap.parse_args()
    from dgemma_struct.runtime import DiffusionRuntime

    rt = DiffusionRuntime.default()
    examples = held_out(args.requests)
    rows = []
    for mode in args.modes:
        for batch in (1, 16):
            _one(rt, examples[0], 0, mode, False)   # warm
            walls: dict[bool, list[float]] = {False: [], True: []}
            cpus: dict[bool, list[float]] = {False: [], True: []}
            outs: dict[bool, list] = {}
            for k in range(args.rounds):
                if batch == 1:   # each request with and without, back to back, in alternating order
                    wall = {False: 0.0, True: 0.0}
                    cpu = {False: 0.0, True: 0.0}
                    outs = {False: [], True: []}
                    for i, e in enumerate(examples):
                        for conf in ((False, True) if (i + k) % 2 == 0 else (True, False)):
                            w, ids, c = _one(rt, e, i, mode, conf)
                            outs[conf].append(ids)
                            wall[conf] += w
                            cpu[conf] += c
                    for conf in (False, True):
                        walls[conf].append(wall[conf])
                        cpus[conf].append(cpu[conf])
                    continue
                for conf in ((False, True) if k % 2 == 0 else (True, False)):
                    w, outs[conf], c = _run(rt, examples, mode, conf)
                    walls[conf].append(w)
                    cpus[conf].append(c)
            off, on = statistics.median(walls[False]), statistics.median(walls[True])
            c_off, c_on = statistics.median(cpus[False]), statistics.median(cpus[True])
            rows.append({"mode": mode, "batch": batch, "off_s": round(off, 2), "on_s": round(on, 2),
                         "overhead": round(on / off - 1, 4), "cpu_off_s": round(c_off, 2), "cpu_on_s": round(c_on, 2),
                         "cpu_overhead": round(c_on / c_off - 1, 4), "walls": {str(k): v for k, v in walls.items()},
                         "cpus": {str(k): v for k, v in cpus.items()}, "identical": outs[False] == outs[True]})
            print(rows[-1], flush=True)
    write_results({"device": "cpu, 1 torch thread (shared 2-core box)", "requests": len(examples),
                   "rounds": args.rounds, "rows": rows}, args.out, markdown)


if __name__ == "__main__":
    main()
