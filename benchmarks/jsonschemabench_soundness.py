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
import copy
import gzip
import importlib.metadata
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "constraints"))

import jsonschema  # noqa: E402
import llguidance as llg  # noqa: E402

from dgemma_struct.constraints import compile_constraint  # noqa: E402
from dgemma_struct.constraints.json_schema import make_validator, missing_format_extras  # noqa: E402
from dgemma_struct.errors import DgemmaStructError  # noqa: E402


def _deref(root, ref):
    cur = root
    for part in ref[1:].split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return None
    return cur


def resolve(root, s, depth=0):
    """Follow a local ``$ref``. Sibling keywords of the ``$ref`` (2019-09+) are kept: the result
    is ``{**target, **siblings}``; llguidance merges ``properties`` in schema key order, so the
    sibling ``properties`` go first iff they are written before the ``$ref``."""
    if depth > 20 or not isinstance(s, dict):
        return s
    ref = s.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        target = _deref(root, ref)
        if target is None:
            return s
        target = resolve(root, target, depth + 1)
        siblings = {k: v for k, v in s.items() if k != "$ref"}
        if not siblings or not isinstance(target, dict):
            return target
        merged = {**target, **siblings}
        if isinstance(target.get("properties"), dict) and isinstance(siblings.get("properties"), dict):
            keys = list(s)
            first, second = (siblings, target) if keys.index("properties") < keys.index("$ref") else (target, siblings)
            merged["properties"] = {**first["properties"], **second["properties"]}
        return merged
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


def _same(a, b):
    """JSON equality (1 == 1.0, True != 1), used to find the ``const``/``enum`` member an instance equals."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b or (
        isinstance(a, (int, float)) and isinstance(b, (int, float)) and a == b)


def reorder(root, s, x, depth=0):
    """Put object keys in the order the grammar emits them: the order of the ``const``/``enum``
    member the value equals, else schema ``properties`` order (keys not listed keep their order,
    after the listed ones). :func:`serialise` then writes integral floats as ints (the grammar
    writes ``1``, not ``1.0``) where the draft says they are the same value (draft 6+)."""
    if depth > 60:
        return x
    s = resolve(root, s)
    if isinstance(s, dict) and isinstance(x, (dict, list)):
        for cand in ([s["const"]] if "const" in s else []) + (s["enum"] if isinstance(s.get("enum"), list) else []):
            if _same(cand, x):
                return cand
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


def _ints(x):
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e300:
        return int(x)
    if isinstance(x, list):
        return [_ints(v) for v in x]
    if isinstance(x, dict):
        return {k: _ints(v) for k, v in x.items()}
    return x


def _float_is_int(schema):
    """Draft 6+ counts 1.0 as an integer; draft 4 does not (then 1.0 must stay 1.0)."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls.TYPE_CHECKER.is_type(1.0, "integer")


def serialise(schema, inst):
    x = reorder(schema, schema, inst)
    if _float_is_int(schema):
        x = _ints(x)
    return json.dumps(x, separators=(",", ":"), ensure_ascii=False)


def variants(schema, inst):
    """Serialisations of the same JSON value, tried in order: schema property order (what a model
    steered by the grammar writes for single-branch schemas), then the instance's own key order
    (right when ``oneOf``/``anyOf`` branches order properties differently; the serialiser cannot
    know the branch), then ``\\u`` escapes. An instance counts as accepted when ANY serialisation
    of its value is accepted: for valid instances that is "the constraint allows this value", and
    for invalid instances it makes the soundness check stricter, never weaker."""
    first = serialise(schema, inst)
    yield "schema order", first
    seen = {first}
    inst = _ints(inst) if _float_is_int(schema) else inst
    for name, v in (("instance order", json.dumps(inst, separators=(",", ":"), ensure_ascii=False)),
                    ("ascii escapes", json.dumps(json.loads(first), separators=(",", ":"), ensure_ascii=True))):
        if v not in seen:
            seen.add(v)
            yield name, v


def match_any(c, schema, inst):
    """(accepted, text, variant) over :func:`variants`; validation runs once the grammar accepts."""
    first = None
    for name, text in variants(schema, inst):
        first = first or text
        if c.grammar_accepts(text):
            return c.validate_text(text).ok, text, name
    return False, first, None


def err_bucket(e: Exception) -> str:
    msg = str(e)
    name = type(e).__name__
    for pat, label in [(r"invalid JSON Schema", "invalid schema (metaschema)"), (r"dangling", "dangling $ref"),
                       (r"remote \$ref", "remote $ref"), (r"nsatisfiable", "unsatisfiable"),
                       (r"limit", "compile limits"), (r"strict", "strict")]:
        if re.search(pat, msg):
            return f"{name}: {label}"
    return f"{name}: {msg.splitlines()[0][:90]}"


