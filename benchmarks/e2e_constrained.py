"""End-to-end benchmark: constrained vs unconstrained generation, diffusion vs AR, same prompts.

One run over a held-out set of the synthetic task families the embedded model was trained on
(``dgemma_struct.training.corpus``; the model saw ``make_corpus(..., seed=0)``, this benchmark uses
``--seed 12345`` and drops any prompt that also occurs in the training corpus).

Arms, on the same prompts and the same per-request seeds:

* ``diffusion``      unconstrained block diffusion      (``runtime.generate(mode="diffusion")``)
* ``diffusion+c``    constrained block diffusion        (``generate(prompt, schema)``)
* ``ar+c``           constrained AR on the same weights (``generate(..., mode="ar")``)
* ``ar``             unconstrained AR                   (``runtime.generate(mode="ar")``)

Reported: validity (``json.loads`` + ``jsonschema`` against the family schema, format checker on),
field accuracy, tokens per forward (TPF), wall time per request, repairs / fallback rates, the mask
share of wall time, forced tokens, and "structural junk" inside string values. Short-answer tasks
(regex / choice / grammar families) report validity and exact match. An ablation over the
``ConstraintGuide`` knobs (progress rule, forced tokens, renoise_invalid; ``GenerateOptions`` fields, so every
row runs the shipped path) runs on a smaller N.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/e2e_constrained.py                # embedded model, N=60
    OMP_NUM_THREADS=1 python benchmarks/e2e_constrained.py --tiny --n 8 --n-short 8 --ablation-n 4 \\
        --out /tmp/e2e_tiny                                               # random tiny model (dev)

Outputs ``<out>.json``, ``<out>.md`` and (unless ``--no-plots``) ``docs/img/e2e_validity.png``,
``docs/img/e2e_tpf_wall.png``.
"""
from __future__ import annotations

import argparse
import itertools
import json
import platform
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import jsonschema  # noqa: E402
import torch  # noqa: E402

from dgemma_struct import api  # noqa: E402
from dgemma_struct.constraints import Choice, Grammar, Regex  # noqa: E402
from dgemma_struct.errors import DgemmaStructError  # noqa: E402
from dgemma_struct.options import GenerateOptions  # noqa: E402
from dgemma_struct.runtime import DiffusionRuntime  # noqa: E402
from dgemma_struct.training.corpus import JSON_FAMILIES, make_corpus  # noqa: E402

ARMS = ["diffusion", "diffusion+c", "ar+c", "ar"]
ARM_LABEL = {"diffusion": "unconstrained diffusion", "diffusion+c": "constrained diffusion",
             "ar+c": "constrained AR", "ar": "unconstrained AR"}
JUNK_CHARS = set('{}[]":')


# ----------------------------------------------------------------------------------------- runtime
def tiny_runtime() -> DiffusionRuntime:
    """A random-weight runtime (for developing this script without the embedded model)."""
    from dgemma_struct.testing import tiny_runtime as build

    return build(max_denoising_steps=8, corpus_size=300)


# ----------------------------------------------------------------------------------------- data
def held_out(n_json: int, n_short: int, seed: int, train_seed: int, train_size: int) -> tuple[list, list, dict]:
    """Family-balanced JSON and short-answer examples from ``make_corpus(seed)``, minus any prompt
    that occurs in the training corpus ``make_corpus(train_size, train_seed)``."""
    train_prompts = {e["prompt"] for e in make_corpus(train_size, seed=train_seed)}
    pool = make_corpus(max(4000, 40 * (n_json + n_short)), seed=seed)
    by_fam: dict[str, list] = {}
    overlap = {"json": 0, "short": 0}
    for e in pool:
        if e["prompt"] in train_prompts:
            overlap[e["kind"]] = overlap.get(e["kind"], 0) + 1   # also tool and thinking examples
            if e["kind"] == "json":
                continue  # JSON prompts must be unseen; short ones (few distinct sentences) are kept
        by_fam.setdefault((e["kind"], e["family"]), []).append(e)

    def take(kind: str, n: int) -> list:
        fams = sorted(f for k, f in by_fam if k == kind)
        out, i = [], 0
        while len(out) < n and fams:
            fam = fams[i % len(fams)]
            items = by_fam[(kind, fam)]
            j = i // len(fams)
            if j < len(items):
                out.append(items[j])
            i += 1
            if i > 100 * n:
                break
        return out

    info = {"pool": len(pool), "train_corpus": f"make_corpus({train_size}, seed={train_seed})",
            "pool_prompts_seen_in_training": overlap}
    return take("json", n_json), take("short", n_short), info


def short_spec(spec: dict) -> Any:
    if "regex" in spec:
        return Regex(spec["regex"])
    if "choice" in spec:
        return Choice(spec["choice"])
    if "grammar" in spec:
        return Grammar(spec["grammar"])
    raise ValueError(spec)


