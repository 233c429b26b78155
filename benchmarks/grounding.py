"""Grounded extraction benchmark: field accuracy and exact-record rate of grounded vs
constrained-only vs unconstrained generation, diffusion and AR, on the same prompts and seeds.

Prompts: held-out JSON extraction prompts of the embedded model's task families
(``dgemma_struct.training.corpus``, ``make_corpus(..., seed=12345)``; prompts that occur in the
training corpus ``make_corpus(60000, seed=0)`` are dropped), keeping the examples whose every
string and number value occurs verbatim in the prompt (all of person, contact, order, skills,
optional, booking; employee when the country is named; never event, whose date is ISO in the
answer and spelled out in the sentence).

Arms (per mode, diffusion and AR):

* ``free``         unconstrained (``runtime.generate_batch``), parsed with ``json.loads``
* ``schema``       constrained to the family schema (``generate_batch``)
* ``grounded``     the same schema with ``ground="all"``: strings are spans, numbers are numbers of
                   the source; the default source: the prompt's document part (the text after its
                   instruction line; before issue #34 the whole prompt, instruction words included)
* ``grounded-doc`` the same with ``source=`` the sentence only (the instruction words are not offered)

Reported: schema-valid rate, field accuracy (share of fields equal to the reference), exact-record
rate (every field right), share of string/number values not found verbatim in the source (must be 0
for the grounded arms), tokens per forward and wall time per request.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/grounding.py --n 48            # ~6 min on a 2-core box
    OMP_NUM_THREADS=1 python benchmarks/grounding.py --screenshot      # docs/img/grounding.png only

Writes ``--out`` (``.json`` and ``.md``) and ``docs/img/grounding_accuracy.png``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import jsonschema  # noqa: E402
import torch  # noqa: E402

from dgemma_struct.api import generate_batch  # noqa: E402
from dgemma_struct.errors import DgemmaStructError  # noqa: E402
from dgemma_struct.grounding import (GroundedResult, generate_grounded, generate_grounded_batch,  # noqa: E402
                                    grounded_sources, source_numbers)
from dgemma_struct.runtime import DiffusionRuntime  # noqa: E402
from dgemma_struct.training.corpus import make_corpus  # noqa: E402

ARMS = ["free", "schema", "grounded", "grounded-doc"]
LABEL = {"free": "unconstrained", "schema": "constrained (schema only)", "grounded": "grounded (default source)",
         "grounded-doc": "grounded (source = sentence)"}
HELD_OUT_SEED, TRAIN_SEED, TRAIN_SIZE = 12345, 0, 60000


def leaves(v: Any) -> list:
    if isinstance(v, dict):
        return [x for y in v.values() for x in leaves(y)]
    if isinstance(v, list):
        return [x for y in v for x in leaves(y)]
    return [v]


def verbatim(value: Any, source: str) -> bool:
    """A string or number value written in ``source`` (booleans / nulls are not counted)."""
    if isinstance(value, str):
        return bool(value) and value in source
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return any(lit.value == value for lit, _, _ in source_numbers(source))
    return True


def sentence_of(prompt: str) -> str:
    """The sentence inside one of the corpus's four prompt templates."""
    if prompt.startswith("Extract the "):
        return prompt.split("\n", 1)[1]
    if prompt.startswith("Convert to JSON with fields "):
        return prompt.split(": ", 1)[1]
    if prompt.startswith("Read the text and give "):
        return prompt.split("\nText: ", 1)[1]
    return prompt.split("\n", 1)[0]


def held_out(n: int) -> list[dict]:
    train = {e["prompt"] for e in make_corpus(TRAIN_SIZE, seed=TRAIN_SEED)}
    by_fam: dict[str, list] = {}
    for e in make_corpus(max(4000, 60 * n), seed=HELD_OUT_SEED):
        if e["kind"] != "json" or e["prompt"] in train:
            continue
        if all(verbatim(v, e["prompt"]) for v in leaves(e["fields"])):
            by_fam.setdefault(e["family"], []).append(e)
    fams = sorted(by_fam)
    out, i = [], 0
    while len(out) < n and i < 100 * n:
        items = by_fam[fams[i % len(fams)]]
        j = i // len(fams)
        if j < len(items):
            out.append(items[j])
        i += 1
    return out


