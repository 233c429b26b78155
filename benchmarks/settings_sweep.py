"""Denoising-settings sweep for a checkpoint: the evidence behind its generation config.

The entropy-bound sampler and the stopping rule decide how many positions each forward pass
accepts (TPF) and how clean the canvas is when it stops (valid-JSON rate). This script evaluates a
small grid of settings on the same held-out prompts, unconstrained, in one run, and writes a table
to ``docs/results/settings_sweep.{json,md}``. The chosen row goes into
``dgemma_struct.training.train.default_generation_config``.

    OMP_NUM_THREADS=1 python benchmarks/settings_sweep.py --model runs/embedded --n 48

``--splits N``: the constrained side instead. Diffusion, constrained, on ``evaluate_splits(n=N)``
(in-distribution, held-out families, held-out phrasings) under the checkpoint's settings with one
knob changed at a time toward frontier-first decoding (entropy bound 0: only the frontier commits
each step under the guide's progress rule; confidence threshold 0: a canvas is not stopped early;
greedy): which part of frontier-first buys the accuracy, and for how many forwards. Writes
``docs/results/settings_sweep_splits.{json,md}``. The last row is the checkpoint as it loads, its
``dgemma_struct.json`` applied (the embedded one: frontier-first on guided rows, chosen from this
table: ``guided_entropy_bound`` 0, ``guided_confidence_threshold`` 0, ``guided_greedy``).

    OMP_NUM_THREADS=1 python benchmarks/settings_sweep.py --splits 30      # ≈ 10 min
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from dgemma_struct.runtime import DiffusionRuntime
from dgemma_struct.engine.sampler import DiffusionSettings
from dgemma_struct.training.eval_splits import evaluate_splits
from dgemma_struct.training.evaluate import evaluate

ROOT = Path(__file__).resolve().parents[1]

GRID = [  # (entropy_bound, t_min, t_max, stability_threshold, confidence_threshold, max_denoising_steps)
    (0.5, 0.3, 0.8, 1, 0.05, 32),
    (1.0, 0.3, 0.8, 0, 0.4, 32),
    (1.0, 0.3, 0.8, 0, 0.3, 32),
    (2.0, 0.3, 0.8, 0, 0.3, 32),
    (1.0, 0.2, 0.6, 0, 0.3, 32),
]

#: (name, changes to the generation config's settings, temperature) toward frontier-first, one knob at
#: a time; ``None``: the settings the checkpoint loads with (its ``dgemma_struct.json`` applied)
SPLITS_GRID = [
    ("generation config", {}, None),
    ("greedy", {}, 0.0),
    ("entropy bound 0.3", {"entropy_bound": 0.3}, None),
    ("entropy bound 0.3, greedy", {"entropy_bound": 0.3}, 0.0),
    ("entropy bound 0.1, greedy", {"entropy_bound": 0.1}, 0.0),
    ("entropy bound 0.03, greedy", {"entropy_bound": 0.03}, 0.0),
    ("entropy bound 0, greedy", {"entropy_bound": 0.0}, 0.0),
    ("entropy bound 0, confidence 0", {"entropy_bound": 0.0, "confidence_threshold": 0.0}, None),
    ("frontier-first: entropy bound 0, confidence 0, greedy", {"entropy_bound": 0.0, "confidence_threshold": 0.0}, 0.0),
    ("as loaded (generation config + dgemma_struct.json)", None, None),
]
SPLIT_KEYS = ("field_accuracy", "exact_records", "median_forwards", "mean_forwards")


def splits_sweep(rt: DiffusionRuntime, n: int, model: str, out: Path) -> None:
    """Diffusion constrained split accuracy under :data:`SPLITS_GRID`; writes ``out.{json,md}``."""
    rows = []
    base = dataclasses.replace(rt.settings, guided_entropy_bound=None, guided_confidence_threshold=None,
                               guided_greedy=False)
    for name, change, temperature in SPLITS_GRID:
        t0 = time.perf_counter()
        settings = rt.settings if change is None else dataclasses.replace(base, **change)
        rep = evaluate_splits(rt, n, modes=("diffusion",), arms=("constrained",), settings=settings,
                              temperature=temperature)
        row = {"name": name, "settings": rep["settings"], "temperature": temperature,
               "seconds": round(time.perf_counter() - t0, 1),
               "splits": {s: {k: pm["diffusion"]["constrained"][k] for k in SPLIT_KEYS}
                          for s, pm in rep["splits"].items()}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"model": model, "n_per_split": n, "rows": rows}, indent=1))
    out.with_suffix(".md").write_text(splits_table({"model": model, "n_per_split": n, "rows": rows}) + "\n")
    print(f"wrote {out}.json and {out}.md")


def splits_table(data: dict) -> str:
    """The markdown of :func:`splits_sweep`'s results.

    >>> cell = {"field_accuracy": 0.25, "exact_records": 0.0, "median_forwards": 20, "mean_forwards": 22.5}
    >>> row = {"name": "x", "settings": {"entropy_bound": 1.0, "confidence_threshold": 0.3}, "temperature": None,
    ...        "splits": {"in_distribution": cell, "held_out_families": cell, "held_out_phrasings": cell}}
    >>> splits_table({"model": "m", "n_per_split": 30, "rows": [row]}).splitlines()[-1]
    '| x | 1 | 0.3 | schedule | 25.0% / 20 | 25.0% / 20 | 25.0% / 20 | 0.0% |'
    """
    head = ["# Decoding settings on the constrained splits (diffusion)", "",
            f"Model: `{data['model']}`; `evaluate_splits(n={data['n_per_split']})`, diffusion, constrained, the same "
            "prompts and seeds in every row, one thread. A cell: field accuracy / median forwards. Entropy "
            "bound, confidence threshold and temperature: the generation config's (or the row's change), then in "
            "brackets those of the rows a constraint guide commits (`guided_entropy_bound`, "
            "`guided_confidence_threshold`, `guided_greedy`) when they differ.", "",
            "| settings | entropy bound | confidence | temperature | in_distribution | held_out_families | "
            "held_out_phrasings | exact records (all splits) |", "|---|--:|--:|---|--:|--:|--:|--:|"]
    for r in data["rows"]:
        sp, st = r["splits"], r["settings"]
        cells = [f"{sp[s]['field_accuracy']:.1%} / {sp[s]['median_forwards']:g}"
                 for s in ("in_distribution", "held_out_families", "held_out_phrasings")]
        exact = sum(sp[s]["exact_records"] for s in sp) / len(sp)
        temp = "schedule" if r["temperature"] is None else f"{r['temperature']:g} (greedy)"
        if st.get("guided_greedy") and r["temperature"] is None:
            temp += " (guided greedy)"
        bound, conf = f"{st['entropy_bound']:g}", f"{st['confidence_threshold']:g}"
        if st.get("guided_entropy_bound") is not None and st["guided_entropy_bound"] != st["entropy_bound"]:
            bound += f" (guided {st['guided_entropy_bound']:g})"
        g = st.get("guided_confidence_threshold")
        if g is not None and g != st["confidence_threshold"]:
            conf += f" (guided {g:g})"
        head.append(f"| {r['name']} | {bound} | {conf} | {temp} | "
                    + " | ".join(cells) + f" | {exact:.1%} |")
    return "\n".join(head)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="checkpoint dir (default: the embedded model)")
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--out", default=None, help="results path without suffix (default docs/results/settings_sweep"
                                                "[_splits])")
    ap.add_argument("--splits", type=int, default=0, metavar="N",
                    help="sweep decoding settings on the constrained splits, N prompts per split, instead")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rt = DiffusionRuntime.from_pretrained(args.model) if args.model else DiffusionRuntime.default()
    if args.splits:
        out = Path(args.out or ROOT / "docs" / "results" / "settings_sweep_splits")
        return splits_sweep(rt, args.splits, args.model or "embedded", out)
    args.out = args.out or str(ROOT / "docs" / "results" / "settings_sweep")
    rows = []
    for eb, tmin, tmax, stab, conf, steps in GRID:
        s = DiffusionSettings(max_denoising_steps=steps, entropy_bound=eb, t_min=tmin, t_max=tmax,
                              stability_threshold=stab, confidence_threshold=conf)
        t0 = time.perf_counter()
        rep = evaluate(rt, n=args.n, settings=s)["diffusion"]
        row = {"settings": dataclasses.asdict(s), "seconds": round(time.perf_counter() - t0, 1),
               **{k: rep[k] for k in ("valid_json_rate", "schema_valid_rate", "field_accuracy",
                                      "short_answer_exact", "mean_tokens_per_forward", "mean_forward_passes")}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"model": args.model or "embedded", "n": args.n, "rows": rows},
                                                   indent=1))
    L = ["# Denoising-settings sweep (unconstrained diffusion, held-out prompts)", "",
         f"Model: `{args.model or 'embedded'}`; {args.n} held-out prompts (seed of the eval split), "
         "the same prompts and seeds for every row, one thread.", "",
         "| entropy bound | t_min–t_max | stability | confidence | steps | valid JSON | schema-valid | field acc | "
         "short exact | TPF | passes |", "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        s = r["settings"]
        L.append(f"| {s['entropy_bound']} | {s['t_min']}–{s['t_max']} | {s['stability_threshold']} | "
                 f"{s['confidence_threshold']} | {s['max_denoising_steps']} | {r['valid_json_rate']:.1%} | "
                 f"{r['schema_valid_rate']:.1%} | {r['field_accuracy']:.1%} | {r['short_answer_exact']:.1%} | "
                 f"{r['mean_tokens_per_forward']:.2f} | {r['mean_forward_passes']:.1f} |")
    out.with_suffix(".md").write_text("\n".join(L) + "\n")
    print(f"wrote {out}.json and {out}.md")


if __name__ == "__main__":
    main()