# ----------------------------------------------------------------------------------------- scoring
def validator_for(schema: dict):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def json_valid(text: str, schema: dict) -> tuple[bool, Any, str]:
    """-> (valid, parsed value or None, reason)."""
    try:
        value = json.loads(text)
    except ValueError:
        return False, None, "not JSON"
    errs = list(validator_for(schema).iter_errors(value))
    if errs:
        return False, value, "schema: " + errs[0].message[:80]
    return True, value, ""


def field_accuracy(value: Any, fields: dict) -> float:
    if not fields:
        return 1.0
    if not isinstance(value, dict):
        return 0.0
    return sum(1 for k, v in fields.items() if k in value and value[k] == v) / len(fields)


def schema_keys(schema: Any) -> set[str]:
    out: set[str] = set()
    if isinstance(schema, dict):
        for k, v in (schema.get("properties") or {}).items():
            out.add(k)
            out |= schema_keys(v)
        if isinstance(schema.get("items"), dict):
            out |= schema_keys(schema["items"])
    return out


def junk_strings(value: Any, keys: set[str], own: str | None = None) -> list[str]:
    """String values holding JSON punctuation ``{}[]":``, non-printable characters, or (as a
    substring, case-sensitive) the name of another key of the same schema."""
    bad: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            bad += junk_strings(v, keys, k)
    elif isinstance(value, list):
        for v in value:
            bad += junk_strings(v, keys, own)
    elif isinstance(value, str):
        if (set(value) & JUNK_CHARS or any(not ch.isprintable() for ch in value)
                or any(k in value for k in keys if k != own and k not in (own or ""))):
            bad.append(value)
    return bad


# ----------------------------------------------------------------------------------------- running
def run_unconstrained(rt, prompt: str, mode: str, max_new: int, seed: int) -> dict:
    t0 = time.perf_counter()
    res = rt.generate(prompt, max_new_tokens=max_new, seed=seed, mode=mode)
    wall = time.perf_counter() - t0
    s = res.stats
    stopped = s.finish_reason == "stop"
    useful = len(res.token_ids) + (1 if stopped else 0)
    return {"text": res.text, "error": None, "wall": wall, "forward_passes": s.forward_passes,
            "tokens": len(res.token_ids), "stopped": stopped,
            "tpf": useful / s.forward_passes if s.forward_passes else 0.0, "tpf_reported": s.tokens_per_forward,
            "mask_s": 0.0, "model_s": s.model_s, "forced": 0, "repairs": 0, "fallback": False}


def run_constrained(rt, prompt: str, spec: Any, mode: str, max_new: int, seed: int, timeout: float | None,
                    knobs: dict | None = None) -> dict:
    t0 = time.perf_counter()
    try:
        # knob rows go through GenerateOptions: the shipped path (budget, closing, repairs), one knob changed
        opts = GenerateOptions(max_new_tokens=max_new, seed=seed, mode=mode, timeout_s=timeout, return_details=True,
                               **(knobs or {}))
        res = api.generate(prompt, spec, runtime=rt, options=opts)
    except Exception as err:  # noqa: BLE001 - typed errors are expected; an untyped one is a bug, recorded
        wall = time.perf_counter() - t0
        st = getattr(err, "stats", None)
        name = type(err).__name__ if isinstance(err, DgemmaStructError) else f"UNTYPED {type(err).__name__}"
        return {"text": getattr(err, "partial_text", ""), "error": name, "error_msg": str(err)[:200],
                "wall": wall, "forward_passes": getattr(st, "forward_passes", 0), "tokens": 0, "stopped": False,
                "tpf": 0.0, "tpf_reported": 0.0, "mask_s": getattr(st, "mask_s", 0.0),
                "model_s": getattr(st, "model_s", 0.0), "forced": getattr(st, "forced_tokens", 0),
                "repairs": getattr(st, "repairs", 0), "fallback": bool(getattr(st, "fallback", False)),
                "junk_repairs": getattr(st, "junk_repairs", 0)}
    wall = time.perf_counter() - t0
    s = res.stats
    useful = len(res.token_ids) + 1
    return {"text": res.text, "error": None, "wall": wall, "forward_passes": s.forward_passes,
            "tokens": len(res.token_ids), "stopped": True,
            "tpf": useful / s.forward_passes if s.forward_passes else 0.0, "tpf_reported": s.tokens_per_forward,
            "mask_s": s.mask_s, "model_s": s.model_s, "forced": s.forced_tokens, "repairs": s.repairs,
            "fallback": s.fallback, "sdk_wall": s.wall_s, "junk_repairs": getattr(s, "junk_repairs", 0)}


def mean(xs) -> float:
    xs = list(xs)
    return statistics.fmean(xs) if xs else float("nan")


def median(xs) -> float:
    xs = list(xs)
    return statistics.median(xs) if xs else float("nan")