JSB_FILE = "Glaiveai2K.jsonl.gz"


def jsb_examples(n: int, seed: int = 0) -> list[dict]:
    """JSONSchemaBench-style prompts with a pasted document: flat Glaiveai2K schemas (2-5 required
    string / integer / number properties, no enum / format / pattern), a valid instance drawn from
    the corpus vocabulary, and a "key: value" document that states it."""
    import gzip
    import random

    from dgemma_struct.training import corpus as cp

    path = None
    for base in (ROOT.parent / "shared" / "data" / "jsonschemabench", ROOT / "tests" / "data" / "jsonschemabench"):
        if (base / JSB_FILE).exists():
            path = base / JSB_FILE
            break
    if path is None:
        return []
    r = random.Random(seed)
    pool = {"date": lambda: cp.random_date(r)[0], "destination": lambda: r.choice(cp.CITIES),
            "origin": lambda: r.choice(cp.CITIES), "departure": lambda: r.choice(cp.CITIES),
            "number": lambda: f"{r.choice('ABCDEFGH')}{r.randrange(100, 999)}",
            "name": lambda: " ".join(cp.random_name(r)), "city": lambda: r.choice(cp.CITIES),
            "location": lambda: r.choice(cp.CITIES), "country": lambda: r.choice(list(cp.COUNTRIES.values())),
            "email": lambda: cp.random_email(r, *cp.random_name(r)), "phone": lambda: cp.random_phone(r)}
    words = cp.PRODUCTS + cp.JOBS + cp.SKILLS + cp.EVENTS
    out = []
    for line in gzip.open(path, "rt"):
        row = json.loads(line)
        sch = row["schema"]
        props = sch.get("properties") if isinstance(sch, dict) else None
        if not isinstance(props, dict) or not 2 <= len(props) <= 5 or set(sch.get("required", [])) != set(props):
            continue
        if any(not isinstance(v, dict) or v.get("type") not in ("string", "integer", "number") or
               set(v) - {"type", "description", "title"} for v in props.values()):
            continue
        inst: dict = {}
        for k, v in props.items():
            if v["type"] == "integer":
                inst[k] = r.randrange(2, 500)
            elif v["type"] == "number":
                inst[k] = round(r.uniform(1, 900), 1)
            else:
                gen = next((g for key, g in pool.items() if key in k.lower()), None)
                inst[k] = gen() if gen else r.choice(words)
        doc = "\n".join(f"{k.replace('_', ' ')}: {v}" for k, v in inst.items())
        schema = {**{k: v for k, v in sch.items() if k != "$schema"}, "additionalProperties": False}
        out.append({"family": "jsb", "prompt": f"Extract the {cp._keys_phrase(list(props))} as JSON.\n{doc}",
                    "schema": schema, "fields": inst, "kind": "json"})
        if len(out) >= n:
            break
    return out


def field_accuracy(value: Any, fields: dict) -> float:
    if not isinstance(value, dict):
        return 0.0
    return sum(value.get(k) == v for k, v in fields.items()) / len(fields)


