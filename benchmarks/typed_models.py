"""Typed-models benchmark (issue #32): ordinary pydantic models, as a new user writes them, on the
embedded model, diffusion and AR, several seeds.

Two parts:

* **grammar-width probes** — per type, JSON values the type's pydantic validator rejects; each is put
  in a one-field model ``{"v": <value>}`` and checked with ``Constraint.grammar_accepts``. A probe the
  grammar accepts is a value the model may write and only the repair loop can catch.
* **requests** — every model of ``benchmarks/typed_corpus.py`` with its prompt, through
  ``generate(prompt, Model, options)`` with the default options (a new user's call) in each mode and
  seed: success (a value that ``Model.model_validate_json`` accepts, no typed error), repairs per
  request, forward passes, p50 / p95 wall, number literals beyond their type (an integer outside int64,
  a number with more than 17 significant digits or one that overflows a double) and string values
  longer than 200 characters.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/typed_models.py                       # 3 seeds, both modes
    OMP_NUM_THREADS=1 python benchmarks/typed_models.py --seeds 1 --cases invoice,event --out /tmp/tm

Writes ``<out>.json`` after every model (a stopped run keeps what it measured) and ``<out>.md`` at the
end; with ``--before docs/results/typed_models_before.json`` the markdown compares the two runs.
"""
from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from pydantic import BaseModel, ValidationError, create_model  # noqa: E402

from batch_scaling import write_results  # noqa: E402
from typed_corpus import CORPUS, PROBES  # noqa: E402

INT64 = (-(2 ** 63), 2 ** 63 - 1)
LONG_STRING = 200
MAX_SIG_DIGITS = 17


# ----------------------------------------------------------------------------------------- output checks
def significant_digits(literal: str) -> int:
    """Digits of a JSON number's mantissa without its leading zeros (``"0.00120"`` -> 3)."""
    mantissa = re.split(r"[eE]", literal.lstrip("-"))[0].replace(".", "")
    return len(mantissa.lstrip("0")) or 1


def number_beyond_type(literal: str) -> bool:
    """An integer literal outside int64, or a number with more than 17 significant digits or one a
    double cannot hold (overflow to inf)."""
    if re.fullmatch(r"-?\d+", literal):
        return not INT64[0] <= int(literal) <= INT64[1]
    return significant_digits(literal) > MAX_SIG_DIGITS or float(literal) in (float("inf"), float("-inf"))


def number_literals(text: str) -> list[str]:
    """Every number literal of a JSON text, as written (``[]`` if the text is not JSON)."""
    found: list[str] = []

    def keep(s: str) -> float:
        found.append(s)
        return 0.0

    try:
        json.loads(text, parse_int=keep, parse_float=keep)
    except ValueError:
        # a cut-off text (LengthError): compact JSON puts a number right after ":", "[" or ","
        # (UUID / date digits inside strings follow a quote or a dash instead)
        return re.findall(r"(?<=[:\[,])-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?=[,\]}]|$)", text)
    return found


def long_strings(value: Any) -> list[str]:
    """String values (and keys) longer than 200 characters, anywhere in a JSON value."""
    if isinstance(value, dict):
        return [k for k in value if len(k) > LONG_STRING] + [s for v in value.values() for s in long_strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in long_strings(v)]
    return [value] if isinstance(value, str) and len(value) > LONG_STRING else []


# ----------------------------------------------------------------------------------------- probes
def type_probes() -> dict[str, tuple[Any, list[str], list[str]]]:
    """Per type: ``(annotation, values the validator rejects, values it accepts)``. The corpus's own
    probes (the same in every run, so runs compare), then the rows of the package's type table
    (``constraints.type_table.type_table()``, issue #32's type work) where it exists, as ``table:<name>``."""
    out: dict[str, tuple[Any, list[str], list[str]]] = {k: (ann, vals, []) for k, (ann, vals) in PROBES.items()}
    try:
        from dgemma_struct.constraints.type_table import type_table
    except ImportError:
        return out
    for row in type_table():
        out[f"table:{row.name}"] = (row.type, list(row.rejected), list(row.accepted))
    return out