def summarise_json(rows: list[dict], arm: str) -> dict:
    rs = [r[arm] for r in rows]
    n = len(rs)
    valid = [r for r in rs if r["valid"]]
    parsed = [r for r in rs if r["parsed"]]
    out = {
        "n": n, "valid": len(valid), "validity": len(valid) / n if n else 0.0,
        "returned": sum(1 for r in rs if not r["error"]),
        "returned_valid": sum(1 for r in rs if not r["error"] and r["valid"]),
        "typed_errors": {}, "field_accuracy": mean(r["field_acc"] for r in rs),
        "field_accuracy_valid_only": mean(r["field_acc"] for r in valid),
        "exact_match": mean(1.0 if r["field_acc"] == 1.0 and r["valid"] else 0.0 for r in rs),
        "tpf": mean(r["tpf"] for r in rs if r["forward_passes"]),
        "tpf_reported": mean(r["tpf_reported"] for r in rs if r["forward_passes"]),
        "forward_passes": mean(r["forward_passes"] for r in rs),
        "wall_s_mean": mean(r["wall"] for r in rs), "wall_s_median": median(r["wall"] for r in rs),
        "stopped": sum(r["stopped"] for r in rs),
        "junk_outputs": sum(1 for r in parsed if r["junk"]), "junk_checked": len(parsed),
    }
    for r in rs:
        if r["error"]:
            out["typed_errors"][r["error"]] = out["typed_errors"].get(r["error"], 0) + 1
    out["junk_rate"] = out["junk_outputs"] / out["junk_checked"] if out["junk_checked"] else float("nan")
    if arm.endswith("+c"):
        out.update({
            "repair_rate": mean(1.0 if r["repairs"] > 0 else 0.0 for r in rs),
            "repairs_mean": mean(r["repairs"] for r in rs),
            "junk_repair_rate": mean(1.0 if r.get("junk_repairs") else 0.0 for r in rs),
            "fallback_rate": mean(1.0 if r["fallback"] else 0.0 for r in rs),
            "mask_share": sum(r["mask_s"] for r in rs) / max(1e-9, sum(r["wall"] for r in rs)),
            "forced_per_output": mean(r["forced"] for r in rs),
            "forced_share_of_tokens": sum(r["forced"] for r in rs) / max(1, sum(r["tokens"] + 1 for r in rs)),
        })
    return out


def score_json(ex: dict, res: dict) -> dict:
    ok, value, reason = json_valid(res["text"], ex["schema"]) if res["error"] is None or res["text"] else \
        (False, None, res["error"])
    if res["error"] is not None:  # a typed error: nothing was returned
        ok, value = False, None
    res.update(valid=ok, parsed=isinstance(value, dict), reason=reason if not ok else "",
               field_acc=field_accuracy(value, ex["fields"]) if value is not None else 0.0,
               junk=junk_strings(value, schema_keys(ex["schema"])) if isinstance(value, dict) else [])
    return res


# ----------------------------------------------------------------------------------------- sections
def bench_json(rt, exs, args, log) -> list[dict]:
    rows = []
    for i, ex in enumerate(exs):
        seed = args.seed + i
        row = {"family": ex["family"], "prompt": ex["prompt"], "answer": ex["answer"]}
        row["diffusion"] = score_json(ex, run_unconstrained(rt, ex["prompt"], "diffusion", args.max_new_tokens, seed))
        row["diffusion+c"] = score_json(ex, run_constrained(rt, ex["prompt"], ex["schema"], "diffusion",
                                                            args.max_new_tokens, seed, args.timeout))
        row["ar+c"] = score_json(ex, run_constrained(rt, ex["prompt"], ex["schema"], "ar", args.max_new_tokens, seed,
                                                     args.timeout))
        row["ar"] = score_json(ex, run_unconstrained(rt, ex["prompt"], "ar", args.max_new_tokens, seed))
        rows.append(row)
        log(f"json {i + 1}/{len(exs)} {ex['family']:9s} " + " ".join(
            f"{a}={'V' if row[a]['valid'] else 'x'}{row[a]['wall'] * 1000:.0f}ms" for a in ARMS))
    return rows


def bench_short(rt, exs, args, log) -> list[dict]:
    rows = []
    for i, ex in enumerate(exs):
        seed = args.seed + 10_000 + i
        spec = short_spec(ex["schema"])
        c = api.constraint_for(spec, rt)
        row = {"family": ex["family"], "prompt": ex["prompt"], "answer": ex["answer"]}
        for arm in ARMS:
            mode = "ar" if arm.startswith("ar") else "diffusion"
            if arm.endswith("+c"):
                r = run_constrained(rt, ex["prompt"], spec, mode, args.short_max_new_tokens, seed, args.timeout)
            else:
                r = run_unconstrained(rt, ex["prompt"], mode, args.short_max_new_tokens, seed)
            text = r["text"] if r["error"] is None else None
            r["valid"] = text is not None and c.matches(text)
            r["valid_stripped"] = text is not None and c.matches(text.strip())
            r["exact"] = text is not None and text.strip() == ex["answer"]
            r["answer_matches_spec"] = c.matches(ex["answer"])
            row[arm] = r
        rows.append(row)
        log(f"short {i + 1}/{len(exs)} {ex['family']:9s} " + " ".join(
            f"{a}={'V' if row[a]['valid'] else 'x'}{'=' if row[a]['exact'] else ''}" for a in ARMS))
    return rows


