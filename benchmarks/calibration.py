"""Calibration of per-field confidence (issue #36): does ``result.confidence`` separate right fields
from wrong ones, and is it a probability?

For every leaf field of every output (embedded model, constrained, both modes): the pair
(confidence, correct?), where correct means equal to the reference value (type included, as
training/eval_splits.leaf_accuracy counts it). Two sets: the held-out JSON set of
training/evaluate.py (corpus seed ``HELD_OUT_SEED``, JSON prompts without thinking) and the
generalisation splits of training/eval_splits.py. Per set and mode: AUROC (confidence as a score
for "right"), expected calibration error (10 equal-width bins), Brier score, for each way of
combining a value's token probabilities (product — shipped —, minimum, geometric mean) and
three baselines on the same outputs: the **unrenormalised** token probabilities (the model's
distribution before the constraint's mask, recorded under ``token_logprobs.capture_raw``; no
change to the outputs) as their mean logprob (``exp`` of the mean over the value's tokens) and as
their product, and a constant (the accuracy of the fitting set). A token the grammar forced is
written without logits and has no unrenormalised probability: the baselines use the value's other
tokens (a value made only of forced tokens scores 1). A power calibration ``p ** (1 / T)`` (the
temperature of the value's log-probability) is fitted on the splits and evaluated on the held-out set.

Run (small, one torch thread)::

    OMP_NUM_THREADS=1 python benchmarks/calibration.py --n 30 --held-out 60
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from batch_scaling import held_out, write_results  # noqa: E402

from dgemma_struct.errors import DgemmaStructError  # noqa: E402
from dgemma_struct.repair.field_confidence import COMBINE, field_token_logprobs, pointer  # noqa: E402

BINS = 10


def leaves(value: Any, path: tuple = ()) -> dict[str, Any]:
    """``pointer -> leaf`` of a JSON value (scalars and empty containers), as leaf_spans names them."""
    if isinstance(value, dict) and value:
        return {k: v for key, sub in value.items() for k, v in leaves(sub, path + (key,)).items()}
    if isinstance(value, list) and value:
        return {k: v for i, sub in enumerate(value) for k, v in leaves(sub, path + (i,)).items()}
    return {pointer(path): value}


def same(a: Any, b: Any) -> bool:
    return a == b and type(a) is type(b)


def field_pairs(runtime: Any, examples: list[dict], mode: str, batch_size: int, max_new_tokens: int) -> list[dict]:
    """One record per output leaf: its token logprobs (renormalised, and before the mask: ``raw``,
    ``None`` for a forced token) and whether it equals the reference."""
    from dgemma_struct.api import generate_batch
    from dgemma_struct.engine.token_logprobs import capture_raw

    out: list[dict] = []
    tok = runtime.tokenizer
    for i in range(0, len(examples), batch_size):
        chunk = examples[i:i + batch_size]
        with capture_raw():
            res = generate_batch([e["prompt"] for e in chunk], [e["schema"] for e in chunk], runtime=runtime,
                                 max_new_tokens=max_new_tokens, return_exceptions=True, mode=mode,
                                 seed=list(range(i, i + len(chunk))), confidence=True, logprobs=0)
        for e, r in zip(chunk, res):
            if isinstance(r, DgemmaStructError):
                continue
            want = leaves(e["fields"])
            got = leaves(json.loads(r.text))
            pieces = [tok.decode([t], skip_special_tokens=False) for t in r.token_ids]
            full = "".join(pieces)
            skip = len(full) - len(r.text)
            lps = field_token_logprobs(r.text, pieces, [x.logprob for x in r.logprobs], json_output=True, skip=skip)
            raw = field_token_logprobs(r.text, pieces, [getattr(x, "raw_logprob", None) for x in r.logprobs],
                                       json_output=True, skip=skip)
            for ptr, v in got.items():
                out.append({"pointer": ptr, "logprobs": lps.get(ptr, []), "correct": ptr in want and same(v, want[ptr]),
                            "raw": [x for x in raw.get(ptr, []) if x is not None], "confidence": r.confidence.get(ptr)})
    return out


def auroc(scores: np.ndarray, labels: np.ndarray) -> float | None:
    """Area under the ROC curve (Mann-Whitney, ties counted half); None with one class only."""
    pos = int(labels.sum())
    neg = len(labels) - pos
    if not pos or not neg:
        return None
    order = np.argsort(scores, kind="mergesort")
    _, first, counts = np.unique(scores[order], return_index=True, return_counts=True)
    ranks = np.empty(len(scores))
    ranks[order] = np.repeat(first + (counts - 1) / 2 + 1, counts)   # average ranks over ties
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


def paired_difference(a: np.ndarray, b: np.ndarray, y: np.ndarray, resamples: int = 1000,
                      seed: int = 0) -> dict[str, Any]:
    """AUROC and ECE of scores ``a`` minus those of ``b`` on the same fields, with 95 % paired
    bootstrap intervals (fields resampled with replacement; a resample with one class only is
    skipped for AUROC)."""
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    for name, fn in (("auroc", auroc), ("ece", ece)):
        pa, pb = fn(a, y), fn(b, y)
        diffs = []
        for _ in range(resamples):
            i = rng.integers(0, len(y), len(y))
            da, db = fn(a[i], y[i]), fn(b[i], y[i])
            if da is not None and db is not None:
                diffs.append(da - db)
        out[name] = None if pa is None or pb is None else round(pa - pb, 4)
        out[name + "_ci"] = [round(float(np.percentile(diffs, q)), 4) for q in (2.5, 97.5)] if diffs else None
    return out


def ece(p: np.ndarray, y: np.ndarray, bins: int = BINS) -> float:
    """Expected calibration error over ``bins`` equal-width bins."""
    idx = np.minimum((p * bins).astype(int), bins - 1)
    return float(sum(abs(p[idx == b].mean() - y[idx == b].mean()) * (idx == b).sum()
                     for b in range(bins) if (idx == b).any()) / len(p))


def reliability(p: np.ndarray, y: np.ndarray, bins: int = BINS) -> list[dict]:
    idx = np.minimum((p * bins).astype(int), bins - 1)
    return [{"bin": b, "n": int((idx == b).sum()), "confidence": float(p[idx == b].mean()),
             "accuracy": float(y[idx == b].mean())} for b in range(bins) if (idx == b).any()]


def scores(records: list[dict], how: str, power: float = 1.0, key: str = "logprobs") -> np.ndarray:
    """``how`` (a :data:`COMBINE` name) of each record's ``key`` token logprobs, as a probability."""
    return np.array([min(1.0, max(0.0, COMBINE[how](r[key]))) ** power for r in records])