def run_probes(rt) -> dict[str, Any]:
    """Per type: how many validator-rejected values the compiled grammar still accepts (too wide) and
    how many validator-accepted values it refuses (too narrow)."""
    from pydantic import TypeAdapter

    from dgemma_struct.constraints import compile_constraint

    out: dict[str, Any] = {}
    for name, (ann, rejected, accepted) in type_probes().items():
        model = create_model("Probe", v=(ann, ...))
        try:
            c = compile_constraint(model, tokenizer=rt.tokenizer, use_cache=False)
        except Exception as err:  # noqa: BLE001 - a type that does not compile is a finding, recorded
            out[name] = {"compile_error": f"{type(err).__name__}: {str(err)[:120]}", "probes": len(rejected)}
            continue
        adapter = TypeAdapter(model)

        def valid(lit: str) -> bool:
            try:
                adapter.validate_json('{"v":' + lit + "}")
                return True
            except ValidationError:
                return False

        # a probe the validator takes is no probe (e.g. a date that is now in the past)
        wide = [lit for lit in rejected if not valid(lit) and c.grammar_accepts('{"v":' + lit + "}")]
        narrow = [lit for lit in accepted if valid(lit) and not c.grammar_accepts('{"v":' + lit + "}")]
        out[name] = {"probes": len(rejected), "grammar_accepts": len(wide), "accepted": wide,
                     "valid_values": len(accepted), "grammar_refuses_valid": narrow}
    return out


# ----------------------------------------------------------------------------------------- requests
def run_one(rt, model: type[BaseModel], prompt: str, mode: str, seed: int, max_new: int | None) -> dict[str, Any]:
    """One request through the shipped path; its outcome and the output checks."""
    from dgemma_struct import api
    from dgemma_struct.errors import DgemmaStructError
    from dgemma_struct.options import GenerateOptions

    knobs = {"max_new_tokens": max_new} if max_new else {}
    opts = GenerateOptions(seed=seed, mode=mode, return_details=True, **knobs)
    t0 = time.perf_counter()
    try:
        res = api.generate(prompt, model, runtime=rt, options=opts)
        err, text, st = None, res.text, res.stats
    except DgemmaStructError as e:
        err, text, st = type(e).__name__, getattr(e, "partial_text", "") or "", getattr(e, "stats", None)
    except Exception as e:  # noqa: BLE001 - an untyped exception is a bug: recorded, the run goes on
        err, text, st = f"UNTYPED {type(e).__name__}: {str(e)[:120]}", "", None
    wall = time.perf_counter() - t0
    valid = False
    if err is None:
        try:
            model.model_validate_json(text)
            valid = True
        except ValidationError:
            pass
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    big = [n for n in number_literals(text) if number_beyond_type(n)]
    return {"mode": mode, "seed": seed, "ok": err is None and valid, "error": err, "valid": valid,
            "wall_s": round(wall, 4), "forward_passes": getattr(st, "forward_passes", 0),
            "repairs": getattr(st, "repairs", 0), "junk_repairs": getattr(st, "junk_repairs", 0),
            "fallback": bool(getattr(st, "fallback", False)),
            "big_numbers": [n[:60] for n in big], "max_number_digits": max((len(n) for n in big), default=0),
            "long_strings": len(long_strings(parsed)), "text": text[:1000]}


#: corpus tags of the rules a grammar cannot express (the issue's second GenerationFailed target): code
#: validators and ``uniqueItems``
RULE_TAGS = {"AfterValidator", "field_validator", "model_validator", "set"}


