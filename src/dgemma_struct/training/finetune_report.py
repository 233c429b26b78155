"""Markdown tables of the fine-tuning results (issue #33) for the model card: the recipe ablation
(``docs/results/training_ablation.json``) and the before/after split table
(``docs/results/training_finetune.json``), written as ``.md`` beside them so docs blocks render them.

    python -m dgemma_struct.training.finetune_report docs/results

    >>> ablation_table({"rows": [{"run": "A", "recipe": "r", "steps": 3, "minutes": 8.0,
    ...     "diffusion_constrained_field_accuracy": {"s": 0.5}, "median_forwards": {"s": 4},
    ...     "probe_losses": {"diffusion@1.0": 1.0, "ar": 2.0}}]}).splitlines()[2]
    '| A | r | 3 | 8.0 | 50.0% | 50.0% | 4 | 1.00 | 2.00 |'
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from dgemma_struct.training.generalise import EVAL_SPLITS as SPLITS


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def _columns(data: dict, names: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The checkpoints a results file compares, oldest first: its ``columns`` list, else ``shipped``,
    ``previous`` (when present) and ``tuned``; their column names: ``names``, overridden by each
    entry's own ``label``."""
    cols = data.get("columns") or (["shipped", "previous", "tuned"] if "previous" in data else ["shipped", "tuned"])
    return cols, {c: c for c in cols} | names | {c: data[c]["label"] for c in cols if "label" in data[c]}