#: the unrenormalised baselines: (combination, name)
RAW_BASELINES = (("geomean", "raw_mean"), ("product", "raw_product"))


def metrics(p: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    a = auroc(p, y)
    return {"auroc": None if a is None else round(a, 4), "ece": round(ece(p, y), 4),
            "brier": round(float(((p - y) ** 2).mean()), 4)}


def fit_power(records: list[dict]) -> float:
    """The ``1 / T`` minimising the log loss of ``product ** (1 / T)`` on ``records`` (grid search)."""
    lp = np.array([sum(r["logprobs"]) for r in records])
    y = np.array([r["correct"] for r in records], dtype=float)
    best, arg = math.inf, 1.0
    for a in np.exp(np.linspace(math.log(0.05), math.log(20), 400)):
        p = np.clip(np.exp(a * lp), 1e-6, 1 - 1e-6)
        loss = -float((y * np.log(p) + (1 - y) * np.log(1 - p)).mean())
        if loss < best:
            best, arg = loss, float(a)
    return arg


def evaluate(fit: list[dict], test: list[dict]) -> dict[str, Any]:
    y = np.array([r["correct"] for r in test], dtype=bool)
    out: dict[str, Any] = {"fields": len(test), "accuracy": round(float(y.mean()), 4) if len(y) else None}
    for how in COMBINE:
        out[how] = metrics(scores(test, how), y)
    for how, name in RAW_BASELINES:
        out[name] = metrics(scores(test, how, key="raw"), y)
    out["vs_raw_mean"] = paired_difference(scores(test, "product"), scores(test, "geomean", key="raw"), y)
    out["raw_tokens"] = sum(len(r["raw"]) for r in test)
    out["tokens"] = sum(len(r["logprobs"]) for r in test)
    const = float(np.mean([r["correct"] for r in fit])) if fit else 0.5
    out["constant"] = {**metrics(np.full(len(test), const), y), "value": round(const, 4)}
    a = fit_power(fit) if fit else 1.0
    out["product_temperature"] = {**metrics(scores(test, "product", a), y), "temperature": round(1 / a, 4)}
    out["reliability_product"] = reliability(scores(test, "product"), y)
    out["reliability_raw_mean"] = reliability(scores(test, "geomean", key="raw"), y)
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2), sharey=True)
    for ax, mode in zip(axes, result["modes"]):
        ax.plot([0, 1], [0, 1], "k:", lw=1, label="perfect")
        for key, label in (("held_out", "held-out JSON set"), ("splits", "generalisation splits")):
            rel = result["modes"][mode][key]["reliability_product"]
            line, = ax.plot([b["confidence"] for b in rel], [b["accuracy"] for b in rel], "o-",
                            label=f"{label} (ECE {result['modes'][mode][key]['product']['ece']:.3f})")
            raw = result["modes"][mode][key]["reliability_raw_mean"]
            ax.plot([b["confidence"] for b in raw], [b["accuracy"] for b in raw], "x--", color=line.get_color(),
                    alpha=0.6, label=f"  raw-mean baseline (ECE {result['modes'][mode][key]['raw_mean']['ece']:.3f})")
        ax.set_title(f"{mode}: per-field confidence (product)")
        ax.set_xlabel("confidence (bin mean)")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_ylabel("share of fields right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def _cell(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def markdown(r: dict) -> str:
    lines = [f"# Per-field confidence calibration ({r['model']}, {r['device']})", "",
             f"Held-out JSON set: {r['held_out_prompts']} prompts; generalisation splits: {r['n_per_split']} "
             f"prompts per split ({', '.join(r['splits'])}); seed 0.., `max_new_tokens={r['max_new_tokens']}`; "
             f"{r['wall_s']:.0f} s. Fit set for the constant and the temperature: the splits (for the held-out "
             "rows) and the held-out set (for the splits' rows).", "",
             "Shipped confidence against the baselines, on the same outputs (raw: the model's probabilities "
             "before the constraint's mask; mean: `exp` of the mean token logprob of the value):", "",
             "| mode | set | fields | accuracy | AUROC confidence | ECE confidence | AUROC raw mean | ECE raw mean | "
             "AUROC raw product | ECE raw product | AUROC constant | ECE constant |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode, sets in r["modes"].items():
        for key in ("held_out", "splits"):
            m = sets[key]
            lines.append(f"| {mode} | {key} | {m['fields']} | {m['accuracy']} | "
                         + " | ".join(f"{_cell(m[k]['auroc'])} | {_cell(m[k]['ece'])}"
                                      for k in ("product", "raw_mean", "raw_product", "constant")) + " |")
    lines += ["", "Confidence minus the raw-mean baseline on the same fields, with 95 % paired bootstrap intervals "
              "(1,000 resamples; AUROC: higher is better, ECE: lower is better):", "",
              "| mode | set | AUROC difference | 95 % interval | ECE difference | 95 % interval |", "|---|---|---|---|---|---|"]
    for mode, sets in r["modes"].items():
        for key in ("held_out", "splits"):
            d = sets[key]["vs_raw_mean"]
            ci = {k: "–" if d[k + "_ci"] is None else f"[{d[k + '_ci'][0]:+.3f}, {d[k + '_ci'][1]:+.3f}]"
                  for k in ("auroc", "ece")}
            lines.append(f"| {mode} | {key} | {'–' if d['auroc'] is None else format(d['auroc'], '+.3f')} | "
                         f"{ci['auroc']} | {d['ece']:+.3f} | {ci['ece']} |")
    lines += ["", "Ways of combining the renormalised token probabilities, and a fitted temperature:", "",
              "| mode | set | AUROC product | ECE product | AUROC min | ECE min | AUROC geomean | ECE geomean | "
              "T fitted | ECE product^(1/T) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for mode, sets in r["modes"].items():
        for key in ("held_out", "splits"):
            m = sets[key]
            lines.append(f"| {mode} | {key} | " + " | ".join(f"{_cell(m[k]['auroc'])} | {_cell(m[k]['ece'])}"
                                                             for k in ("product", "min", "geomean"))
                         + f" | {m['product_temperature']['temperature']} | {_cell(m['product_temperature']['ece'])} |")
    lines += ["", "Targets (held-out JSON set): AUROC >= 0.80 and ECE <= 0.10, and better than the unrenormalised "
              "baseline on both. ECE: 10 equal-width bins; AUROC of a constant is 0.5 by construction.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=30, help="prompts per generalisation split")
    ap.add_argument("--held-out", type=int, default=60, help="held-out JSON prompts")
    ap.add_argument("--modes", nargs="+", default=["diffusion", "ar"])
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--model", default=None, help="local checkpoint directory (default: the embedded model)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "calibration"))
    ap.add_argument("--plot", default=str(ROOT / "docs" / "img" / "calibration.png"))
    args = ap.parse_args()

    from dgemma_struct.cli.arguments import load_runtime
    from dgemma_struct.training.eval_splits import eval_examples

    rt = load_runtime(args.model, "auto", "auto")   # a local directory only, never the hub
    heldout = [e for e in held_out(args.held_out * 3) if e["kind"] == "json" and not e.get("thinking")][:args.held_out]
    splits = eval_examples(args.n)
    t0 = time.perf_counter()
    result: dict[str, Any] = {"model": "embedded", "device": str(rt.model.device), "held_out_prompts": len(heldout),
                              "n_per_split": args.n, "splits": list(splits), "max_new_tokens": args.max_new_tokens,
                              "modes": {}}
    for mode in args.modes:
        ho = field_pairs(rt, heldout, mode, args.batch_size, args.max_new_tokens)
        sp = [x for ex in splits.values() for x in field_pairs(rt, ex, mode, args.batch_size, args.max_new_tokens)]
        result["modes"][mode] = {"held_out": evaluate(sp, ho), "splits": evaluate(ho, sp)}
        print(mode, json.dumps({k: {m: v[m] for m in ("accuracy", "product", "raw_mean", "raw_product", "constant")}
                                for k, v in result["modes"][mode].items()}), flush=True)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    write_results(result, args.out, markdown)
    plot(result, Path(args.plot))


if __name__ == "__main__":
    main()