def pct(xs: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of ``xs``."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))] if s else 0.0


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Success, repairs, forwards, wall quantiles, big numbers, long strings over some request rows."""
    n = len(rows)
    walls = [r["wall_s"] for r in rows]
    return {"requests": n, "ok": sum(r["ok"] for r in rows),
            "generation_failed": sum(r["error"] == "GenerationFailed" for r in rows),
            "other_errors": sum(bool(r["error"]) and r["error"] != "GenerationFailed" for r in rows),
            "untyped": sum(str(r["error"]).startswith("UNTYPED") for r in rows),
            "repairs_mean": sum(r["repairs"] for r in rows) / n if n else 0.0,
            "repairs_median": statistics.median([r["repairs"] for r in rows]) if n else 0.0,
            "junk_repairs_mean": sum(r.get("junk_repairs", 0) for r in rows) / n if n else 0.0,
            "validation_repairs_median": statistics.median([r["repairs"] - r.get("junk_repairs", 0) for r in rows])
            if n else 0.0,
            "fallbacks": sum(r["fallback"] for r in rows),
            "forwards_median": statistics.median([r["forward_passes"] for r in rows]) if n else 0.0,
            "wall_p50_s": pct(walls, 0.5), "wall_p95_s": pct(walls, 0.95),
            "big_number_outputs": sum(bool(r["big_numbers"]) for r in rows),
            "long_string_outputs": sum(r["long_strings"] > 0 for r in rows)}


def e2e_reference() -> dict[str, Any]:
    """Today's repairs per request of the existing JSON benchmark (docs/results/e2e.json)."""
    path = ROOT / "docs/results/e2e.json"
    if not path.exists():
        return {}
    s = json.loads(path.read_text())["json"]["summary"]
    return {arm: {"repairs_mean": s[arm]["repairs_mean"], "repair_rate": s[arm]["repair_rate"],
                  "repairs_median": 0 if s[arm]["repair_rate"] < 0.5 else None} for arm in ("diffusion+c", "ar+c")}


# ----------------------------------------------------------------------------------------- markdown
def same_requests(before: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """``before`` cut to the (model, mode, seed) requests ``now`` has, its summary recomputed: the two
    summary rows then count the same requests."""
    have = {(name, r["mode"], r["seed"]) for name, mdl in now["models"].items() for r in mdl["requests"]}
    models = {name: {**mdl, "requests": [r for r in mdl["requests"] if (name, r["mode"], r["seed"]) in have]}
              for name, mdl in before["models"].items()}
    every = [r for mdl in models.values() for r in mdl["requests"]]
    return {**before, "models": models,
            "summary": {mode: summarise([r for r in every if r["mode"] == mode]) for mode in now["summary"]}}


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Results of runs over parts of the corpus or of the modes (run side by side) as one result."""
    res = json.loads(json.dumps(parts[0]))
    for part in parts[1:]:
        for name, mdl in part["models"].items():
            res["models"].setdefault(name, {"types": mdl["types"], "requests": []})["requests"] += mdl["requests"]
        res["meta"]["modes"] += [mo for mo in part["meta"]["modes"] if mo not in res["meta"]["modes"]]
        res["meta"]["run_s"] = max(res["meta"]["run_s"], part["meta"]["run_s"])
    res["meta"]["models"] = len(res["models"])
    every = [r for mdl in res["models"].values() for r in mdl["requests"]]
    res["summary"] = {mode: summarise([r for r in every if r["mode"] == mode]) for mode in res["meta"]["modes"]}
    return res


def markdown(res: dict[str, Any], before: dict[str, Any] | None) -> str:
    m = res["meta"]
    before = same_requests(before, res) if before else None
    lines = ["# Typed pydantic models (dgemma-struct-embedded)", "",
             f"{m['models']} models of `benchmarks/typed_corpus.py`, modes {', '.join(m['modes'])}, seeds "
             f"{m['seeds']}, default options (max_new_tokens {m['max_new_tokens'] or 'default'}). Commit "
             f"`{m['commit']}`, {m['machine']}, torch threads = 1, run time {m['run_s']:.0f} s. Success = no "
             "typed error and `Model.model_validate_json` accepts the output. Big number = an integer outside "
             "int64 or > 17 significant digits / overflow; long string = > 200 characters (both counted on every "
             "request's last text: a failed request's partial text included).", "",
             "## Summary", ""]
    head = ["run", "mode", "success", "GenerationFailed", "other typed errors", "untyped", "repairs/request (mean)",
            "repairs median", "AR fallbacks", "forwards median", "wall p50 (s)", "wall p95 (s)",
            "outputs with big numbers", "outputs with long strings"]
    lines += ["| " + " | ".join(head) + " |", "|---|---|" + "--:|" * (len(head) - 2)]
    runs = ([("before", before)] if before else []) + [("now" if before else "this run", res)]
    for label, r in runs:
        for mode, s in r["summary"].items():
            lines.append(f"| {label} | {mode} | {s['ok']}/{s['requests']} | {s['generation_failed']} | "
                         f"{s['other_errors'] - s['untyped']} | {s['untyped']} | {s['repairs_mean']:.2f} | "
                         f"{s['repairs_median']:g} | {s['fallbacks']} | {s['forwards_median']:g} | "
                         f"{s['wall_p50_s']:.2f} | {s['wall_p95_s']:.2f} | {s['big_number_outputs']} | "
                         f"{s['long_string_outputs']} |")
    if "junk_repairs_mean" in next(iter(res["summary"].values()), {}):
        lines += ["", "Repairs by cause (*now*): " + "; ".join(
            f"{mode} {s['repairs_mean'] - s['junk_repairs_mean']:.2f} validation + {s['junk_repairs_mean']:.2f} junk "
            f"per request (median of validation repairs {s['validation_repairs_median']:g})"
            for mode, s in res["summary"].items()) + ". A junk repair redoes a *valid* value whose string holds "
            "structural junk (`repair_junk`); a validation repair, a rejected one."]
    if before:
        lines += ["", f"*before*: commit `{before['meta']['commit']}` ({before['meta']['started']}), cut to the "
                  f"requests of *now* (commit `{m['commit']}`, {m['started']}); same models, modes and seeds."]
    lines += ["", "| target (issue #32) | " + " | ".join(res["summary"]) + " |", "|---|" + "---|" * len(res["summary"])]
    for label, rows in (("plain models", lambda t: not RULE_TAGS & set(t)), ("models with rules", lambda t: RULE_TAGS & set(t))):
        cells = []
        for mode in res["summary"]:
            reqs = [r for mdl in res["models"].values() if rows(mdl["types"]) for r in mdl["requests"] if r["mode"] == mode]
            gf = sum(r["error"] == "GenerationFailed" for r in reqs)
            ok = gf == 0 if label == "plain models" else gf <= 0.02 * len(reqs)
            cells.append(f"{gf} of {len(reqs)} ({100 * gf / max(1, len(reqs)):.1f}%) — **{'met' if ok else 'not met'}**")
        goal = "0" if label == "plain models" else "≤ 2%"
        lines.append(f"| {goal} GenerationFailed on {label} | " + " | ".join(cells) + " |")
    for label, key in (("0 outputs with big number literals", "big_number_outputs"),
                       ("0 outputs with strings > 200 chars", "long_string_outputs")):
        cells = [f"{s[key]} — **{'met' if s[key] == 0 else 'not met'}**" for s in res["summary"].values()]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    same = {mode: sum(len({r["text"] for r in mdl["requests"] if r["mode"] == mode}) == 1
                      for mdl in res["models"].values()) for mode in res["summary"]}
    lines += ["", "Models whose seeds all gave the same text: " + ", ".join(
        f"{mode} {n}/{len(res['models'])}" for mode, n in same.items())
        + " (AR at the default temperature is greedy: its seeds repeat one request)."]
    ref = res.get("e2e_reference") or {}
    if ref:
        lines += ["", "For comparison, the family JSON benchmark (docs/results/e2e.json): repairs per request "
                  + ", ".join(f"{arm} mean {v['repairs_mean']:.2f} / median {v['repairs_median']} "
                              f"({100 * v['repair_rate']:.0f}% repaired)" for arm, v in ref.items()) + "."]
    lines += ["", "## Grammar-width probes (values the validator rejects that the grammar accepts, and valid values it refuses)", ""]
    bp = (before or {}).get("probes", {})
    head = (["type", "probes"] + (["grammar accepts (before)"] if before else [])
            + ["grammar accepts", "accepted", "valid values the grammar refuses"])
    lines += ["| " + " | ".join(head) + " |", "|---|" + "--:|" * (len(head) - 3) + "---|---|"]
    for name, p in res["probes"].items():
        cells = [name, str(p["probes"])]
        if before:
            cells.append(str(bp.get(name, {}).get("grammar_accepts", "—")))
        cells += [str(p.get("grammar_accepts", "compile error")),
                  " ".join(f"`{a}`" for a in p.get("accepted", [])) or p.get("compile_error", ""),
                  " ".join(f"`{a}`" for a in p.get("grammar_refuses_valid", []))]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Per model", "", "| model | types | mode | " + ("success (before) | " if before else "")
              + "success | repairs/request | forwards median | wall p50 (s) | big numbers | long strings |",
              "|---|---|---|" + ("--:|" if before else "") + "--:|--:|--:|--:|--:|--:|"]
    bm = (before or {}).get("models", {})
    for name, mdl in res["models"].items():
        for mode in m["modes"]:
            s = summarise([r for r in mdl["requests"] if r["mode"] == mode])
            bcell = ""
            if before:
                brows = [r for r in bm.get(name, {}).get("requests", []) if r["mode"] == mode]
                bcell = f" {sum(r['ok'] for r in brows)}/{len(brows)} |" if brows else " — |"
            lines.append(f"| {name} | {', '.join(mdl['types'])} | {mode} |{bcell} {s['ok']}/{s['requests']} | "
                         f"{s['repairs_mean']:.2f} | {s['forwards_median']:g} | {s['wall_p50_s']:.2f} | "
                         f"{s['big_number_outputs']} | {s['long_string_outputs']} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--modes", default="diffusion,ar")
    ap.add_argument("--cases", default="", help="comma-separated corpus names (default: all)")
    ap.add_argument("--max-new-tokens", type=int, default=0, help="0: the default option")
    ap.add_argument("--out", default=str(ROOT / "docs/results/typed_models"))
    ap.add_argument("--before", default="", help="a previous results json to compare with")
    ap.add_argument("--commit", default="", help="the commit measured (default: git HEAD of this checkout)")
    ap.add_argument("--render", default="", help="no run: merge these comma-separated results jsons into <out>.json and write <out>.md")
    args = ap.parse_args(argv)
    before = json.loads(Path(args.before).read_text()) if args.before else None
    if args.render:
        write_results(merge([json.loads(Path(f).read_text()) for f in args.render.split(",")]), args.out,
                      lambda r: markdown(r, before))
        return 0

    import torch

    from dgemma_struct.runtime import DiffusionRuntime

    torch.set_num_threads(1)
    t_start = time.perf_counter()
    rt = DiffusionRuntime.default()
    want = {c for c in args.cases.split(",") if c}
    cases = [c for c in CORPUS if not want or c.name in want]
    modes = args.modes.split(",")
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    res: dict[str, Any] = {"meta": {"models": len(cases), "modes": modes, "seeds": args.seeds, "commit": commit,
                                    "max_new_tokens": args.max_new_tokens or None,
                                    "machine": f"{platform.machine()} CPU", "run_s": 0.0,
                                    "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                           "e2e_reference": e2e_reference(), "probes": run_probes(rt), "models": {}, "summary": {}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for case in cases:
        reqs = [run_one(rt, case.model, case.prompt, mode, seed, args.max_new_tokens or None)
                for mode in modes for seed in range(args.seeds)]
        res["models"][case.name] = {"types": list(case.types), "requests": reqs}
        every = [r for mdl in res["models"].values() for r in mdl["requests"]]
        res["summary"] = {mode: summarise([r for r in every if r["mode"] == mode]) for mode in modes}
        res["meta"]["run_s"] = time.perf_counter() - t_start
        Path(f"{out}.json").write_text(json.dumps(res, indent=1, default=str))
        print(case.name, [(r["mode"], r["ok"], r["error"], r["repairs"], r["wall_s"]) for r in reqs], flush=True)
    write_results(res, out, lambda r: markdown(r, before))
    return 0


if __name__ == "__main__":
    sys.exit(main())
