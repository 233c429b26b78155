"""One call on a GPU box: train on the generalisation corpus, then evaluate the checkpoint per split.

Trains with :func:`~dgemma_struct.training.train.train` (``corpus="generalise"``, wall-time
schedule), then runs :func:`~dgemma_struct.training.eval_splits.evaluate_splits` (constrained
and grounded, diffusion and AR) on the new checkpoint and, for comparison, on the shipped
embedded model, and writes ``model_eval_generalise.json`` and the training meta/log into
``--results`` (``$OUT`` on the device machine). Nothing is copied into the package: that is a
reviewed step (copy ``model*.safetensors*``, ``config.json``, ``generation_config.json`` and the
tokenizer files of ``--out``, never ``train_state.pt*``).

    python -m dgemma_struct.training.gpu_run --out runs/generalise --results "$OUT" --minutes 5.5
"""
from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> dict:
    """Train, evaluate both checkpoints, write the results; returns the summary dict."""
    p = argparse.ArgumentParser(prog="python -m dgemma_struct.training.gpu_run", description=__doc__)
    p.add_argument("--out", default="runs/generalise")
    p.add_argument("--results", default="runs/generalise_results")
    p.add_argument("--minutes", type=float, default=5.5)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--corpus-size", type=int, default=60_000)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--eval-n", type=int, default=30, help="prompts per split (0: no evaluation)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=4, help="torch CPU threads (the batches are built on the CPU)")
    args = p.parse_args(argv)

    from dgemma_struct.runtime import DiffusionRuntime
    from dgemma_struct.training.eval_splits import evaluate_splits
    from dgemma_struct.training.train import train

    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    meta = train(args.out, corpus="generalise", corpus_size=args.corpus_size, minutes=args.minutes,
                 batch_size=args.batch_size, lr=args.lr, seed=args.seed, device=args.device, dtype=args.dtype,
                 threads=args.threads)
    meta["wall_minutes_with_setup"] = round((time.time() - t0) / 60, 2)
    for name in ("training_meta.json", "training_log.json"):
        shutil.copy(Path(args.out) / name, results / name)
    (results / "training_meta.json").write_text(json.dumps(meta, indent=1))
    summary: dict = {"training": meta}
    if args.eval_n:
        arms = ("constrained", "grounded")
        for label, rt in (("trained", lambda: DiffusionRuntime.from_pretrained(args.out, local_files_only=True,
                                                                               device=args.device)),
                          ("shipped", lambda: DiffusionRuntime.default(device=args.device))):
            t1 = time.time()
            summary[label] = evaluate_splits(rt(), args.eval_n, arms=arms)
            summary[label]["wall_s"] = round(time.time() - t1, 1)
            (results / "model_eval_generalise.json").write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":  # pragma: no cover
    main()