def run_arm(rt: DiffusionRuntime, arm: str, mode: str, examples: list[dict], batch: int, max_new: int) -> list[dict]:
    rows = []
    for b in range(0, len(examples), batch):
        chunk = examples[b:b + batch]
        prompts = [e["prompt"] for e in chunk]
        schemas = [e["schema"] for e in chunk]
        seed = 1000 + b
        t0 = time.perf_counter()
        if arm == "free":
            res = rt.generate_batch(prompts, max_new_tokens=max_new, seed=seed, mode=mode)
        elif arm == "schema":
            res = generate_batch(prompts, schemas, runtime=rt, max_new_tokens=max_new, seed=seed, mode=mode,
                                 return_exceptions=True)
        else:
            sources = [sentence_of(p) for p in prompts] if arm == "grounded-doc" else None
            res = generate_grounded_batch(prompts, schemas, sources=sources, ground="all", runtime=rt,
                                          max_new_tokens=max_new, seed=seed, mode=mode, return_exceptions=True)
        wall = (time.perf_counter() - t0) / len(chunk)
        for e, r in zip(chunk, res):
            row = {"family": e["family"], "wall_s": wall, "error": None, "value": None, "tpf": None}
            if isinstance(r, DgemmaStructError):
                row["error"] = type(r).__name__
            else:
                row["tpf"] = r.stats.tokens_per_forward
                try:
                    row["value"] = r.json_value if isinstance(r, GroundedResult) else json.loads(r.text)
                except ValueError:
                    row["value"] = None
            v = row["value"]
            row["valid"] = v is not None and jsonschema.Draft202012Validator(
                e["schema"], format_checker=jsonschema.FormatChecker()).is_valid(v)
            row["acc"] = field_accuracy(v, e["fields"])
            src = sentence_of(e["prompt"]) if arm == "grounded-doc" else \
                grounded_sources(e["prompt"])[0] if arm == "grounded" else e["prompt"]
            vals = [x for x in leaves(v) if isinstance(x, (str, int, float)) and not isinstance(x, bool)] \
                if v is not None else []
            row["n_values"] = len(vals)
            row["not_verbatim"] = sum(not verbatim(x, src) for x in vals)
            if isinstance(r, GroundedResult):
                row["grounded_spans"] = len(r.spans)
                row["span_mismatch"] = sum(r.sources[s.doc][s.start:s.end] != s.text for s in r.spans)
            rows.append(row)
    return rows


