"""Why the diffusion decoder lags the AR head on extraction (issue #33): teacher-forced next-token
accuracy of both, per checkpoint and evaluation split
(:func:`dgemma_struct.training.probe.frontier_accuracy`). ``ar``: the AR head after the prompt and
the answer so far; ``frontier``: the decoder at the first position of a canvas holding the answer
so far and random tokens after it (what the constraint guide decodes from); ``all random``: the
decoder on an all-random canvas. Writes ``docs/results/frontier_accuracy.{json,md}``.

Run (a checkpoint directory per ``--ckpt name=path``; ``shipped``: the embedded one)::

    OMP_NUM_THREADS=1 python benchmarks/frontier_accuracy.py --n 20 --ckpt shipped=shipped --ckpt ft=runs/ft4
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from dgemma_struct.training.generalise import EVAL_SPLITS as SPLITS

ROOT = Path(__file__).resolve().parents[1]


def table(rows: list[dict]) -> str:
    """One markdown row per checkpoint: per split, AR / decoder-at-frontier / decoder-on-noise.

    >>> r = {"name": "x", "what": "y", "splits": {s: {"ar": 0.8, "diffusion_frontier": 0.4,
    ...      "diffusion_all_random": 0.1, "tokens": 9} for s in SPLITS}}
    >>> table([r]).splitlines()[2]
    '| x | y | 80.0% / 40.0% / 10.0% | 80.0% / 40.0% / 10.0% | 80.0% / 40.0% / 10.0% |'
    """
    lines = ["| checkpoint | what | " + " | ".join(f"{s}: AR / frontier / all random" for s in SPLITS) + " |",
             "|---|---|" + "--:|" * len(SPLITS)]
    for r in rows:
        cells = [" / ".join(f"{100 * r['splits'][s][k]:.1f}%" for k in ("ar", "diffusion_frontier",
                                                                        "diffusion_all_random")) for s in SPLITS]
        lines.append(f"| {r['name']} | {r['what']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import torch

    from dgemma_struct.training.probe import frontier_accuracy
    from dgemma_struct.training.recipe import embedded_path, load_init

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20, help="answers per split")
    ap.add_argument("--ckpt", action="append", required=True, help="name=path[=description]")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "frontier_accuracy"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for spec in args.ckpt:
        name, path, *what = spec.split("=", 2)
        tok, model = load_init(embedded_path() if path == "shipped" else path)
        t0 = time.perf_counter()
        rows.append({"name": name, "path": path, "what": what[0] if what else path,
                     "splits": frontier_accuracy(model, tok, n=args.n), "seconds": round(time.perf_counter() - t0, 1)})
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({"issue": 33, "n_per_split": args.n, "rows": rows}, indent=1) + "\n")
    out.with_suffix(".md").write_text(table(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
