"""Canonical tokens at forced boundaries (``canonical_tokens``), on and off, side by side in one run.

In AR the guide moves a token's probability onto the piece canonical tokenization writes when the
grammar forces the bytes after it (``":`` before a string value becomes ``":"``;
:mod:`dgemma_struct.guide.canonical`). This runs ``evaluate_splits`` on a checkpoint (the embedded one
by default) in AR, constrained and grounded, with the rule off and on, on the same prompts and seeds,
and writes ``docs/results/canonical_tokens.{json,md}``. Diffusion is not measured: the canvas does not
use the rule (see the module).

    OMP_NUM_THREADS=1 python benchmarks/canonical_tokens.py --n 100     # ≈ 6 min on one core
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from dgemma_struct.runtime import DiffusionRuntime
from dgemma_struct.training.eval_splits import EVAL_SPLITS, evaluate_splits

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("constrained", "grounded")


def markdown(report: dict) -> str:
    """Field accuracy and exact records per split and arm, the rule off and on."""
    lines = [f"AR on `evaluate_splits(n={report['n']})`, model `{report['model']}`, {report['machine']}.", "",
             "| split | arm | field accuracy off | field accuracy on | exact records off | exact records on |"
             " repairs per request off / on | s per request off / on | requests with an error off / on |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|"]
    off, on = report["runs"]["off"]["splits"], report["runs"]["on"]["splits"]
    for split in EVAL_SPLITS:
        for arm in ARMS:
            a, b = off[split]["ar"][arm], on[split]["ar"][arm]
            lines.append(f"| {split.replace('_', ' ')} | {arm} | {100 * a['field_accuracy']:.1f}% | "
                         f"{100 * b['field_accuracy']:.1f}% | {100 * a['exact_records']:.1f}% | "
                         f"{100 * b['exact_records']:.1f}% | {a['repairs_per_request']:.2f} / "
                         f"{b['repairs_per_request']:.2f} | {a['seconds_per_request']:.2f} / "
                         f"{b['seconds_per_request']:.2f} | {a['errors']} / {b['errors']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "canonical_tokens"))
    ap.add_argument("--render", action="store_true", help="only rewrite the .md from the .json")
    args = ap.parse_args()
    out = Path(args.out)
    if args.render:
        out.with_suffix(".md").write_text(markdown(json.loads(out.with_suffix(".json").read_text())))
        return
    torch.set_num_threads(1)
    rt = DiffusionRuntime.default(device="cpu") if args.model == "embedded" else \
        DiffusionRuntime.from_pretrained(args.model, device="cpu")
    report: dict = {"n": args.n, "model": args.model, "machine": f"{platform.machine()} CPU, torch "
                    f"{torch.__version__}, 1 thread", "runs": {}}
    for name, canonical in (("off", False), ("on", True)):
        t0 = time.perf_counter()
        rep = evaluate_splits(rt, args.n, modes=("ar",), arms=ARMS, options={"canonical_tokens": canonical})
        rep["seconds"] = round(time.perf_counter() - t0, 1)
        report["runs"][name] = rep
        print(name, {s: {a: round(rep["splits"][s]["ar"][a]["field_accuracy"], 3) for a in ARMS}
                     for s in EVAL_SPLITS}, flush=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