def summarise_short(rows: list[dict]) -> dict:
    out = {}
    for arm in ARMS:
        rs = [r[arm] for r in rows]
        n = len(rs)
        out[arm] = {"n": n, "validity": mean(1.0 if r["valid"] else 0.0 for r in rs),
                    "validity_stripped": mean(1.0 if r["valid_stripped"] else 0.0 for r in rs),
                    "exact_match": mean(1.0 if r["exact"] else 0.0 for r in rs),
                    "tpf": mean(r["tpf"] for r in rs if r["forward_passes"]),
                    "wall_s_mean": mean(r["wall"] for r in rs),
                    "typed_errors": sum(1 for r in rs if r["error"])}
    fams = sorted({r["family"] for r in rows})
    out["by_family"] = {f: {arm: {"n": sum(1 for r in rows if r["family"] == f),
                                  "validity": mean(1.0 if r[arm]["valid"] else 0.0 for r in rows if r["family"] == f),
                                  "exact_match": mean(1.0 if r[arm]["exact"] else 0.0
                                                      for r in rows if r["family"] == f)}
                            for arm in ARMS} for f in fams}
    out["gold_answers_matching_spec"] = {f: f"{sum(1 for r in rows if r['family'] == f and r['ar']['answer_matches_spec'])}"
                                         f"/{sum(1 for r in rows if r['family'] == f)}" for f in fams}
    return out


def bench_ablation(rt, exs, args, log) -> dict:
    if args.ablation == "full":
        grid = list(itertools.product([True, False], repeat=3))
    else:  # one knob at a time from the default, plus renoise with the others default
        grid = [(True, True, False), (False, True, False), (True, False, False), (True, True, True)]
    grid = [(p, f, r, True) for p, f, r in grid] + [(True, True, False, False)]
    out = {}
    for progress, force, renoise, junk in grid:
        knobs = {"progress": progress, "force_tokens": force, "renoise_invalid": renoise, "repair_junk": junk}
        name = f"progress={'on' if progress else 'off'} force={'on' if force else 'off'} " \
               f"renoise={'on' if renoise else 'off'}" + ("" if junk else " repair_junk=off")
        rs = []
        for i, ex in enumerate(exs):
            r = score_json(ex, run_constrained(rt, ex["prompt"], ex["schema"], "diffusion", args.max_new_tokens,
                                               args.seed + i, args.timeout, knobs=knobs))
            rs.append(r)
        first = [r for r in rs if r["error"] is None and r["repairs"] == 0 and not r["fallback"]]
        out[name] = {"knobs": knobs, "n": len(rs), "validity": mean(1.0 if r["valid"] else 0.0 for r in rs),
                     "first_attempt_valid": len(first) / len(rs),
                     "repair_rate": mean(1.0 if r["repairs"] > 0 else 0.0 for r in rs),
                     "fallback_rate": mean(1.0 if r["fallback"] else 0.0 for r in rs),
                     "typed_errors": sum(1 for r in rs if r["error"]),
                     "error_names": sorted({r["error"] for r in rs if r["error"]}),
                     "field_accuracy": mean(r["field_acc"] for r in rs),
                     "tpf": mean(r["tpf"] for r in rs if r["forward_passes"]),
                     "forward_passes": mean(r["forward_passes"] for r in rs),
                     "wall_s_mean": mean(r["wall"] for r in rs),
                     "junk_outputs": sum(1 for r in rs if r["junk"]),
                     "junk_repair_rate": mean(1.0 if r.get("junk_repairs") else 0.0 for r in rs)}
        o = out[name]
        log(f"ablation {name}: valid {o['validity']:.2f} first-attempt {o['first_attempt_valid']:.2f} "
            f"fallback {o['fallback_rate']:.2f} tpf {o['tpf']:.2f} passes {o['forward_passes']:.1f} "
            f"wall {o['wall_s_mean'] * 1000:.0f}ms")
    return out


