"""JSONSchemaBench soundness / coverage of dgemma_struct.constraints.

For every subset of /work/shared/data/jsonschemabench (or --data):
* compile coverage: compile_constraint(schema) succeeded / total, failures bucketed by error type;
  also how many compile with llguidance ALONE (no relaxation; strict default options);
* invalid instances accepted by Constraint.matches() (must be 0; label disputes from the data
  README are investigated: each accepted invalid instance is re-checked with jsonschema);
* valid instances rejected, bucketed (grammar vs validator, and the grammar reasons).

Instances are serialised compactly (``json.dumps(separators=(",", ":"), ensure_ascii=False)``)
with object keys reordered into SCHEMA property order (``properties`` order, following local
``$ref``/allOf/anyOf/oneOf; keys not listed keep their order, after the listed ones).

Tokenizer: the small byte-level BPE used by the tests (trained on the fly), because mask
compilation cost is what the tokenizer affects and coverage/soundness do not depend on it.
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "constraints"))

import llguidance as llg  # noqa: E402

from dgemma_struct.constraints import compile_constraint  # noqa: E402
from dgemma_struct.constraints.json_schema import make_validator  # noqa: E402
from dgemma_struct.errors import DgemmaStructError  # noqa: E402


def resolve(root, s, depth=0):
    if depth > 20 or not isinstance(s, dict):
        return s
    ref = s.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        cur = root
        for part in ref[1:].split("/")[1:]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(cur, dict) and part in cur:
                cur = cur[part]
            elif isinstance(cur, list) and part.isdigit():
                cur = cur[int(part)]
            else:
                return s
        return resolve(root, cur, depth + 1)
    return s


def prop_order(root, s, depth=0):
    s = resolve(root, s)
    if not isinstance(s, dict) or depth > 20:
        return {}
    out = {}
    for k, v in (s.get("properties") or {}).items():
        out.setdefault(k, v)
    for kw in ("allOf", "anyOf", "oneOf"):
        for sub in s.get(kw) or []:
            for k, v in prop_order(root, sub, depth + 1).items():
                out.setdefault(k, v)
    return out


def reorder(root, s, x, depth=0):
    if depth > 60:
        return x
    s = resolve(root, s)
    if isinstance(x, dict):
        props = prop_order(root, s)
        keys = [k for k in props if k in x] + [k for k in x if k not in props]
        addl = s.get("additionalProperties") if isinstance(s, dict) else None
        return {k: reorder(root, props.get(k, addl if isinstance(addl, dict) else {}), x[k], depth + 1) for k in keys}
    if isinstance(x, list):
        items = s.get("items") if isinstance(s, dict) else None
        prefix = s.get("prefixItems") if isinstance(s, dict) else None
        out = []
        for i, v in enumerate(x):
            sub = prefix[i] if isinstance(prefix, list) and i < len(prefix) else (
                items[i] if isinstance(items, list) and i < len(items) else (items if isinstance(items, dict) else {}))
            out.append(reorder(root, sub, v, depth + 1))
        return out
    return x


def serialise(schema, inst):
    return json.dumps(reorder(schema, schema, inst), separators=(",", ":"), ensure_ascii=False)


def err_bucket(e: Exception) -> str:
    msg = str(e)
    name = type(e).__name__
    for pat, label in [(r"invalid JSON Schema", "invalid schema (metaschema)"), (r"dangling", "dangling $ref"),
                       (r"remote \$ref", "remote $ref"), (r"nsatisfiable", "unsatisfiable"),
                       (r"limit", "compile limits"), (r"strict", "strict")]:
        if re.search(pat, msg):
            return f"{name}: {label}"
    return f"{name}: {msg.splitlines()[0][:90]}"


def grammar_reason(text: str) -> str:
    if re.search(r"\d[eE][+-]?\d", text):
        return "number exponent formatting"
    if "\\u" in text:
        return "unicode escapes"
    return "other grammar rejection"


def llg_alone(schema, lltok) -> bool:
    try:
        g = llg.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        return not llg.LLMatcher.validate_grammar(g, lltok)
    except Exception:
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(ROOT / ".." / "shared" / "data" / "jsonschemabench"))
    ap.add_argument("--max-schemas", type=int, default=0, help="per subset; 0 = all")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "soundness"))
    args = ap.parse_args()
    from conftest import make_tokenizer
    tok = make_tokenizer()
    lltok = compile_constraint({"type": "integer"}, tokenizer=tok).tokenizer_info.lltok
    files = sorted(Path(args.data).glob("*.jsonl.gz"))
    results = {"tokenizer": f"small byte-level BPE ({len(tok)} tokens, trained on the fly)",
               "serialisation": "compact json.dumps(separators=(',',':'), ensure_ascii=False), keys in schema property order",
               "subsets": {}, "sampled": bool(args.max_schemas)}
    t_all = time.time()
    for f in files:
        subset = f.name[: -len(".jsonl.gz")]
        recs = [json.loads(line) for line in gzip.open(f, "rt")]
        if args.max_schemas:
            recs = recs[: args.max_schemas]
        st = dict(schemas=len(recs), compiled=0, llg_alone=0, compile_fail=collections.Counter(),
                  valid=0, valid_accepted=0, invalid=0, invalid_rejected=0, invalid_accepted=[],
                  valid_rejected=collections.Counter(), valid_rejected_examples=[], semantic=collections.Counter(),
                  compile_s=0.0)
        t0 = time.time()
        for r in recs:
            schema = r["schema"]
            st["llg_alone"] += llg_alone(schema, lltok)
            tc = time.time()
            try:
                c = compile_constraint(schema, tokenizer=tok, use_cache=False)
            except DgemmaStructError as e:
                st["compile_fail"][err_bucket(e)] += 1
                st["compile_s"] += time.time() - tc
                continue
            except Exception as e:  # noqa: BLE001 - report, never crash the benchmark
                st["compile_fail"][f"UNTYPED {type(e).__name__}: {str(e)[:80]}"] += 1
                continue
            st["compile_s"] += time.time() - tc
            st["compiled"] += 1
            for kw in c.semantic_keywords:
                st["semantic"][kw] += 1
            for t in r.get("tests", []):
                text = serialise(schema, t["data"])
                try:
                    ok = c.matches(text)
                except DgemmaStructError as e:
                    ok = False
                    gram = f"error {type(e).__name__}"
                if t["valid"]:
                    st["valid"] += 1
                    if ok:
                        st["valid_accepted"] += 1
                    else:
                        g_ok = c.grammar_accepts(text)
                        if not g_ok:
                            reason = "grammar: " + grammar_reason(text)
                        else:
                            reason = "validator disagrees with the label"
                        st["valid_rejected"][reason] += 1
                        if len(st["valid_rejected_examples"]) < 5:
                            st["valid_rejected_examples"].append({"id": r["id"], "reason": reason, "text": text[:200]})
                else:
                    st["invalid"] += 1
                    if ok:
                        v = make_validator(schema)
                        st["invalid_accepted"].append({
                            "id": r["id"], "description": t.get("description", "")[:120], "text": text[:300],
                            "jsonschema_errors": [e.message[:120] for e in v.iter_errors(t["data"])],
                            "python_error": t.get("python_error"), "rust_error": t.get("rust_error")})
                    else:
                        st["invalid_rejected"] += 1
        st["seconds"] = round(time.time() - t0, 1)
        st["compile_s"] = round(st["compile_s"], 1)
        st["compile_fail"] = dict(st["compile_fail"].most_common())
        st["valid_rejected"] = dict(st["valid_rejected"])
        st["semantic"] = dict(st["semantic"].most_common())
        results["subsets"][subset] = st
        print(f"{subset:24s} compiled {st['compiled']}/{st['schemas']} (llg alone {st['llg_alone']}) "
              f"valid acc {st['valid_accepted']}/{st['valid']} invalid acc {len(st['invalid_accepted'])}/{st['invalid']} "
              f"{st['seconds']}s", flush=True)
    tot = collections.Counter()
    for st in results["subsets"].values():
        for k in ("schemas", "compiled", "llg_alone", "valid", "valid_accepted", "invalid", "invalid_rejected"):
            tot[k] += st[k]
        tot["invalid_accepted"] += len(st["invalid_accepted"])
    results["total"] = dict(tot)
    results["seconds"] = round(time.time() - t_all, 1)
    Path(args.out + ".json").write_text(json.dumps(results, indent=1, ensure_ascii=False))
    write_md(results, Path(args.out + ".md"))


def write_md(res, path):
    L = ["# JSONSchemaBench soundness and coverage", "",
         f"Tokenizer: {res['tokenizer']}. Serialisation: {res['serialisation']}. "
         f"{'SAMPLED (first N schemas per subset).' if res['sampled'] else 'All schemas, all instances.'} "
         f"Run time {res['seconds']} s.", "",
         "| subset | schemas | compiled | llguidance alone | valid accepted | invalid accepted | invalid rejected |",
         "|---|--:|--:|--:|--:|--:|--:|"]
    for name, st in res["subsets"].items():
        L.append(f"| {name} | {st['schemas']} | {st['compiled']} ({100 * st['compiled'] / max(1, st['schemas']):.1f}%) "
                 f"| {st['llg_alone']} | {st['valid_accepted']}/{st['valid']} | {len(st['invalid_accepted'])} "
                 f"| {st['invalid_rejected']}/{st['invalid']} |")
    t = res["total"]
    L.append(f"| **total** | {t['schemas']} | {t['compiled']} ({100 * t['compiled'] / max(1, t['schemas']):.1f}%) "
             f"| {t['llg_alone']} ({100 * t['llg_alone'] / max(1, t['schemas']):.1f}%) | {t['valid_accepted']}/{t['valid']} "
             f"| {t['invalid_accepted']} | {t['invalid_rejected']}/{t['invalid']} |")
    L += ["", "## Compile failures (bucketed)", ""]
    fails = collections.Counter()
    for st in res["subsets"].values():
        fails.update(st["compile_fail"])
    for k, v in fails.most_common(25):
        L.append(f"- {v}: {k}")
    L += ["", "## Valid instances rejected (bucketed)", ""]
    vr = collections.Counter()
    for st in res["subsets"].values():
        vr.update(st["valid_rejected"])
    for k, v in vr.most_common():
        L.append(f"- {v}: {k}")
    L += ["", "## Keywords moved to validation (schemas using them)", ""]
    sem = collections.Counter()
    for st in res["subsets"].values():
        sem.update(st["semantic"])
    L.append(", ".join(f"{k} ({v})" for k, v in sem.most_common()))
    L += ["", "## Invalid-labelled instances accepted", ""]
    n = 0
    for st in res["subsets"].values():
        for a in st["invalid_accepted"]:
            n += 1
            if n <= 40:
                L.append(f"- `{a['id']}`: {a['description']} -> jsonschema errors: {a['jsonschema_errors'] or 'none (label dispute)'}")
    if n == 0:
        L.append("None.")
    path.write_text("\n".join(L) + "\n")


if __name__ == "__main__":
    main()