# keyword groups removed (one group at a time, from every subschema) to find which one makes the
# grammar reject a valid instance; first match names the bucket
_ABLATIONS = [
    ("format", ("format",)),
    ("pattern", ("pattern",)),
    ("additionalProperties/unevaluatedProperties", ("additionalProperties", "unevaluatedProperties")),
    ("minLength/maxLength", ("minLength", "maxLength")),
    ("numeric bounds", ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")),
    ("minItems/maxItems", ("minItems", "maxItems")),
    ("minProperties/maxProperties", ("minProperties", "maxProperties")),
    ("required", ("required",)),
    ("enum/const", ("enum", "const")),
    ("type", ("type",)),
]


def _ablate(schema, keys):
    from dgemma_struct.constraints.schema_checks import iter_subschemas as _walk
    g = copy.deepcopy(schema)
    for _, sub in _walk(g):
        for k in keys:
            sub.pop(k, None)
    return g


def _first_format(schema, data):
    """(format name, value) of the first string in ``data`` under a ``format`` subschema (best effort)."""
    from dgemma_struct.constraints.schema_checks import iter_subschemas as _walk
    fmts = {sub["format"] for _, sub in _walk(schema) if isinstance(sub.get("format"), str)}
    return sorted(fmts)


def classify_valid_rejected(c, schema, data, text, tok):
    """Why does ``c.matches`` reject a valid-labelled instance? Returns (bucket, detail)."""
    if c.grammar_accepts(text):
        v = make_validator(schema)
        errs = list(v.iter_errors(data))
        kws = sorted({e.validator for e in errs})
        if kws == ["format"]:
            return ("validator: format asserted (upstream checker lenient)",
                    "; ".join(e.message[:80] for e in errs[:2]))
        return f"validator: {'/'.join(kws) or '?'}", "; ".join(e.message[:80] for e in errs[:2])
    for name, variant in [("whitespace", json.dumps(json.loads(text), ensure_ascii=False))]:
        if c.grammar_accepts(variant):
            return "serialisation: " + name, variant[:120]
    if re.search(r"\d[eE][+-]?\d", text):
        plain = re.sub(r"(-?\d+(?:\.\d+)?[eE][+-]?\d+)", lambda m: format(float(m.group(1)), "f"), text)
        try:
            if c.grammar_accepts(plain):
                return "serialisation: number exponent formatting", plain[:120]
        except Exception:
            pass
    for name, keys in _ABLATIONS:
        try:
            g = compile_constraint(_ablate(schema, keys), tokenizer=tok, use_cache=False)
        except Exception:
            continue
        if g.grammar_accepts(text):
            if name == "format":
                return "grammar: llguidance format regex stricter than the label", ", ".join(_first_format(schema, data))
            return f"grammar: {name}", ""
    return "grammar: other", ""


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
    # label disputes documented by the data README (``_validation_report.json``: invalid-labelled
    # instances that python jsonschema 4.26 + format-nongpl accepts); reported apart, never hidden
    rep = Path(args.data) / "_validation_report.json"
    disputes = {(d["id"], d["test_index"]) for d in json.loads(rep.read_text())["label_disagreements"]
                if not d["label_valid"]} if rep.exists() else set()
    missing = missing_format_extras()
    if missing:
        print(f"WARNING: jsonschema[format-nongpl] modules missing: {missing}; format checks are lenient",
              file=sys.stderr)
    results = {"tokenizer": f"small byte-level BPE ({len(tok)} tokens, trained on the fly)",
               "serialisation": "compact json.dumps(separators=(',',':'), ensure_ascii=False), integral floats as ints, keys in "
                                "schema property order (const/enum member order; $ref siblings merged), falling back to "
                                "instance key order and then \\u escapes (accepted if any serialisation is)",
               "format_extras_missing": missing,
               "jsonschema": importlib.metadata.version("jsonschema"),
               "llguidance": importlib.metadata.version("llguidance"),
               "subsets": {}, "sampled": bool(args.max_schemas)}
    t_all = time.time()
    for f in files:
        subset = f.name[: -len(".jsonl.gz")]
        recs = [json.loads(line) for line in gzip.open(f, "rt")]
        if args.max_schemas:
            recs = recs[: args.max_schemas]
        st = dict(schemas=len(recs), compiled=0, llg_alone=0, compile_fail=collections.Counter(),
                  valid=0, valid_accepted=0, invalid=0, invalid_rejected=0, invalid_accepted=[],
                  invalid_accepted_disputed=[], accepted_via=collections.Counter(),
                  valid_rejected=collections.Counter(), valid_rejected_list=[], semantic=collections.Counter(),
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
            for ti, t in enumerate(r.get("tests", [])):
                try:
                    ok, text, how = match_any(c, schema, t["data"])
                except DgemmaStructError:
                    ok, text, how = False, serialise(schema, t["data"]), None
                if t["valid"]:
                    st["valid"] += 1
                    if ok:
                        st["valid_accepted"] += 1
                        st["accepted_via"][how] += 1
                    else:
                        reason, detail = classify_valid_rejected(c, schema, t["data"], text, tok)
                        st["valid_rejected"][reason] += 1
                        st["valid_rejected_list"].append({"id": r["id"], "test": ti, "reason": reason,
                                                          "detail": detail, "text": text[:200]})
                else:
                    st["invalid"] += 1
                    if ok:
                        v = make_validator(schema)
                        rec = {"id": r["id"], "test": ti, "description": t.get("description", "")[:120],
                               "text": text[:300],
                               "jsonschema_errors": [e.message[:120] for e in v.iter_errors(t["data"])],
                               "python_error": (t.get("python_error") or "")[:300],
                               "rust_error": (t.get("rust_error") or "")[:300],
                               "documented_dispute": (r["id"], ti) in disputes}
                        st["invalid_accepted" if not rec["documented_dispute"] else "invalid_accepted_disputed"].append(rec)
                    else:
                        st["invalid_rejected"] += 1
        st["seconds"] = round(time.time() - t0, 1)
        st["compile_s"] = round(st["compile_s"], 1)
        st["compile_fail"] = dict(st["compile_fail"].most_common())
        st["valid_rejected"] = dict(st["valid_rejected"])
        st["accepted_via"] = dict(st["accepted_via"])
        st["semantic"] = dict(st["semantic"].most_common())
        results["subsets"][subset] = st
        print(f"{subset:24s} compiled {st['compiled']}/{st['schemas']} (llg alone {st['llg_alone']}) "
              f"valid acc {st['valid_accepted']}/{st['valid']} invalid acc {len(st['invalid_accepted'])}"
              f"(+{len(st['invalid_accepted_disputed'])} disputed)/{st['invalid']} "
              f"{st['seconds']}s", flush=True)
    tot = collections.Counter()
    for st in results["subsets"].values():
        for k in ("schemas", "compiled", "llg_alone", "valid", "valid_accepted", "invalid", "invalid_rejected"):
            tot[k] += st[k]
        tot["invalid_accepted"] += len(st["invalid_accepted"])
        tot["invalid_accepted_disputed"] += len(st["invalid_accepted_disputed"])
    results["total"] = dict(tot)
    results["seconds"] = round(time.time() - t_all, 1)
    Path(args.out + ".json").write_text(json.dumps(results, indent=1, ensure_ascii=False))
    write_md(results, Path(args.out + ".md"))


BUCKET_NOTES = {
    "grammar: llguidance format regex stricter than the label":
        "llguidance compiles `format` (date-time, date, time, email, hostname, ipv4, ipv6, uri, uuid, "
        "duration) to its own regexes, stricter than the label's checker for some values. Grammar "
        "limitation; it narrows the accepted set, never a soundness problem.",
    "grammar: pattern":
        "llguidance's regex engine (derivative-based, RE2-like syntax, pattern matched as a search) "
        "disagrees with Python `re` on this pattern (e.g. Github_easy/o21053: `^$|(^(?:\\S+\\s+){0,99}\\S+$)`). "
        "Grammar limitation.",
    "grammar: additionalProperties/unevaluatedProperties":
        "`additionalProperties: false` combined with `allOf`/`anyOf`/`oneOf`/`$ref` that contribute "
        "properties: llguidance intersects/closes the object differently from JSON Schema. Grammar limitation.",
    "grammar: minProperties/maxProperties":
        "llguidance counts only additional properties towards minProperties (fixed for plain objects by "
        "dropping minProperties from the grammar copy; remaining cases sit under allOf/anyOf/$ref).",
    "grammar: minLength/maxLength": "llguidance string-length grammar rejects the value. Grammar limitation.",
    "grammar: numeric bounds": "llguidance number-range grammar rejects the value. Grammar limitation.",
    "grammar: minItems/maxItems": "llguidance array-length grammar rejects the value. Grammar limitation.",
    "grammar: enum/const": "llguidance enum/const handling (usually combined with anyOf/oneOf branches) "
        "rejects the value. Grammar limitation.",
    "grammar: required": "llguidance required + anyOf/allOf intersection rejects the object. Grammar limitation.",
    "grammar: type": "llguidance type handling in recursive/oneOf schemas (e.g. Github_easy/o83258: "
        "`children` is string | element | array of elements, with `additionalProperties: false`). "
        "Grammar limitation.",
    "grammar: other": "not explained by removing one keyword group (several interact); see "
        "`valid_rejected_list` in soundness.json.",
    "validator: format asserted (upstream checker lenient)":
        "our format checker (format-nongpl; 2020-12 formats asserted for every draft) rejects a value "
        "the upstream label generator accepted. Validator disagreement.",
    "serialisation: number exponent formatting": "Python writes `1e-05`; the grammar accepts the plain form.",
    "serialisation: whitespace": "the grammar wants spaces after separators.",
}


def write_md(res, path):
    t = res["total"]
    L = ["# JSONSchemaBench soundness and coverage", "",
         f"Tokenizer: {res['tokenizer']}. Serialisation: {res['serialisation']}. "
         f"{'SAMPLED (first N schemas per subset).' if res['sampled'] else 'All schemas, all instances.'} "
         f"jsonschema {res.get('jsonschema')} (format-nongpl extras missing: {res.get('format_extras_missing') or 'none'}), "
         f"llguidance {res.get('llguidance')}. Run time {res['seconds']} s (one core).", "",
         f"**Invalid-labelled instances accepted: {t['invalid_accepted']}** "
         f"(plus {t.get('invalid_accepted_disputed', 0)} documented label disputes, listed below).", "",
         "| subset | schemas | compiled | llguidance alone | valid accepted | invalid accepted | disputed accepted | invalid rejected |",
         "|---|--:|--:|--:|--:|--:|--:|--:|"]
    for name, st in res["subsets"].items():
        L.append(f"| {name} | {st['schemas']} | {st['compiled']} ({100 * st['compiled'] / max(1, st['schemas']):.1f}%) "
                 f"| {st['llg_alone']} | {st['valid_accepted']}/{st['valid']} | {len(st['invalid_accepted'])} "
                 f"| {len(st['invalid_accepted_disputed'])} | {st['invalid_rejected']}/{st['invalid']} |")
    L.append(f"| **total** | {t['schemas']} | {t['compiled']} ({100 * t['compiled'] / max(1, t['schemas']):.1f}%) "
             f"| {t['llg_alone']} ({100 * t['llg_alone'] / max(1, t['schemas']):.1f}%) | {t['valid_accepted']}/{t['valid']} "
             f"| {t['invalid_accepted']} | {t.get('invalid_accepted_disputed', 0)} | {t['invalid_rejected']}/{t['invalid']} |")
    L += ["", "## Compile failures (bucketed)", ""]
    fails = collections.Counter()
    for st in res["subsets"].values():
        fails.update(st["compile_fail"])
    for k, v in fails.most_common(25):
        L.append(f"- {v}: {k}")
    L += ["", "## Valid instances rejected (bucketed)", "",
          "Bucketing (`classify_valid_rejected`): if the grammar accepts the text the validator rejected it "
          "(bucket = failing jsonschema keyword); otherwise serialisation variants are tried (instance key "
          "order, `\\u` escapes, spaces, plain numbers) and then keyword groups are removed from the schema "
          "one at a time; the first group whose removal makes the grammar accept names the bucket.", "",
          "| count | bucket | example (id #test: text / detail) | explanation |", "|--:|---|---|---|"]
    vr = collections.Counter()
    ex = {}
    for st in res["subsets"].values():
        vr.update(st["valid_rejected"])
        for e in st["valid_rejected_list"]:
            ex.setdefault(e["reason"], e)
    for k, v in vr.most_common():
        e = ex.get(k, {})
        txt = (e.get("text", "")[:90] + (f" / {e['detail'][:80]}" if e.get("detail") else "")).replace("|", "\\|")
        L.append(f"| {v} | {k} | `{e.get('id')}` #{e.get('test')}: `{txt}` | {BUCKET_NOTES.get(k, '')} |")
    L += ["", "## Keywords moved to validation (schemas using them)", ""]
    sem = collections.Counter()
    for st in res["subsets"].values():
        sem.update(st["semantic"])
    L.append(", ".join(f"{k} ({v})" for k, v in sem.most_common()))
    for key, title in (("invalid_accepted", "Invalid-labelled instances accepted (undisputed; must be none)"),
                       ("invalid_accepted_disputed",
                        "Invalid-labelled instances accepted that the data README documents as label disputes")):
        L += ["", f"## {title}", ""]
        n = 0
        for st in res["subsets"].values():
            for a in st.get(key, []):
                n += 1
                if n <= 40:
                    L.append(f"- `{a['id']}` #{a.get('test')}: {a['description']} `{a['text'][:100]}` -> our "
                             f"jsonschema errors: {a['jsonschema_errors'] or 'none'}; upstream python_error: "
                             f"{(a.get('python_error') or '').splitlines()[0][:100] if a.get('python_error') else '-'}")
        if n == 0:
            L.append("None.")
    path.write_text("\n".join(L) + "\n")


if __name__ == "__main__":
    main()