# ----------------------------------------------------------------------------------------- report
def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def headline(summ: dict) -> dict:
    dc, du, ac, au = (summ[a] for a in ["diffusion+c", "diffusion", "ar+c", "ar"])
    return {
        "tpf_ratio_constrained_over_unconstrained": ratio(dc["tpf"], du["tpf"]),
        "wall_ratio_constrained_over_unconstrained": ratio(dc["wall_s_mean"], du["wall_s_mean"]),
        "wall_ratio_constrained_over_unconstrained_median": ratio(dc["wall_s_median"], du["wall_s_median"]),
        "wall_ratio_ar_constrained_over_diffusion_constrained": ratio(ac["wall_s_mean"], dc["wall_s_mean"]),
        "wall_ratio_ar_unconstrained_over_diffusion_unconstrained": ratio(au["wall_s_mean"], du["wall_s_mean"]),
        "fallback_rate_diffusion_constrained": dc["fallback_rate"],
        "goals": {
            "tpf_ratio>=1.2": ratio(dc["tpf"], du["tpf"]) >= 1.2,
            "wall_ratio<=1.10": ratio(dc["wall_s_mean"], du["wall_s_mean"]) <= 1.10,
            "fallback<=5%": dc["fallback_rate"] <= 0.05,
            "constrained validity 100%": dc["validity"] == 1.0 and ac["validity"] == 1.0,
            "every returned constrained value valid": dc["returned_valid"] == dc["returned"]
            and ac["returned_valid"] == ac["returned"],
        },
    }


def pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:.1f}%"


def f2(x: float) -> str:
    return "n/a" if x != x else f"{x:.2f}"


