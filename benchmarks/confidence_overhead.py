"""Wall-time overhead of per-field confidence (issue #36): the same requests with
``confidence=True`` and without, interleaved (off, on, on, off, ...) so the shared machine's load
hits both alike; embedded model, held-out JSON prompts, B=1 (``generate_json`` one request at a
time) and B=16 (``generate_batch``), both modes. Also checks that the outputs are identical.

On a shared machine the wall (and even the process CPU time) of one configuration swings more than
the overhead being measured, so the runs with confidence also time, on the calling thread's CPU
clock, every call that exists only because of it (the guide's logprob recording, the naming of the
entries, the mapping): ``recording CPU``, whose ratio to the CPU time without confidence is the
overhead without the machine's noise.

Run::

    OMP_NUM_THREADS=1 python benchmarks/confidence_overhead.py --rounds 5 --batch-rounds 15
"""
from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from batch_scaling import held_out, write_results  # noqa: E402


class Recording:
    """Thread CPU time spent in the calls confidence adds (patched in for the runs that ask)."""

    def __init__(self) -> None:
        self.ns = 0

    def timed(self, fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*a: Any, **k: Any) -> Any:
            t0 = time.thread_time_ns()
            try:
                return fn(*a, **k)
            finally:
                self.ns += time.thread_time_ns() - t0
        return wrapper

    @contextmanager
    def patched(self) -> Iterator[None]:
        from dgemma_struct.engine.token_logprobs import GuideLogprobs
        from dgemma_struct.repair import session

        saved = (GuideLogprobs.__dict__["record"], GuideLogprobs.record_ar, session.named, session.attach_confidence)
        GuideLogprobs.record = staticmethod(self.timed(saved[0].__func__))
        GuideLogprobs.record_ar = self.timed(saved[1])
        session.named, session.attach_confidence = self.timed(saved[2]), self.timed(saved[3])
        try:
            yield
        finally:
            GuideLogprobs.record, GuideLogprobs.record_ar, session.named, session.attach_confidence = saved


REC = Recording()


@contextmanager
def _timing(confidence: bool) -> Iterator[None]:
    if confidence:
        with REC.patched():
            yield
    else:
        yield


def _one(rt: Any, e: dict, i: int, mode: str, confidence: bool) -> tuple[float, Any, float]:
    from dgemma_struct.api import generate_json

    t0, c0 = time.perf_counter(), time.process_time()
    with _timing(confidence):
        r = generate_json(e["prompt"], e["schema"], runtime=rt, mode=mode, seed=i, return_details=True,
                          confidence=confidence)
    return time.perf_counter() - t0, r.token_ids, time.process_time() - c0


def _run(rt: Any, examples: list[dict], mode: str, confidence: bool) -> tuple[float, list, float]:
    """One ``generate_batch`` of all the requests (B=16)."""
    from dgemma_struct.api import generate_batch

    t0, c0 = time.perf_counter(), time.process_time()
    with _timing(confidence):
        out = generate_batch([e["prompt"] for e in examples], [e["schema"] for e in examples], runtime=rt,
                             mode=mode, seed=list(range(len(examples))), return_exceptions=True, confidence=confidence)
    return time.perf_counter() - t0, [getattr(r, "token_ids", type(r).__name__) for r in out], \
        time.process_time() - c0


