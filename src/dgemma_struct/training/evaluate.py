"""Held-out evaluation of a checkpoint (the model card's table) and the loss-curve plot.

Unconstrained, on purpose: it measures what the model does by itself, which the constraint layer
then lifts to 100% validity.

Run::

    dgemma-struct eval --model src/dgemma_struct/embedded --n 200
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import jsonschema

from dgemma_struct.runtime import DiffusionRuntime
from dgemma_struct.sampler import DiffusionSettings
from dgemma_struct.training.corpus import make_corpus

HELD_OUT_SEED = 12345  # training used seed 0; the eval split is a different draw


def field_accuracy(value: Any, fields: dict) -> float:
    if not isinstance(value, dict) or not fields:
        return 0.0
    return sum(value.get(k) == v for k, v in fields.items()) / len(fields)


def evaluate(runtime: DiffusionRuntime, n: int = 200, *, seed: int = HELD_OUT_SEED, batch_size: int = 16,
             settings: DiffusionSettings | None = None, max_new_tokens: int = 96) -> dict:
    """Valid-JSON rate, schema-valid rate, field accuracy and TPF per mode on ``n`` held-out
    JSON prompts (plus exact-match on short answers)."""
    examples = make_corpus(n, seed=seed)
    report: dict[str, Any] = {"n": n, "seed": seed}
    for mode in ("diffusion", "ar"):
        rows = []
        for i in range(0, n, batch_size):
            chunk = examples[i:i + batch_size]
            results = runtime.generate_batch([e["prompt"] for e in chunk], max_new_tokens=max_new_tokens, seed=i,
                                             mode=mode, settings=settings)
            rows.extend(zip(chunk, results))
        json_rows = [(e, r) for e, r in rows if e["kind"] == "json"]
        valid = schema_valid = 0
        acc = []
        for e, r in json_rows:
            try:
                v = json.loads(r.text)
                valid += 1
            except ValueError:
                acc.append(0.0)
                continue
            try:
                jsonschema.validate(v, e["schema"])
                schema_valid += 1
            except jsonschema.ValidationError:
                pass
            acc.append(field_accuracy(v, e["fields"]))
        short = [(e, r) for e, r in rows if e["kind"] == "short"]
        report[mode] = {
            "json_prompts": len(json_rows),
            "valid_json_rate": valid / max(1, len(json_rows)),
            "schema_valid_rate": schema_valid / max(1, len(json_rows)),
            "field_accuracy": statistics.mean(acc) if acc else 0.0,
            "short_answer_exact": sum(r.text == e["answer"] for e, r in short) / max(1, len(short)),
            "mean_tokens_per_forward": statistics.mean(r.stats.tokens_per_forward for _, r in rows),
            "mean_forward_passes": statistics.mean(r.stats.forward_passes for _, r in rows),
            "samples": [{"prompt": e["prompt"], "expected": e["answer"], "got": r.text} for e, r in json_rows[:3]],
        }
    return report


def plot_loss(log_path: Path, out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    log = json.loads(Path(log_path).read_text())
    steps = [r["step"] for r in log]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=110)
    ax.plot(steps, [r["diffusion_loss"] for r in log], label="diffusion (canvas denoising)")
    ax.plot(steps, [r["ar_loss"] for r in log], label="AR (encoder next token)")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.set_yscale("log")
    ax.set_title("Embedded DiffusionGemma training loss")
    ax.legend()
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png)