def write_md(res: dict, path: Path) -> None:
    s, h, meta = res["json"]["summary"], res["json"]["headline"], res["meta"]
    L = [f"# End-to-end constrained generation ({meta['model']})", "",
         f"Held-out prompts: `make_corpus(seed={meta['seed']})`, family-balanced, JSON prompts seen in training "
         f"removed. N = {s['diffusion']['n']} JSON requests, {res['short']['summary']['diffusion']['n']} short-answer "
         f"requests, ablation N = {meta['ablation_n']}. max_new_tokens = {meta['max_new_tokens']} (JSON), "
         f"{meta['short_max_new_tokens']} (short). Same per-request seed in every arm. Machine: {meta['machine']}, "
         f"torch threads = {meta['threads']}. Total run time {meta['seconds']:.0f} s.", "",
         "## JSON tasks (all families)", "",
         "| metric | unconstrained diffusion | constrained diffusion | constrained AR | unconstrained AR |",
         "|---|--:|--:|--:|--:|"]

    def row(name, fn):
        L.append(f"| {name} | " + " | ".join(fn(s[a]) for a in ARMS) + " |")

    row("validity (json.loads + jsonschema)", lambda x: f"{pct(x['validity'])} ({x['valid']}/{x['n']})")
    row("returned values that are valid", lambda x: f"{x['returned_valid']}/{x['returned']}")
    row("typed errors", lambda x: ", ".join(f"{k}: {v}" for k, v in x["typed_errors"].items()) or "0")
    row("field accuracy (all requests)", lambda x: pct(x["field_accuracy"]))
    row("field accuracy (valid outputs only)", lambda x: pct(x["field_accuracy_valid_only"]))
    row("exact match (valid and all fields right)", lambda x: pct(x["exact_match"]))
    row("tokens per forward (useful tokens incl. EOS / decoder passes)", lambda x: f2(x["tpf"]))
    row("tokens per forward (as `stats.tokens_per_forward`)", lambda x: f2(x["tpf_reported"]))
    row("forward passes per request", lambda x: f"{x['forward_passes']:.1f}")
    row("wall per request, mean (ms)", lambda x: f"{1000 * x['wall_s_mean']:.1f}")
    row("wall per request, median (ms)", lambda x: f"{1000 * x['wall_s_median']:.1f}")
    row("outputs that reached EOS", lambda x: f"{x['stopped']}/{x['n']}")
    row("junk inside strings (of parseable objects)", lambda x: f"{x['junk_outputs']}/{x['junk_checked']}")
    cons = lambda k, fmt: lambda x: fmt(x[k]) if k in x else "—"  # noqa: E731
    row("repair rate (≥1 repair)", cons("repair_rate", pct))
    row("requests with a junk repair (SDK `repair_junk`)", cons("junk_repair_rate", pct))
    row("AR fallback rate", cons("fallback_rate", pct))
    row("mask time share of wall", cons("mask_share", pct))
    row("forced tokens per output", cons("forced_per_output", lambda v: f"{v:.1f}"))
    row("forced share of output tokens", cons("forced_share_of_tokens", pct))
    L += ["", "## Headline ratios and goals", "",
          "| quantity | value | goal | met |", "|---|--:|--:|:-:|",
          f"| TPF constrained / unconstrained (diffusion) | {f2(h['tpf_ratio_constrained_over_unconstrained'])} | ≥ 1.2 "
          f"| {'yes' if h['goals']['tpf_ratio>=1.2'] else 'no'} |",
          f"| wall per request constrained / unconstrained (diffusion, mean) | "
          f"{f2(h['wall_ratio_constrained_over_unconstrained'])} | ≤ 1.10 | "
          f"{'yes' if h['goals']['wall_ratio<=1.10'] else 'no'} |",
          f"| same, median | {f2(h['wall_ratio_constrained_over_unconstrained_median'])} | | |",
          f"| wall AR-constrained / diffusion-constrained | "
          f"{f2(h['wall_ratio_ar_constrained_over_diffusion_constrained'])} | (3.3x reported for the real model) | |",
          f"| wall AR / diffusion, unconstrained | {f2(h['wall_ratio_ar_unconstrained_over_diffusion_unconstrained'])} "
          f"| | |",
          f"| AR fallback rate (constrained diffusion) | {pct(h['fallback_rate_diffusion_constrained'])} | ≤ 5% | "
          f"{'yes' if h['goals']['fallback<=5%'] else 'no'} |",
          f"| constrained validity (diffusion and AR) | {pct(s['diffusion+c']['validity'])} / {pct(s['ar+c']['validity'])}"
          f" | 100% | {'yes' if h['goals']['constrained validity 100%'] else 'no'} |",
          f"| returned constrained values that are valid (diffusion / AR) | {s['diffusion+c']['returned_valid']}/"
          f"{s['diffusion+c']['returned']} / {s['ar+c']['returned_valid']}/{s['ar+c']['returned']} | all | "
          f"{'yes' if h['goals']['every returned constrained value valid'] else 'no'} |", ""]
    L += ["### Per family (validity / field accuracy)", "",
          "| family | n | " + " | ".join(ARM_LABEL[a] for a in ARMS) + " |", "|---|--:|" + "--:|" * len(ARMS)]
    for fam, d in res["json"]["by_family"].items():
        L.append(f"| {fam} | {d['n']} | " + " | ".join(
            f"{pct(d[a]['validity'])} / {pct(d[a]['field_accuracy'])}" for a in ARMS) + " |")
    ss = res["short"]["summary"]
    L += ["", "## Short-answer tasks (regex / choice / grammar)", "",
          "Validity = the output is accepted by the task's constraint (`Constraint.matches`), as is; "
          "\"stripped\" = after `str.strip()`. Exact = stripped output equals the gold answer.", "",
          "| metric | " + " | ".join(ARM_LABEL[a] for a in ARMS) + " |", "|---|" + "--:|" * len(ARMS)]
    for name, k, fmt in [("validity", "validity", pct), ("validity (stripped)", "validity_stripped", pct),
                         ("exact match", "exact_match", pct), ("tokens per forward", "tpf", f2),
                         ("wall per request, mean (ms)", "wall_s_mean", lambda v: f"{1000 * v:.1f}"),
                         ("typed errors", "typed_errors", str)]:
        L.append(f"| {name} | " + " | ".join(fmt(ss[a][k]) for a in ARMS) + " |")
    L += ["", "| family | n | gold answer matches spec | " + " | ".join(ARM_LABEL[a] + " (valid / exact)" for a in ARMS)
          + " |", "|---|--:|--:|" + "--:|" * len(ARMS)]
    for fam, d in ss["by_family"].items():
        L.append(f"| {fam} | {d['diffusion']['n']} | {ss['gold_answers_matching_spec'][fam]} | " + " | ".join(
            f"{pct(d[a]['validity'])} / {pct(d[a]['exact_match'])}" for a in ARMS) + " |")
    ab = res["ablation"]
    L += ["", "## Ablation: ConstraintGuide knobs (constrained diffusion)", "",
          f"N = {meta['ablation_n']} JSON prompts (the first of the set above), same seeds. \"first-attempt valid\" = "
          "valid with no repair and no AR fallback.", "",
          "| knobs | validity | typed errors | first-attempt valid | repair rate | fallback | field acc. | TPF | "
          "forward passes | wall (ms) | junk outputs | junk repairs |", "|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for name, o in ab["configs"].items():
        L.append(f"| {name} | {pct(o['validity'])} | {', '.join(o.get('error_names', [])) or '0'} | "
                 f"{pct(o['first_attempt_valid'])} | {pct(o['repair_rate'])} | "
                 f"{pct(o['fallback_rate'])} | {pct(o['field_accuracy'])} | {f2(o['tpf'])} | "
                 f"{o['forward_passes']:.1f} | {1000 * o['wall_s_mean']:.0f} | {o['junk_outputs']} | "
                 f"{pct(o['junk_repair_rate'])} |")
    L += ["", f"**renoise_invalid by measurement:** {ab['renoise_verdict']}", ""]
    L += ["## Notes", "",
          "* Validity uses an independent `jsonschema` validator with the format checker on (`email`, `date`).",
          "* Wall time is measured around each call (includes prompt encoding, constraint cache lookup — schemas "
          "are compiled once in a warm-up — repairs and fallback).",
          "* TPF counts the output tokens up to and including EOS (for a run that did not stop: the tokens "
          "produced) over decoder forward passes; forced tokens cost no pass, so they raise constrained TPF. "
          "AR TPF is 1 by construction (one encoder step per token) and is shown for completeness.",
          "* Junk: a string value containing any of `{}[]\":`, a non-printable character, or (as a substring) "
          "the name of another key of the same schema (e.g. `\"job\":\"managinaddresscity\"`).", ""]
    path.write_text("\n".join(L))


def plots(res: dict, img_dir: Path) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s, ss = res["json"]["summary"], res["short"]["summary"]
    colors = ["#9aa5b1", "#2b7bb9", "#e07b39", "#c9b79c"]
    img_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 4))
    x = range(len(ARMS))
    w = 0.38
    ax.bar([i - w / 2 for i in x], [100 * s[a]["validity"] for a in ARMS], w, label="JSON tasks", color=colors[1])
    ax.bar([i + w / 2 for i in x], [100 * ss[a]["validity"] for a in ARMS], w, label="short answers",
           color=colors[2])
    for i, a in enumerate(ARMS):
        ax.text(i - w / 2, 100 * s[a]["validity"] + 1, f"{100 * s[a]['validity']:.0f}", ha="center", fontsize=8)
        ax.text(i + w / 2, 100 * ss[a]["validity"] + 1, f"{100 * ss[a]['validity']:.0f}", ha="center", fontsize=8)
    ax.set_xticks(list(x), [ARM_LABEL[a] for a in ARMS])
    ax.set_ylabel("valid outputs (%)")
    ax.set_ylim(0, 125)
    ax.set_title(f"Validity, {res['meta']['model']} (N={s['diffusion']['n']} JSON, {ss['diffusion']['n']} short)")
    ax.legend(loc="upper center", ncol=2)
    fig.tight_layout()
    p1 = img_dir / "e2e_validity.png"
    fig.savefig(p1, dpi=120)
    plt.close(fig)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    a1.bar(list(x), [s[a]["tpf"] for a in ARMS], color=colors)
    a1.set_xticks(list(x), [ARM_LABEL[a].replace(" ", "\n") for a in ARMS], fontsize=8)
    a1.set_ylabel("tokens per forward pass")
    a1.set_title("TPF (JSON tasks)")
    a2.bar(list(x), [1000 * s[a]["wall_s_mean"] for a in ARMS], color=colors)
    a2.set_xticks(list(x), [ARM_LABEL[a].replace(" ", "\n") for a in ARMS], fontsize=8)
    a2.plot(list(x), [1000 * s[a]["wall_s_median"] for a in ARMS], "ko", label="median")
    a2.legend()
    a2.set_ylabel("ms per request (bar: mean)")
    a2.set_title("Wall time per request (JSON tasks)")
    fig.tight_layout()
    p2 = img_dir / "e2e_tpf_wall.png"
    fig.savefig(p2, dpi=120)
    plt.close(fig)
    return [str(p1.relative_to(ROOT)) if p1.is_relative_to(ROOT) else str(p1),
            str(p2.relative_to(ROOT)) if p2.is_relative_to(ROOT) else str(p2)]