def markdown(r: dict) -> str:
    lines = [f"# Confidence overhead ({r['device']}; code: {r.get('code', 'this tree')})", "",
             f"{r['requests']} held-out JSON requests, {r['rounds']} rounds at B=1, {r.get('batch_rounds', r['rounds'])} at "
             "B=16; B=1: each request with and without "
             "back to back (alternating order), B=16: one generate_batch each (alternating order). Wall and CPU "
             "(this process, all threads): per round (the 16 requests), medians over the rounds; overhead: the "
             "median over the pairs (B=1: one request with and without, 16 per round; B=16: the two batches of a "
             "round) of on/off - 1. Recording CPU: the thread CPU time of the calls confidence adds (guide "
             "recording, entry naming, mapping) in the runs with it, median per round; its share is of the CPU "
             "time without confidence (the overhead without the shared machine's noise).", "",
             "| mode | B | wall off (s) | wall on (s) | wall overhead | CPU off (s) | CPU on (s) | CPU overhead | "
             "recording CPU (s) | recording share | outputs identical |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        lines.append(f"| {row['mode']} | {row['batch']} | {row['off_s']} | {row['on_s']} | {row['overhead']:+.1%} | "
                     f"{row['cpu_off_s']} | {row['cpu_on_s']} | {row['cpu_overhead']:+.1%} | {row['recording_s']} | "
                     f"{row['recording_share']:+.1%} | {row['identical']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5, help="rounds at B=1 (16 request pairs each)")
    ap.add_argument("--batch-rounds", type=int, default=15, help="rounds at B=16 (one batch pair each)")
    ap.add_argument("--modes", nargs="+", default=["diffusion", "ar"])
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "confidence_overhead"))
    ap.add_argument("--code", default="this tree", help="what code was measured (for the results' title)")
    args = ap.parse_args()
    from dgemma_struct.runtime import DiffusionRuntime

    rt = DiffusionRuntime.default()
    examples = held_out(args.requests)
    rows = []
    for mode in args.modes:
        for batch in (1, 16):
            for conf in (False, True):   # warm (both roads)
                _one(rt, examples[0], 0, mode, conf)
            walls: dict[bool, list[float]] = {False: [], True: []}
            cpus: dict[bool, list[float]] = {False: [], True: []}
            outs: dict[bool, list] = {}
            recs: list[float] = []
            pairs: dict[str, list[float]] = {"wall": [], "cpu": []}   # on/off - 1 of each pair
            for k in range(args.rounds if batch == 1 else args.batch_rounds):
                REC.ns = 0
                if batch == 1:   # each request with and without, back to back, in alternating order
                    wall = {False: 0.0, True: 0.0}
                    cpu = {False: 0.0, True: 0.0}
                    outs = {False: [], True: []}
                    for i, e in enumerate(examples):
                        got = {}
                        for conf in ((False, True) if (i + k) % 2 == 0 else (True, False)):
                            w, ids, c = got[conf] = _one(rt, e, i, mode, conf)
                            outs[conf].append(ids)
                            wall[conf] += w
                            cpu[conf] += c
                        pairs["wall"].append(got[True][0] / got[False][0] - 1)
                        pairs["cpu"].append(got[True][2] / got[False][2] - 1)
                    for conf in (False, True):
                        walls[conf].append(wall[conf])
                        cpus[conf].append(cpu[conf])
                    recs.append(REC.ns / 1e9)
                    continue
                for conf in ((False, True) if k % 2 == 0 else (True, False)):
                    w, outs[conf], c = _run(rt, examples, mode, conf)
                    walls[conf].append(w)
                    cpus[conf].append(c)
                pairs["wall"].append(walls[True][-1] / walls[False][-1] - 1)
                pairs["cpu"].append(cpus[True][-1] / cpus[False][-1] - 1)
                recs.append(REC.ns / 1e9)
            off, on = statistics.median(walls[False]), statistics.median(walls[True])
            c_off, c_on = statistics.median(cpus[False]), statistics.median(cpus[True])
            rec = statistics.median(recs)
            rows.append({"mode": mode, "batch": batch, "off_s": round(off, 2), "on_s": round(on, 2),
                         "overhead": round(statistics.median(pairs["wall"]), 4), "cpu_off_s": round(c_off, 2),
                         "cpu_on_s": round(c_on, 2), "cpu_overhead": round(statistics.median(pairs["cpu"]), 4),
                         "pairs": len(pairs["wall"]),
                         "recording_s": round(rec, 3), "recording_share": round(rec / c_off, 4),
                         "walls": {str(k): v for k, v in walls.items()}, "cpus": {str(k): v for k, v in cpus.items()},
                         "recordings": recs, "identical": outs[False] == outs[True]})
            print(rows[-1], flush=True)
    write_results({"device": "cpu, 1 torch thread (shared 2-core box)", "code": args.code, "requests": len(examples),
                   "rounds": args.rounds, "batch_rounds": args.batch_rounds, "rows": rows}, args.out, markdown)


if __name__ == "__main__":
    main()