def summarise(rows: list[dict]) -> dict:
    n = len(rows)
    nv = sum(r["n_values"] for r in rows)
    tpf = [r["tpf"] for r in rows if r["tpf"] is not None]
    return {"n": n, "schema_valid": sum(r["valid"] for r in rows) / n,
            "field_accuracy": statistics.mean(r["acc"] for r in rows),
            "exact_record": sum(r["acc"] == 1.0 for r in rows) / n,
            "not_verbatim_share": (sum(r["not_verbatim"] for r in rows) / nv) if nv else 0.0,
            "errors": sum(r["error"] is not None for r in rows),
            "tpf": statistics.mean(tpf) if tpf else 0.0,
            "wall_s": statistics.mean(r["wall_s"] for r in rows),
            "span_mismatch": sum(r.get("span_mismatch", 0) for r in rows)}


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [a for a in ARMS if a in report["arms"]["diffusion"]]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), dpi=110, sharey=True)
    for ax, metric, title in [(axes[0], "field_accuracy", "field accuracy"),
                              (axes[1], "exact_record", "exact-record rate")]:
        width = 0.8 / len(arms)
        for i, arm in enumerate(arms):
            ys = [report["arms"][m][arm][metric] * 100 for m in ("diffusion", "ar")]
            xs = [k + (i - (len(arms) - 1) / 2) * width for k in range(2)]
            bars = ax.bar(xs, ys, width, label=LABEL[arm])
            for x, y in zip(xs, ys):
                ax.text(x, y + 1, f"{y:.0f}", ha="center", fontsize=8)
        ax.set_xticks([0, 1], ["diffusion", "AR"])
        ax.set_title(f"{title} (%)")
        ax.set_ylim(0, 105)
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle(f"Grounded extraction, embedded 5M model, {report['n']} held-out prompts", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def markdown(report: dict) -> str:
    lines = [f"n = {report['n']} prompts, max_new_tokens = {report['max_new_tokens']}, batch = {report['batch']}, "
             f"{report['machine']}", "",
             "| mode | arm | schema-valid | field acc | exact record | not verbatim | errors | TPF | wall/req (s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for mode in [m for m in ("diffusion", "ar") if m in report["arms"]]:   # --modes may leave one out
        for arm, s in report["arms"][mode].items():
            lines.append(f"| {mode} | {LABEL[arm]} | {s['schema_valid']:.0%} | {s['field_accuracy']:.1%} | "
                         f"{s['exact_record']:.1%} | {s['not_verbatim_share']:.1%} | {s['errors']} | {s['tpf']:.2f} | "
                         f"{s['wall_s']:.2f} |")
    if "diffusion" not in report["arms"]:
        return "\n".join(lines) + "\n"
    lines += ["", "Field accuracy by family (diffusion):", "",
              "| family | " + " | ".join(LABEL[a] for a in report["arms"]["diffusion"]) + " |",
              "|---|" + "---|" * len(report["arms"]["diffusion"])]
    for fam, accs in sorted(report["by_family"]["diffusion"].items()):
        lines.append(f"| {fam} | " + " | ".join(f"{accs[a]:.0%}" for a in report["arms"]["diffusion"]) + " |")
    return "\n".join(lines) + "\n"


def screenshot(rt: DiffusionRuntime, png: Path) -> None:
    """Renders one grounded extraction next to the plain constrained one and screenshots it in
    headless Chromium."""
    from dgemma_struct.api import generate

    doc = "Meet Nina Park, age 34, email nina.park@inbox.dev. Call Nina Park in Lisbon on 415-555-0199."
    prompt = "Extract the name, age, email, phone and city as JSON.\n" + doc
    schema = {"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string", "format": "email"},
        "phone": {"type": "string", "pattern": r"^\d{3}-\d{3}-\d{4}$"}, "city": {"type": "string"}},
        "required": ["name", "age", "email", "phone", "city"], "additionalProperties": False}
    plain = generate(prompt, schema, runtime=rt, seed=0, max_new_tokens=128)
    res = generate_grounded(prompt, schema, source=doc, ground="all", runtime=rt, seed=0, max_new_tokens=128)
    page = res.to_html(title="grounded extraction (embedded 5M model)").replace(
        "</body>", '<h3>the same prompt, schema-constrained only</h3><pre class="val">'
        + json.dumps(plain, indent=2).replace("<", "&lt;") + "</pre></body>")
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "grounding.html"
        f.write_text(page, encoding="utf-8")
        png.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                        "--window-size=900,860", f"--screenshot={png}", f.as_uri()], check=True,
                       capture_output=True, timeout=120)
    print("grounded:", res.json_value)
    print("plain:   ", plain)
    print("screenshot:", png)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--modes", default="diffusion,ar")
    ap.add_argument("--out", default="/tmp/grounding_results")
    ap.add_argument("--plot", default=str(ROOT / "docs" / "img" / "grounding_accuracy.png"))
    ap.add_argument("--screenshot", action="store_true", help="only render docs/img/grounding.png")
    ap.add_argument("--jsb", type=int, default=0, help="instead: N JSONSchemaBench-style prompts with a document")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rt = DiffusionRuntime.default()
    if args.screenshot:
        screenshot(rt, ROOT / "docs" / "img" / "grounding.png")
        return
    examples = jsb_examples(args.jsb) if args.jsb else held_out(args.n)
    report: dict = {"n": len(examples), "max_new_tokens": args.max_new_tokens, "batch": args.batch,
                    "machine": f"{platform.machine()} CPU, torch {torch.__version__}, 1 thread",
                    "families": sorted({e["family"] for e in examples}), "arms": {}, "by_family": {}}
    t_all = time.perf_counter()
    for mode in args.modes.split(","):
        report["arms"][mode], report["by_family"][mode] = {}, {}
        for arm in args.arms.split(","):
            t0 = time.perf_counter()
            rows = run_arm(rt, arm, mode, examples, args.batch, args.max_new_tokens)
            s = report["arms"][mode][arm] = summarise(rows)
            for fam in report["families"]:
                fr = [r for r in rows if r["family"] == fam]
                report["by_family"][mode].setdefault(fam, {})[arm] = statistics.mean(r["acc"] for r in fr)
            print(f"{mode:9s} {arm:12s} acc={s['field_accuracy']:.3f} exact={s['exact_record']:.3f} "
                  f"valid={s['schema_valid']:.2f} notverb={s['not_verbatim_share']:.3f} err={s['errors']} "
                  f"tpf={s['tpf']:.2f} wall={s['wall_s']:.2f}s ({time.perf_counter() - t0:.0f}s)", flush=True)
    report["total_s"] = time.perf_counter() - t_all
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    out.with_suffix(".md").write_text(markdown(report))
    if "diffusion" in report["arms"] and "ar" in report["arms"]:
        plot(report, Path(args.plot))
    print(markdown(report))
    print(f"total {report['total_s']:.0f}s")


if __name__ == "__main__":
    main()