def ablation_table(data: dict) -> str:
    """One row per run: recipe, steps, minutes, diffusion constrained field accuracy (mean and per
    split), median forwards, probe losses; when every row has it, AR constrained field accuracy too."""
    with_ar = all("ar_constrained_field_accuracy" in r for r in data["rows"])
    head = ["run", "recipe", "steps", "minutes", "diffusion constrained (mean)", "in-dist / fam / phr"]
    head += ["AR constrained (mean)", "in-dist / fam / phr"] if with_ar else []
    head += ["median fwd", "diff. loss t=1", "AR loss"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "--:|" * (len(head) - 2)]
    for r in data["rows"]:
        cells = [r["run"], r["recipe"], str(r["steps"]), str(r["minutes"])]
        for key in ("diffusion_constrained_field_accuracy",) + (("ar_constrained_field_accuracy",) if with_ar else ()):
            acc = r[key]
            cells += [_pct(sum(acc.values()) / len(acc)), " / ".join(_pct(acc[s]) for s in acc)]
        fwd = sorted(r["median_forwards"].values())[len(r["median_forwards"]) // 2]
        cells += [str(fwd), f"{r['probe_losses']['diffusion@1.0']:.2f}", f"{r['probe_losses']['ar']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def splits_table(data: dict) -> str:
    """Shipped vs fine-tuned field accuracy per split, mode and arm (exact records in brackets); with a
    ``previous`` entry (an earlier fine-tune that shipped) also its column, between the two.

    >>> arm = {"field_accuracy": 0.5, "exact_records": 0.1, "median_forwards": 3}
    >>> one = {"splits": {s: {"ar": {"constrained": arm}} for s in SPLITS}}
    >>> splits_table({"shipped": one, "previous": one, "tuned": one}).splitlines()[2]
    '| in_distribution | ar | constrained | 50.0% (10.0%) | 50.0% (10.0%) | 50.0% (10.0%) | 3 → 3 |'
    """
    cols, names = _columns(data, {"shipped": "before fine-tuning" if "previous" in data else "shipped",
                                  "previous": "previous fine-tune", "tuned": "fine-tuned"})
    span = f"{names[cols[0]]} → {names[cols[-1]]}"
    lines = ["| split | mode | arm | " + " | ".join(names[c] for c in cols) + f" | median fwd ({span}) |",
             "|---|---|---|" + "--:|" * len(cols) + "--:|"]
    after = data[cols[-1]]["splits"]
    for s in SPLITS:
        for mode in after[s]:
            for arm in after[s][mode]:
                got = [data[c]["splits"][s][mode][arm] for c in cols]
                lines.append(f"| {s} | {mode} | {arm} | "
                             + " | ".join(f"{_pct(g['field_accuracy'])} ({_pct(g['exact_records'])})" for g in got)
                             + f" | {got[0]['median_forwards']} → {got[-1]['median_forwards']} |")
    return "\n".join(lines)


HELD_OUT_KEYS = ("field_accuracy", "valid_json_rate", "schema_valid_rate", "short_answer_exact", "tool_calls_parsed",
                 "tool_names_exact", "tool_argument_accuracy", "thought_block_well_formed",
                 "thinking_json_field_accuracy", "mean_tokens_per_forward")
ALLOWED_DROP = 0.03   # issue #33: no held-out metric more than 3 pp below the shipped model's


def held_out_table(data: dict) -> str:
    """The original held-out set (unconstrained), shipped vs fine-tuned, both modes, every metric, with
    whether each stays within :data:`ALLOWED_DROP` of the shipped model (TPF: at least 10).

    >>> row = {"diffusion": dict.fromkeys(HELD_OUT_KEYS, 0.5), "ar": dict.fromkeys(HELD_OUT_KEYS, 0.9)}
    >>> worse = {"diffusion": {**row["diffusion"], "field_accuracy": 0.4}, "ar": row["ar"]}
    >>> held_out_table({"shipped": {"held_out": row}, "tuned": {"held_out": worse}}).splitlines()[2]
    '| field_accuracy | 50.0% | 40.0% | 90.0% | 90.0% | **no** |'
    """
    cols, names = _columns(data, {c: c for c in ("shipped", "previous", "tuned")})
    head = [f"{m} {names[c]}" for m in ("diffusion", "AR") for c in cols]
    lines = ["| metric | " + " | ".join(head) + " | within 3 pp |", "|---|" + "--:|" * len(head) + "---|"]
    b, a = data[cols[0]]["held_out"], data[cols[-1]]["held_out"]
    for k in HELD_OUT_KEYS:
        if k == "mean_tokens_per_forward":
            fmt, ok = (lambda x: f"{x:.2f}"), a["diffusion"][k] >= 10
        else:
            fmt = _pct
            ok = all(a[m][k] >= b[m][k] - ALLOWED_DROP - 1e-9 for m in ("diffusion", "ar"))
        cells = [fmt(data[c]["held_out"][m][k]) for m in ("diffusion", "ar") for c in cols]
        lines.append(f"| {k} | " + " | ".join(cells) + f" | {'yes' if ok else '**no**'} |")
    return "\n".join(lines)


def unseen_names_table(data: dict) -> str:
    """Exact answers on short answers about people with invented names (phone, email, date), per
    checkpoint and mode, per family, with whether the last checkpoint stays within
    :data:`ALLOWED_DROP` of the first.

    >>> one = {"unseen_names": {"n": 2, "families": ["phone"], "ar": {"exact": 0.5, "per_family": {"phone": 0.5}}}}
    >>> unseen_names_table({"columns": ["a", "b"], "a": one, "b": one}).splitlines()[2]
    '| ar | all | 50.0% | 50.0% | yes |'
    """
    cols, names = _columns(data, {})
    first, last = data[cols[0]]["unseen_names"], data[cols[-1]]["unseen_names"]
    lines = ["| mode | family | " + " | ".join(names[c] for c in cols) + " | within 3 pp |",
             "|---|---|" + "--:|" * len(cols) + "---|"]
    for mode in ("diffusion", "ar"):
        if mode not in last:
            continue
        for fam in ["all"] + last["families"]:
            get = (lambda r: r[mode]["exact"]) if fam == "all" else (lambda r: r[mode]["per_family"][fam])
            ok = get(last) >= get(first) - ALLOWED_DROP - 1e-9
            lines.append(f"| {mode} | {fam} | " + " | ".join(_pct(get(data[c]["unseen_names"])) for c in cols)
                         + f" | {'yes' if ok else '**no**'} |")
    return "\n".join(lines)


def frontier_first_table(data: dict) -> str:
    """Diffusion constrained field accuracy per split with the shipped settings and with
    frontier-first settings (``frontier_first``: entropy bound 0, so only the frontier commits each
    step; no early stop; greedy), for each checkpoint measured both ways, with median forwards.

    >>> arm = lambda a, f: {"diffusion": {"constrained": {"field_accuracy": a, "median_forwards": f}}}  # noqa: E731
    >>> one = {"splits": {s: arm(0.2, 20) for s in SPLITS}, "frontier_first": {"splits": {s: arm(0.4, 40) for s in SPLITS}}}
    >>> frontier_first_table({"columns": ["x"], "x": one}).splitlines()[2]
    '| x | 20.0% → 40.0% | 20 → 40 | 20.0% → 40.0% | 20 → 40 | 20.0% → 40.0% | 20 → 40 |'
    """
    cols, names = _columns(data, {})
    head = [h for s in SPLITS for h in (f"{s}: shipped settings → frontier-first", "median fwd")]
    lines = ["| checkpoint | " + " | ".join(head) + " |", "|---|" + "--:|" * len(head)]
    for c in cols:
        if "frontier_first" not in data[c]:
            continue
        cells = []
        for s in SPLITS:
            a = data[c]["splits"][s]["diffusion"]["constrained"]
            b = data[c]["frontier_first"]["splits"][s]["diffusion"]["constrained"]
            cells += [f"{_pct(a['field_accuracy'])} → {_pct(b['field_accuracy'])}",
                      f"{a['median_forwards']} → {b['median_forwards']}"]
        lines.append(f"| {names[c]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write(results_dir: str | Path) -> list[Path]:
    """Writes ``training_ablation.md`` (and ``training_ablation_long.md``, the same table for the long
    runs) and ``training_finetune.md`` (splits, held-out set, then unseen names when every checkpoint
    has them and frontier-first settings when any has them) for the JSON files present."""
    d, out = Path(results_dir), []
    for name in ("training_ablation", "training_ablation_long"):
        if (d / f"{name}.json").exists():
            p = d / f"{name}.md"
            p.write_text(ablation_table(json.loads((d / f"{name}.json").read_text())) + "\n")
            out.append(p)
    if (d / "training_finetune.json").exists():
        data = json.loads((d / "training_finetune.json").read_text())
        p = d / "training_finetune.md"
        tables = [splits_table(data), held_out_table(data)]
        cols = _columns(data, {})[0]
        if all("unseen_names" in data[c] for c in cols):
            tables.append(unseen_names_table(data))
        if any("frontier_first" in data[c] for c in cols):
            tables.append(frontier_first_table(data))
        p.write_text("\n\n".join(tables) + "\n")
        out.append(p)
    return out


if __name__ == "__main__":  # pragma: no cover
    print(write(sys.argv[1] if len(sys.argv) > 1 else "docs/results"))