def renoise_verdict(configs: dict) -> str:
    base = {"progress": True, "force_tokens": True, "repair_junk": True}
    on = next((o for o in configs.values() if o["knobs"] == {**base, "renoise_invalid": True}), None)
    off = next((o for o in configs.values() if o["knobs"] == {**base, "renoise_invalid": False}), None)
    if on is None or off is None:
        return "not measured"

    def key(o):  # higher is better: first-attempt validity, then fewer fallbacks, then fewer passes
        return (round(o["first_attempt_valid"], 3), -round(o["fallback_rate"], 3), round(o["field_accuracy"], 3),
                -round(o["forward_passes"], 1))

    win = "off (the current default)" if key(off) >= key(on) else "on"
    return (f"renoise_invalid={win} wins (off: first-attempt {pct(off['first_attempt_valid'])}, fallback "
            f"{pct(off['fallback_rate'])}, field acc. {pct(off['field_accuracy'])}, {off['forward_passes']:.1f} passes; "
            f"on: first-attempt {pct(on['first_attempt_valid'])}, fallback {pct(on['fallback_rate'])}, field acc. "
            f"{pct(on['field_accuracy'])}, {on['forward_passes']:.1f} passes).")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=60, help="JSON requests (family-balanced)")
    ap.add_argument("--n-short", type=int, default=40, help="short-answer requests (family-balanced)")
    ap.add_argument("--ablation-n", type=int, default=16)
    ap.add_argument("--ablation", choices=["full", "oat"], default="full",
                    help="full 2x2x2 grid, or one knob at a time from the default")
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--train-seed", type=int, default=0)
    ap.add_argument("--train-size", type=int, default=60_000)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--short-max-new-tokens", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=60.0, help="per constrained request (timeout_s)")
    ap.add_argument("--tiny", action="store_true", help="random tiny runtime instead of the embedded model")
    ap.add_argument("--model", default=None, help="checkpoint directory (default: the embedded model)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "e2e"))
    ap.add_argument("--img-dir", default=str(ROOT / "docs" / "img"))
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args()

    t_start = time.time()
    log = lambda m: print(f"[{time.time() - t_start:7.1f}s] {m}", flush=True)  # noqa: E731
    rt = tiny_runtime() if args.tiny else (DiffusionRuntime.from_pretrained(args.model) if args.model
                                           else DiffusionRuntime.default())
    log(f"runtime {rt.name}: canvas {rt.model.config.canvas_length}, vocab {len(rt.tokenizer)}, settings {rt.settings}")
    json_exs, short_exs, data_info = held_out(args.n, args.n_short, args.seed, args.train_seed, args.train_size)
    log(f"data: {len(json_exs)} JSON, {len(short_exs)} short; {data_info}")

    # warm-up: compile every family schema once (cached), and one model call per mode
    t0 = time.perf_counter()
    for ex in json_exs:
        api.constraint_for(ex["schema"], rt)
    for ex in short_exs:
        api.constraint_for(short_spec(ex["schema"]), rt)
    compile_s = time.perf_counter() - t0
    for mode in ("diffusion", "ar"):
        rt.generate("warm up", max_new_tokens=8, seed=0, mode=mode)
    log(f"compiled {len({json.dumps(e['schema'], sort_keys=True) for e in json_exs + short_exs})} specs in "
        f"{compile_s:.2f}s")

    rows = bench_json(rt, json_exs, args, log)
    summ = {a: summarise_json(rows, a) for a in ARMS}
    by_family = {}
    for fam in sorted({r["family"] for r in rows}):
        fr = [r for r in rows if r["family"] == fam]
        by_family[fam] = {"n": len(fr), **{a: {"validity": mean(1.0 if r[a]["valid"] else 0.0 for r in fr),
                                               "field_accuracy": mean(r[a]["field_acc"] for r in fr)} for a in ARMS}}
    short_rows = bench_short(rt, short_exs, args, log)
    ab_configs = bench_ablation(rt, json_exs[: args.ablation_n], args, log) if args.ablation_n else {}

    samples = []
    for r in rows[:: max(1, len(rows) // 8)]:
        samples.append({"family": r["family"], "prompt": r["prompt"], "answer": r["answer"],
                        **{a: {"text": r[a]["text"][:200], "valid": r[a]["valid"], "error": r[a]["error"],
                               "junk": r[a]["junk"][:3]} for a in ARMS}})
    junk_examples = {a: [{"text": r[a]["text"][:200], "junk": r[a]["junk"][:3]} for r in rows if r[a]["junk"]][:5]
                     for a in ARMS}
    invalid_constrained = [{"arm": a, "family": r["family"], "text": r[a]["text"][:200], "error": r[a]["error"],
                            "error_msg": r[a].get("error_msg"), "reason": r[a]["reason"]}
                           for r in rows for a in ("diffusion+c", "ar+c") if not r[a]["valid"]]
    res = {
        "meta": {"model": rt.name, "seed": args.seed, "n": len(json_exs), "n_short": len(short_exs),
                 "ablation_n": min(args.ablation_n, len(json_exs)), "max_new_tokens": args.max_new_tokens,
                 "short_max_new_tokens": args.short_max_new_tokens, "timeout_s": args.timeout,
                 "threads": torch.get_num_threads(), "machine": f"{platform.machine()} CPU", "data": data_info,
                 "compile_s": compile_s, "settings": str(rt.settings),
                 "canvas_length": rt.model.config.canvas_length, "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                        time.gmtime())},
        "json": {"summary": summ, "headline": headline(summ), "by_family": by_family,
                 "invalid_constrained": invalid_constrained, "junk_examples": junk_examples, "samples": samples},
        "short": {"summary": summarise_short(short_rows),
                  "invalid_constrained": [{"arm": a, "family": r["family"], "answer": r["answer"],
                                           "text": r[a]["text"], "error": r[a]["error"],
                                           "error_msg": r[a].get("error_msg")}
                                          for r in short_rows for a in ("diffusion+c", "ar+c") if not r[a]["valid"]],
                  "samples": [{"family": r["family"], "answer": r["answer"],
                               **{a: r[a]["text"][:80] for a in ARMS}} for r in short_rows[:16]]},
        "ablation": {"configs": ab_configs, "renoise_verdict": renoise_verdict(ab_configs)},
    }
    res["meta"]["seconds"] = time.time() - t_start
    if not args.no_plots:
        res["meta"]["plots"] = plots(res, Path(args.img_dir))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str))
    write_md(res, out.with_suffix(".md"))
    log(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    h = res["json"]["headline"]
    log("validity " + ", ".join(f"{a}={pct(summ[a]['validity'])}" for a in ARMS))
    log(f"TPF ratio {f2(h['tpf_ratio_constrained_over_unconstrained'])}, wall ratio "
        f"{f2(h['wall_ratio_constrained_over_unconstrained'])}, AR/diff constrained "
        f"{f2(h['wall_ratio_ar_constrained_over_diffusion_constrained'])}, fallback "
        f"{pct(h['fallback_rate_diffusion_constrained'])}")


if __name__ == "__main__":
    main()
