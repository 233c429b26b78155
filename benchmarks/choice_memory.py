"""Peak memory and time of choice scoring over many options (issue #36): ``score_choices`` over
``--options`` distinct options with the embedded model, each estimator, each run in its own
process (peak RSS is a per-process high-water mark), the RSS after loading the model subtracted.

``--module PATH`` scores with another copy of ``choice_scores.py`` (the code before a change), so
before / after are measured on the same machine in the same way.

Run::

    OMP_NUM_THREADS=1 python benchmarks/choice_memory.py --options 2000
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

PROMPT = "Which product is it?\nThe order was for the blue desk lamp, item 1234."


def options(n: int) -> list[str]:
    """``n`` distinct options of a few tokens each."""
    return [f"item {i} lamp" for i in range(n)]


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # KiB on Linux


def child(n: int, estimator: str, module: str | None) -> dict[str, Any]:
    """One measurement in this process: ``{"peak_extra_mib", "seconds", ...}``."""
    from dgemma_struct.runtime import DiffusionRuntime

    if module:
        spec = importlib.util.spec_from_file_location("choice_scores_under_test", module)
        cs = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = cs   # dataclasses look their module up
        spec.loader.exec_module(cs)
    else:
        import dgemma_struct.choice_scores as cs
    rt = DiffusionRuntime.default()
    cs.score_choices(PROMPT, ["yes", "no"], runtime=rt, estimator=estimator)   # warm: code paths, allocator
    base = _rss_mib()
    t0 = time.perf_counter()
    res = cs.score_choices(PROMPT, options(n), runtime=rt, estimator=estimator)
    wall = time.perf_counter() - t0
    return {"options": n, "estimator": estimator, "seconds": round(wall, 2),
            "peak_extra_mib": round(_rss_mib() - base, 1), "forward_passes": res.forward_passes,
            "best": res.best}


def markdown(r: dict) -> str:
    lines = [f"# Choice scoring memory ({r['device']})", "",
             f"`score_choices` over {r['options']} options with the embedded model, one process per run; peak RSS "
             "above the RSS after loading the model and a warm call.", "",
             "| code | estimator | options | seconds | peak extra RSS (MiB) | forward passes | same best option |",
             "|---|---|---|---|---|---|---|"]
    for row in r["runs"]:
        lines.append(f"| {row['code']} | {row['estimator']} | {row['options']} | {row['seconds']} | "
                     f"{row['peak_extra_mib']} | {row['forward_passes']} | {row.get('same_best', '')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--options", type=int, default=2000)
    ap.add_argument("--estimators", nargs="+", default=["canvas", "ar"])
    ap.add_argument("--before", default=None, help="path of the choice_scores.py before the change")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "choice_memory"))
    ap.add_argument("--child", nargs=3, metavar=("N", "ESTIMATOR", "MODULE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        n, est, mod = args.child
        print(json.dumps(child(int(n), est, None if mod == "-" else mod)))
        return
    from batch_scaling import write_results

    runs = []
    for est in args.estimators:
        best = {}
        for code, mod in (("before", args.before), ("after", "-")):
            if code == "before" and not args.before:
                continue
            out = subprocess.run([sys.executable, __file__, "--child", str(args.options), est, mod or "-"],
                                 capture_output=True, text=True, check=True)
            row = {"code": code, **json.loads(out.stdout.strip().splitlines()[-1])}
            best[code] = row["best"]
            row["same_best"] = best.get("before", row["best"]) == row["best"]
            runs.append(row)
            print(row, flush=True)
    write_results({"options": args.options, "device": "cpu, 1 torch thread (shared 2-core box)", "runs": runs},
                  args.out, markdown)


if __name__ == "__main__":
    main()
