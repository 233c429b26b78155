"""JSONSchemaBench generation: constrained generation against real-world schemas with the
embedded model.

For a deterministic sample of schemas per subset of ``/work/shared/data/jsonschemabench``
(``--per-subset``, default 10), the model is prompted with
``"Return a JSON object matching this schema: <compact schema, truncated>"`` and
``generate(prompt, schema, max_new_tokens=256, timeout_s=...)`` is called. Per subset:

* compiled   ``constraint_for(schema)`` succeeded (failures are typed ``SchemaError`` etc.);
* generated  a value came back (no typed error);
* valid      an independent ``jsonschema`` validator (format checker on) accepts the value;
* typed-error breakdown, untyped exceptions (bugs), mean wall time per request.

The goal: every generated value valid (100%) and every failure a typed error.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/jsonschemabench_generation.py               # 10 per subset
    OMP_NUM_THREADS=1 python benchmarks/jsonschemabench_generation.py --tiny --per-subset 2 --out /tmp/jsb
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import jsonschema  # noqa: E402
import torch  # noqa: E402

from dgemma_struct import api  # noqa: E402
from dgemma_struct.errors import DgemmaStructError  # noqa: E402
from dgemma_struct.runtime import DiffusionRuntime  # noqa: E402

PROMPT = "Return a JSON object matching this schema: {}"


def independent_valid(schema, value) -> tuple[bool, str]:
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        errs = list(cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(value))
    except Exception as e:  # noqa: BLE001 - e.g. unresolvable $ref: the independent check cannot decide
        return False, f"validator could not run: {type(e).__name__}: {str(e)[:100]}"
    return (not errs), ("" if not errs else errs[0].message[:160])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(ROOT / ".." / "shared" / "data" / "jsonschemabench"))
    ap.add_argument("--per-subset", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0, help="schema sampling seed")
    ap.add_argument("--gen-seed", type=int, default=0, help="generation seed")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=10.0, help="timeout_s per request")
    ap.add_argument("--schema-chars", type=int, default=800, help="truncate the schema text in the prompt")
    ap.add_argument("--subsets", default="", help="comma-separated subset names (default: all)")
    ap.add_argument("--tiny", action="store_true", help="random tiny runtime (development)")
    ap.add_argument("--no-close-on-budget", dest="close_on_budget", action="store_false",
                    help="turn budget-aware closing off (for an A/B of it)")
    ap.add_argument("--model", default=None, help="checkpoint directory (default: the embedded model)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "jsb_generation"))
    args = ap.parse_args()

    t_start = time.time()
    log = lambda m: print(f"[{time.time() - t_start:7.1f}s] {m}", flush=True)  # noqa: E731
    if args.tiny:
        from e2e_constrained import tiny_runtime
        rt = tiny_runtime()
    elif args.model:
        rt = DiffusionRuntime.from_pretrained(args.model)
    else:
        rt = DiffusionRuntime.default()
    rt.generate("warm up", max_new_tokens=8, seed=0)
    log(f"runtime {rt.name}, context {rt.max_context}, canvas {rt.model.config.canvas_length}")

    files = sorted(Path(args.data).glob("*.jsonl.gz"))
    wanted = {s for s in args.subsets.split(",") if s}
    results = {"meta": {"model": rt.name, "close_on_budget": args.close_on_budget,
                        "per_subset": args.per_subset, "seed": args.seed,
                        "gen_seed": args.gen_seed, "max_new_tokens": args.max_new_tokens, "timeout_s": args.timeout,
                        "schema_chars": args.schema_chars, "prompt": PROMPT.format("<compact schema, truncated>"),
                        "threads": torch.get_num_threads(), "machine": f"{platform.machine()} CPU",
                        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
               "subsets": {}, "failures": [], "untyped": [], "invalid_values": []}
    for f in files:
        subset = f.name[: -len(".jsonl.gz")]
        if wanted and subset not in wanted:
            continue
        recs = [json.loads(line) for line in gzip.open(f, "rt")]
        recs = random.Random(f"{args.seed}:{subset}").sample(recs, min(args.per_subset, len(recs)))
        st = {"sampled": len(recs), "compiled": 0, "generated": 0, "valid": 0, "compile_errors": collections.Counter(),
              "typed_errors": collections.Counter(), "untyped_errors": 0, "wall_s": [], "compile_s": [],
              "tokens": [], "forward_passes": [], "repairs": 0, "fallback": 0}
        for i, r in enumerate(recs):
            schema = r["schema"]
            tc = time.perf_counter()
            try:
                api.constraint_for(schema, rt)
            except DgemmaStructError as e:
                st["compile_errors"][type(e).__name__] += 1
                results["failures"].append({"subset": subset, "id": r["id"], "stage": "compile",
                                            "error": type(e).__name__, "message": str(e)[:200]})
                continue
            except Exception as e:  # noqa: BLE001 - an untyped error is a bug; record it, keep going
                st["untyped_errors"] += 1
                results["untyped"].append({"subset": subset, "id": r["id"], "stage": "compile",
                                           "error": type(e).__name__, "message": str(e)[:300]})
                continue
            st["compile_s"].append(time.perf_counter() - tc)
            st["compiled"] += 1
            text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
            prompt = PROMPT.format(text[: args.schema_chars] + (" ..." if len(text) > args.schema_chars else ""))
            t0 = time.perf_counter()
            try:
                res = api.generate(prompt, schema, runtime=rt, max_new_tokens=args.max_new_tokens,
                                   seed=args.gen_seed + i, timeout_s=args.timeout, return_details=True,
                                   close_on_budget=args.close_on_budget)
            except DgemmaStructError as e:
                wall = time.perf_counter() - t0
                st["wall_s"].append(wall)
                st["typed_errors"][type(e).__name__] += 1
                results["failures"].append({"subset": subset, "id": r["id"], "stage": "generate",
                                            "error": type(e).__name__, "message": str(e)[:200],
                                            "wall_s": round(wall, 2)})
                log(f"{subset} {i + 1}/{len(recs)}: {type(e).__name__} ({wall:.1f}s)")
                continue
            except Exception as e:  # noqa: BLE001
                st["wall_s"].append(time.perf_counter() - t0)
                st["untyped_errors"] += 1
                results["untyped"].append({"subset": subset, "id": r["id"], "stage": "generate",
                                           "error": type(e).__name__, "message": str(e)[:300]})
                log(f"{subset} {i + 1}/{len(recs)}: UNTYPED {type(e).__name__}: {str(e)[:120]}")
                continue
            wall = time.perf_counter() - t0
            st["wall_s"].append(wall)
            st["generated"] += 1
            st["tokens"].append(len(res.token_ids))
            st["forward_passes"].append(res.stats.forward_passes)
            st["repairs"] += res.stats.repairs > 0
            st["fallback"] += bool(res.stats.fallback)
            value = res.value.model_dump() if hasattr(res.value, "model_dump") else res.value
            ok, why = independent_valid(schema, value)
            st["valid"] += ok
            if not ok:
                results["invalid_values"].append({"subset": subset, "id": r["id"], "text": res.text[:300],
                                                  "why": why})
            log(f"{subset} {i + 1}/{len(recs)}: {'valid' if ok else 'INVALID ' + why[:80]} "
                f"({len(res.token_ids)} tok, {wall:.1f}s, repairs {res.stats.repairs}, "
                f"fallback {res.stats.fallback})")
        n_req = len(st["wall_s"])
        st["mean_wall_s"] = sum(st["wall_s"]) / n_req if n_req else None
        st["mean_compile_s"] = sum(st["compile_s"]) / len(st["compile_s"]) if st["compile_s"] else None
        st["mean_tokens"] = sum(st["tokens"]) / len(st["tokens"]) if st["tokens"] else None
        st["compile_errors"] = dict(st["compile_errors"])
        st["typed_errors"] = dict(st["typed_errors"])
        for k in ("wall_s", "compile_s", "tokens", "forward_passes"):
            st[k] = [round(x, 3) for x in st[k]]
        results["subsets"][subset] = st
        log(f"== {subset}: compiled {st['compiled']}/{st['sampled']}, generated {st['generated']}, "
            f"valid {st['valid']}, typed {st['typed_errors']}, untyped {st['untyped_errors']}")
    S = results["subsets"].values()
    tot = {k: sum(s[k] for s in S) for k in ("sampled", "compiled", "generated", "valid", "untyped_errors",
                                             "repairs", "fallback")}
    te: collections.Counter = collections.Counter()
    ce: collections.Counter = collections.Counter()
    for s in S:
        te.update(s["typed_errors"])
        ce.update(s["compile_errors"])
    walls = [w for s in S for w in s["wall_s"]]
    tot.update(typed_errors=dict(te), compile_errors=dict(ce), mean_wall_s=sum(walls) / len(walls) if walls else None,
               requests=len(walls), max_wall_s=max(walls) if walls else None,
               over_timeout=sum(1 for w in walls if w > args.timeout + 1.0))
    results["total"] = tot
    results["meta"]["seconds"] = round(time.time() - t_start, 1)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str))
    write_md(results, out.with_suffix(".md"))
    log(f"total: {tot}")


def write_md(res: dict, path: Path) -> None:
    m, t = res["meta"], res["total"]
    all_valid = t["generated"] == t["valid"]
    L = [f"# JSONSchemaBench: constrained generation ({m['model']})", "",
         f"{m['per_subset']} schemas sampled per subset (seed {m['seed']}), prompt `{m['prompt']}` (schema text cut at "
         f"{m['schema_chars']} characters), `max_new_tokens={m['max_new_tokens']}`, `timeout_s={m['timeout_s']}`, "
         f"default repairs (2) and AR fallback. Validity is checked by an independent `jsonschema` validator "
         f"(format checker on). {m['machine']}, {m['threads']} torch thread(s); run time {m['seconds']:.0f} s.", "",
         f"**Generated values valid: {t['valid']}/{t['generated']}"
         f"{' (100%)' if all_valid and t['generated'] else ''}. Untyped errors: {t['untyped_errors']}.** "
         f"Every request that did not return a value raised a typed `DgemmaStructError`"
         f"{'' if t['untyped_errors'] == 0 else ' — except the untyped ones listed below (bugs)'}.", "",
         "| subset | sampled | compiled | generated | valid | typed errors | repaired | AR fallback | mean wall (s) | "
         "mean tokens |", "|---|--:|--:|--:|--:|---|--:|--:|--:|--:|"]
    for name, s in res["subsets"].items():
        errs = {**{f"compile {k}": v for k, v in s["compile_errors"].items()}, **s["typed_errors"]}
        if s["untyped_errors"]:
            errs["UNTYPED"] = s["untyped_errors"]
        L.append(f"| {name} | {s['sampled']} | {s['compiled']} | {s['generated']} | {s['valid']} | "
                 f"{', '.join(f'{k}: {v}' for k, v in errs.items()) or '—'} | {s['repairs']} | {s['fallback']} | "
                 f"{s['mean_wall_s']:.2f} | {s['mean_tokens'] or 0:.0f} |" if s["mean_wall_s"] is not None else
                 f"| {name} | {s['sampled']} | {s['compiled']} | 0 | 0 | {errs or '—'} | 0 | 0 | — | — |")
    errs = {**{f"compile {k}": v for k, v in t["compile_errors"].items()}, **t["typed_errors"]}
    L.append(f"| **total** | {t['sampled']} | {t['compiled']} | {t['generated']} | {t['valid']} | "
             f"{', '.join(f'{k}: {v}' for k, v in errs.items()) or '—'} | {t['repairs']} | {t['fallback']} | "
             f"{t['mean_wall_s'] or 0:.2f} | |")
    L += ["", f"Slowest request: {t['max_wall_s'] or 0:.1f} s; requests that ran more than 1 s past `timeout_s`: "
          f"{t['over_timeout']}.", "", "## Typed failures", ""]
    by = collections.Counter((f["stage"], f["error"], f["message"][:110]) for f in res["failures"])
    for (stage, err, msg), n in by.most_common(25):
        L.append(f"- {n} × {stage}: `{err}`: {msg}")
    if not res["failures"]:
        L.append("- none")
    if res["invalid_values"]:
        L += ["", "## Returned values that the independent validator rejects", ""]
        for v in res["invalid_values"][:20]:
            L.append(f"- {v['subset']} `{v['id']}`: {v['why']} — `{v['text'][:150]}`")
    if res["untyped"]:
        L += ["", "## Untyped exceptions (bugs)", ""]
        for u in res["untyped"][:20]:
            L.append(f"- {u['subset']} `{u['id']}` ({u['stage']}): `{u['error']}`: {u['message'][:200]}")
    L.append("")
    path.write_text("\n".join(L))


if __name__ == "__main__":
    main()
