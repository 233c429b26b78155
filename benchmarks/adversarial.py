"""Adversarial suite (issue #26, "hardening"): the counts the issue's closing note asks for.

1. **Python API.** A corpus of adversarial inputs (numeric literals near ±2^63 as ints and floats in
   schemas, in ``%json`` blocks of Lark grammars, in tool schemas and grounded specs; deeply nested
   schemas; huge ``min*``/``max*`` bounds; unsatisfiable bounds under ``not`` / ``anyOf`` / optional
   properties (valid schemas: they must compile); malformed regexes; bad argument types for each
   public verb; huge choice lists; a 3,000-message prompt; with ``../shared/data`` present, also
   JSON-Schema-Test-Suite schemas with bounds under not/anyOf/properties and JSONSchemaBench schemas
   holding wide numbers) runs through ``dgemma_struct.generate_*`` / ``constraint_for`` /
   ``compile_constraint`` on ``dgemma_struct.testing.tiny_runtime()`` in worker *subprocesses*
   (many cases per process; a case whose process dies is rerun alone, so a native crash is counted
   and attributed, not fatal). Counted: crashes (abnormal exit), hangs (``--case-timeout-s``),
   untyped exceptions (anything but ``DgemmaStructError``, or ``TypeError`` for an unknown keyword),
   invalid values returned as success (checked here: ``jsonschema`` with the format checker,
   ``re.fullmatch``, choice membership, tool arguments against their parameters), valid schemas
   refused (``constraint_for`` raising on a ``must_compile`` case).
2. **Server** (``dgemma-struct serve`` on 127.0.0.1 in a subprocess, a tiny random checkpoint as
   tests/hardening/conftest.py uses): (a) a 3,000-message chat request: time to its 400, while a
   small request is sent at the same moment: its latency / its idle latency; (b) a compile flood
   (``--flood`` distinct ~400 KB ``anyOf`` schemas posted at once) while a request with a new small
   constraint is timed; (c) the corpus's HTTP-expressible cases plus malformed bodies over HTTP:
   5xx answers, dropped connections, non-JSON (or non-OpenAI-shaped) error bodies, invalid 200s,
   hangs, and whether the server is still up.

    OMP_NUM_THREADS=1 python benchmarks/adversarial.py            # full run (~3-5 min on 2 cores)
    OMP_NUM_THREADS=1 python benchmarks/adversarial.py --smoke    # < 60 s, fewer cases, smaller floods

Writes ``docs/results/adversarial.{json,md}`` (the md is generated from the json).
"""
from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import math
import os
import platform
import queue
import random
import re
import signal
import socket
import statistics
import string
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from batch_scaling import ROOT, tree_info, write_results  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
I64_MIN, I64_MAX = -(2 ** 63), 2 ** 63 - 1
W = 2 ** 70
WIDE = [I64_MIN, I64_MIN + 1, I64_MAX, 2 ** 63, 2 ** 64, -(2 ** 64), W, -W, 10 ** 30, -1e308, 1e308,
        -1.7976931348623157e308, -9.223372036854776e18, 9.223372036854776e18, -1.8446744073709552e19,
        1.8446744073709552e19]
VERBS = ["generate", "generate_json", "generate_regex", "generate_grammar", "generate_choice", "generate_batch",
         "generate_tool_calls", "compile_constraint", "constraint_for", "generate_grounded", "stream"]
MSG = "Give the answer."


# ---------------------------------------------------------------- the corpus (built the same in every process)

def _nest(depth: int, kind: str) -> dict:
    s: dict = {"type": "integer"}
    for i in range(depth):
        if kind == "object":
            s = {"type": "object", "properties": {"a": s}, "required": ["a"]}
        elif kind == "array":
            s = {"type": "array", "items": s, "minItems": 1, "maxItems": 1}
        elif kind == "anyOf":
            s = {"anyOf": [s, {"type": "null"}]}
        elif kind == "allOf":
            s = {"allOf": [s]}
        else:  # not
            s = {"not": s}
    return s


def _rs(r: random.Random, n: int) -> str:
    return "".join(r.choice(string.ascii_lowercase) for _ in range(n))


def _bad_values() -> dict[str, Any]:
    """Ill-typed or out-of-range arguments (by name: the corpus lists names, the worker the values)."""
    return {"none": None, "true": True, "int": 7, "neg": -1, "zero": 0, "huge_int": 10 ** 30, "wide": I64_MIN,
            "nan": float("nan"), "inf": float("inf"), "str": "abc", "empty_str": "", "surrogate": "\ud800",
            "bytes": b"\x00\xff", "list_int": [1, 2], "list_empty": [], "dict_empty": {}, "dict_odd": {"": 1},
            "tuple": ("x",), "set": {1}, "object": object(), "schema_wide": {"type": "integer", "const": -1e308},
            "grammar_wide": 'start: %json {"const": -1e308}', "huge_min": {"type": "string", "minLength": 10 ** 9},
            "self_ref": {"$ref": "#"}, "regex_bad": "a**", "nul": "a\x00b", "type_cls": int}


def corpus(smoke: bool) -> list[dict]:
    """Every case: {id, group, verb, args (names or values), kw, must_compile, check}. ``check``:
    ("json", schema) | ("regex", pattern) | ("choice", list) | ("tool", tools) | ("grounded", schema) | None."""
    cases: list[dict] = []

    def add(group: str, verb: str, args: list, kw: dict | None = None, *, must_compile: bool = False,
            check: Any = None, http: Any = None) -> None:
        cases.append({"id": f"{group}:{len([c for c in cases if c['group'] == group])}", "group": group,
                      "verb": verb, "args": args, "kw": kw or {}, "must_compile": must_compile, "check": check,
                      "http": http})

    def js(group: str, schema: Any, *, must_compile: bool = False, tokens: int = 24) -> None:
        add(group, "generate_json", [MSG, schema], {"max_new_tokens": tokens}, must_compile=must_compile,
            check=("json", schema), http={"guided_json": schema, "max_tokens": tokens})

    # 1. wide numeric literals: schemas, %json in grammars, tool schemas, grounded specs
    for v in (WIDE[::4] if smoke else WIDE):
        for s in ({"const": v}, {"type": "integer", "const": v}, {"enum": [v, 3]},
                  {"type": "integer", "minimum": v, "maximum": v}, {"type": "number", "minimum": v},
                  {"type": "integer", "maximum": v}, {"type": "object", "properties": {"a": {"const": v}},
                                                      "required": ["a"]}):
            js("wide_literal_schema", s, tokens=48)
        add("wide_literal_grammar", "generate_grammar", [MSG, "start: %json " + json.dumps({"const": v})],
            {"max_new_tokens": 48}, http={"guided_grammar": "start: %json " + json.dumps({"const": v}),
                                          "max_tokens": 48})
        add("wide_literal_grammar", "generate_grammar",
            [MSG, 'start: "n=" %json ' + json.dumps({"type": "integer", "minimum": v})], {"max_new_tokens": 24})
        tool_params = {"type": "object", "properties": {"n": {"type": "integer", "const": v}}, "required": ["n"]}
        tools = [{"type": "function", "function": {"name": "f", "parameters": tool_params}}]
        add("wide_literal_tool", "generate_tool_calls", [MSG, tools], {"max_new_tokens": 48},
            check=("tool", tools), http={"tools": tools, "max_tokens": 48})
        g = {"type": "object", "properties": {"n": {"type": "integer", "minimum": v, "maximum": v}}}
        add("wide_literal_grounded", "generate_grounded", [MSG, g], {"source": "the value is 12",
                                                                      "max_new_tokens": 24}, check=("grounded", g))
    add("wide_literal_schema", "generate_json", [MSG, {"type": "number", "const": 1e308, "multipleOf": 1e-308}],
        {"max_new_tokens": 24}, check=("json", {"type": "number", "const": 1e308, "multipleOf": 1e-308}))
    # 2. deep nesting
    for kind in ("object", "array", "anyOf", "allOf", "not"):
        for depth in ((20, 200) if smoke else (20, 200, 2000, 20000)):
            js("deep_nesting", _nest(depth, kind), tokens=32)
    deep_rec = {"$defs": {"n": {"type": "object", "properties": {"k": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"}
    js("deep_nesting", deep_rec)
    js("deep_nesting", {"$ref": "#"})
    js("deep_nesting", {"not": {"$ref": "#"}})
    add("deep_nesting", "generate_grammar", [MSG, "start: " + "(" * 3000 + '"a"' + ")" * 3000],
        {"max_new_tokens": 8})
    add("deep_nesting", "generate_regex", [MSG, "(" * 3000 + "a" + ")" * 3000], {"max_new_tokens": 8},
        check=("regex", "(" * 3000 + "a" + ")" * 3000))
    # 3. huge bounds (a huge *minimum* needs a typed refusal; a huge *maximum* must still work)
    for s in ({"type": "string", "minLength": 10 ** 9}, {"type": "array", "minItems": 10 ** 6},
              {"type": "object", "minProperties": 10 ** 6}, {"type": "string", "maxLength": 10 ** 18},
              {"type": "array", "maxItems": 2 ** 64}, {"type": "object", "maxProperties": 10 ** 30},
              {"type": "string", "minLength": 3, "maxLength": 10 ** 9}, {"type": "string", "pattern": "a{0,4294967296}"},
              {"type": "string", "pattern": "a{1000000}"}, {"type": "string", "minLength": 2 ** 64},
              {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 10 ** 12},
              {"type": "integer", "minimum": -1e308, "maximum": 1e308}, {"type": "number", "multipleOf": 1e-308},
              {"type": "object", "properties": {"a": {"type": "string", "minLength": 10 ** 7}}, "required": ["a"]}):
        js("huge_bounds", s)
    # 4. unsatisfiable bounds where they need not hold: valid schemas, they must compile
    unsat = [{"type": "string", "minLength": 5, "maxLength": 2}, {"type": "integer", "minimum": 5, "maximum": 2},
             {"type": "array", "minItems": 3, "maxItems": 1}, {"type": "string", "minLength": 10 ** 9},
             {"type": "object", "minProperties": 3, "maxProperties": 1}, {"type": "number", "exclusiveMinimum": 1,
                                                                          "exclusiveMaximum": 1},
             {"type": "integer", "minimum": I64_MAX, "maximum": I64_MIN}, {"type": "string", "minLength": 2 ** 64}]
    for u in unsat:
        for s in ({"anyOf": [u, {"type": "null"}]}, {"anyOf": [{"type": "boolean"}, u]}, {"oneOf": [u, {"const": 1}]},
                  {"type": "object", "properties": {"a": u}}, {"type": "object", "properties": {"a": u, "b": {
                      "type": "integer"}}, "required": ["b"]}, {"not": u}, {"type": "array", "items": u},
                  {"type": ["object", "null"], "properties": {"a": u}, "required": ["a"]}):
            js("valid_unsat_branch", s, must_compile=True)
    # 5. malformed (and heavy) regexes: as regex specs and as JSON-schema patterns
    for p in ["\\", "a**", "[", "(?P<x", "a{2,1}", "\ud800", "a\x00b", "(", ")", "[z-a]", "(?<=a)b", "\\1(a)",
              "a{0,4294967296}", "(a+)+$", "(a|a)*b", "x" * 100000, "[" * 1000, "\\p{Foo}", "(?i)a", ""]:
        add("malformed_regex", "generate_regex", [MSG, p], {"max_new_tokens": 8}, check=("regex", p),
            http={"guided_regex": p, "max_tokens": 8})
        js("malformed_regex", {"type": "string", "pattern": p}, tokens=8)
    for g in ["start: ", 'start: "a" |', "start: x", 'start: "\ud800"', "start: /[/", "%import nothing",
              "start: " + "|".join(f'"{i}"' for i in range(5000)), "start: a\na: a", "start: /(a+)+$/", ""]:
        add("malformed_grammar", "generate_grammar", [MSG, g], {"max_new_tokens": 8},
            http={"guided_grammar": g, "max_tokens": 8})
    # 6. bad argument types for each public verb (positional and keyword)
    bad = list(_bad_values())
    good2 = {"generate": {"type": "integer"}, "generate_json": {"type": "integer"}, "generate_regex": "[0-9]",
             "generate_grammar": 'start: "a"', "generate_choice": ["yes", "no"], "generate_batch": {"type": "integer"},
             "generate_tool_calls": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
             "compile_constraint": None, "constraint_for": None, "generate_grounded": {"type": "object"},
             "stream": {"type": "integer"}}
    picks = bad[::7] if smoke else bad
    for verb in VERBS:
        for name in picks:
            add("bad_arguments", verb, [("bad", name), good2[verb]] if good2[verb] is not None else [("bad", name)],
                {"max_new_tokens": 4})
            if good2[verb] is not None:
                add("bad_arguments", verb, [MSG, ("bad", name)], {"max_new_tokens": 4})
        for knob in (["max_new_tokens", "seed", "mode", "temperature", "timeout_s", "strict", "whitespace",
                      "separators", "max_repairs", "not_a_knob"] if not smoke else ["max_new_tokens", "not_a_knob"]):
            for name in (("none", "nan", "str", "huge_int", "neg", "list_int") if not smoke else ("str", "neg")):
                kw = {"max_new_tokens": 4, knob: ("bad", name)}
                args = [MSG, good2[verb]] if good2[verb] is not None else [{"type": "integer"}]
                add("bad_arguments", verb, args, kw)
    # 7. huge / odd choice lists
    r = random.Random(26)
    for choices in ([_rs(r, 12) for _ in range(2000 if smoke else 20000)], ["x" * 100000, "y"], ["same"] * 5000,
                    [], [""], ["a", 1], ["\ud800"], [str(i) for i in range(50000 if not smoke else 5000)],
                    ["a" * i for i in range(1, 400)]):
        add("huge_choices", "generate_choice", [MSG, choices], {"max_new_tokens": 24},
            check=("choice", choices), http={"guided_choice": choices, "max_tokens": 24})
    # 8. message floods through the Python API
    add("message_flood", "generate_json", [[{"role": "user", "content": "hi"}] * 3000, {"type": "integer"}],
        {"max_new_tokens": 8}, check=("json", {"type": "integer"}))
    add("message_flood", "generate_json", [[{"role": "user", "content": "x" * 10 ** 6}], {"type": "integer"}],
        {"max_new_tokens": 8}, check=("json", {"type": "integer"}))
    add("message_flood", "generate_json", [[{"role": "nobody", "content": None}] * 10, {"type": "integer"}],
        {"max_new_tokens": 8}, check=("json", {"type": "integer"}))
    # 9. public data sets, when ../shared/data is here
    for s in shared_schemas(smoke):
        js(s["group"], s["schema"], must_compile=s["must_compile"])
    return cases


def shared_schemas(smoke: bool) -> list[dict]:
    """JSON-Schema-Test-Suite schemas with bounds under not/anyOf/properties (valid: must compile),
    and JSONSchemaBench schemas holding integers beyond ±2^53 (wide literals). Empty without ../shared."""
    out: list[dict] = []
    suite = SHARED / "json-schema-test-suite" / "tests" / "draft2020-12"
    bounds = re.compile(r'"(minLength|maxLength|minItems|maxItems|minimum|maximum|minProperties|maxProperties|'
                        r'exclusiveMinimum|exclusiveMaximum)"')
    if suite.is_dir():
        for f in sorted(suite.glob("*.json")):
            for group in json.loads(f.read_text()):
                s = group["schema"]
                text = json.dumps(s)
                if (bounds.search(text) and re.search(r'"(not|anyOf|oneOf|properties)"', text) and "$ref" not in text
                        and "localhost" not in text):   # remote metaschemas: not about bounds
                    out.append({"group": "jsts_bounds_under_branches", "schema": s, "must_compile": True})
    bench = SHARED / "jsonschemabench"
    if bench.is_dir():
        wide = re.compile(r"-?\d{16,}")
        found = 0
        for f in sorted(bench.glob("Github_*.jsonl.gz")):
            with gzip.open(f, "rt") as fh:
                for line in fh:
                    if not wide.search(line):
                        continue
                    try:
                        row = json.loads(line)
                        s = row.get("json_schema") or row.get("schema")
                        s = json.loads(s) if isinstance(s, str) else s
                    except (ValueError, AttributeError):
                        continue
                    if isinstance(s, dict) and wide.search(json.dumps(s)):
                        out.append({"group": "jsb_wide_literals", "schema": s, "must_compile": False})
                        found += 1
                    if found >= (5 if smoke else 40):
                        break
            if found >= (5 if smoke else 40):
                break
    if smoke:
        out = [o for o in out if o["group"] != "jsts_bounds_under_branches"][:5] + \
            [o for o in out if o["group"] == "jsts_bounds_under_branches"][:10]
    return out


# ---------------------------------------------------------------- checking a returned value

def _json_check(value: Any, schema: Any) -> str | None:
    import jsonschema

    try:
        cls = jsonschema.validators.validator_for(schema) if isinstance(schema, dict) else jsonschema.Draft202012Validator
        err = jsonschema.exceptions.best_match(cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(value))
    except Exception as e:  # noqa: BLE001 - our checker's own limits (RecursionError, unresolvable $ref, ...)
        return f"unchecked: {type(e).__name__}"
    return None if err is None else f"invalid: {err.message[:160]}"


def check_value(check: Any, out: Any) -> str | None:
    """None (valid), 'invalid: ...' or 'unchecked: ...'."""
    if check is None:
        return "unchecked: no independent checker for this spec"
    kind, spec = check
    if kind == "json":
        return _json_check(out, spec)
    if kind == "regex":
        try:
            pat = re.compile(spec)
        except (re.error, RecursionError, OverflowError) as e:
            return f"unchecked: Python re cannot compile it ({type(e).__name__})"
        return None if isinstance(out, str) and pat.fullmatch(out) else f"invalid: {str(out)[:80]!r} !~ pattern"
    if kind == "choice":
        return None if out in spec else f"invalid: {str(out)[:80]!r} not a choice"
    if kind == "grounded":
        return _json_check(getattr(out, "value", out), spec)
    if kind == "tool":
        params = {t["function"]["name"]: t["function"].get("parameters") or {} for t in spec}
        for call in getattr(out, "calls", []):
            if call.name not in params:
                return f"invalid: undeclared tool {call.name!r}"
            msg = _json_check(call.arguments, params[call.name])
            if msg:
                return msg
        return None
    return "unchecked"


# ---------------------------------------------------------------- the worker process

def _resolve(a: Any, values: dict) -> Any:
    if isinstance(a, tuple) and len(a) == 2 and a[0] == "bad":
        return values[a[1]]
    return a


def run_case(c: dict, rt: Any, values: dict) -> dict:
    import dgemma_struct as ds
    from dgemma_struct.errors import DgemmaStructError

    args = [_resolve(a, values) for a in c["args"]]
    kw = {k: _resolve(v, values) for k, v in c["kw"].items()}
    rec: dict[str, Any] = {"id": c["id"]}
    t0 = time.perf_counter()
    if c["must_compile"]:
        try:
            ds.constraint_for(args[1], rt)
        except Exception as e:  # noqa: BLE001 - a refusal of a valid schema, whatever its type
            rec.update(outcome="refused", type=type(e).__name__, msg=str(e)[:200], s=time.perf_counter() - t0)
            return rec
    try:
        verb = c["verb"]
        opts = dict(kw)
        quick = {k: opts.pop(k) if k in opts else d for k, d in (("max_repairs", 0), ("fallback", False))}
        if verb == "compile_constraint":
            out = ds.compile_constraint(args[0], rt.tokenizer, **{k: v for k, v in opts.items()
                                                                 if k not in ("max_new_tokens", "seed", "mode",
                                                                              "temperature", "timeout_s",
                                                                              "max_repairs")})
        elif verb == "constraint_for":
            out = ds.constraint_for(args[0], rt, **{k: v for k, v in opts.items()
                                                    if k in ("strict", "whitespace", "separators", "not_a_knob")})
        elif verb == "generate_batch":
            out = ds.generate_batch(args[0] if isinstance(args[0], list) else [args[0]], args[1], runtime=rt,
                                    **quick, **opts)
        elif verb == "stream":
            out = None
            for ev in ds.stream(*args, runtime=rt, **quick, **opts):
                out = ev
        elif verb == "generate_grounded":
            opts.setdefault("source", "the value is 12")
            out = ds.generate_grounded(*args, runtime=rt, **quick, **opts)
        elif verb == "generate_tool_calls":
            out = ds.generate_tool_calls(*args, runtime=rt, **quick, **opts)
        else:
            out = getattr(ds, verb)(*args, runtime=rt, **quick, **opts)
        verdict = check_value(c["check"], out) if c["check"] else "unchecked: no independent checker"
        if verdict is None:
            rec["outcome"] = "ok"
        elif verdict.startswith("invalid"):
            rec.update(outcome="invalid", msg=verdict, output=repr(out)[:200])
        else:
            rec.update(outcome="ok_unchecked", msg=verdict)
    except DgemmaStructError as e:
        rec.update(outcome="typed", type=type(e).__name__, msg=str(e)[:160])
    except TypeError as e:
        ok = "unexpected keyword" in str(e) or "not_a_knob" in str(e)
        rec.update(outcome="typed_kw" if ok else "untyped", type="TypeError", msg=str(e)[:200])
    except BaseException as e:  # noqa: BLE001 - everything else is what we count
        if isinstance(e, KeyboardInterrupt):
            raise
        rec.update(outcome="untyped", type=type(e).__name__, msg=str(e)[:200])
    rec["s"] = time.perf_counter() - t0
    return rec


def worker(smoke: bool) -> None:
    """Run the corpus cases named on stdin (a JSON list of ids); one 'START id' / 'DONE json' pair each."""
    proto = sys.stdout
    sys.stdout = sys.stderr
    from dgemma_struct.testing import tiny_runtime

    ids = json.loads(sys.stdin.read())
    by_id = {c["id"]: c for c in corpus(smoke)}
    values = _bad_values()
    rt = tiny_runtime()
    for i in ids:
        proto.write(f"START {i}\n")
        proto.flush()
        rec = run_case(by_id[i], rt, values)
        proto.write("DONE " + json.dumps(rec, default=str) + "\n")
        proto.flush()


class Runner:
    """Drives worker subprocesses over the case ids: per-case timeout (hang), death (crash) → the
    case is rerun alone to attribute it; the remaining cases go on in a fresh worker."""

    def __init__(self, smoke: bool, case_timeout_s: float, startup_s: float = 120.0):
        self.smoke, self.timeout, self.startup = smoke, case_timeout_s, startup_s
        self.workers = 0
        # the worker process (reads case ids as JSON on stdin, prints ``START id`` and results)
        self.worker_cmd = [sys.executable, str(Path(__file__).resolve()), "--worker"] + (["--smoke"] if smoke else [])

    def _spawn(self) -> tuple[subprocess.Popen, queue.Queue]:
        env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        p = subprocess.Popen(self.worker_cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, env=env, start_new_session=True)
        q: queue.Queue = queue.Queue()

        def pump() -> None:
            for line in p.stdout:
                q.put(line.rstrip("\n"))
            q.put(None)
        threading.Thread(target=pump, daemon=True).start()
        self.workers += 1
        return p, q

    @staticmethod
    def _kill(p: subprocess.Popen) -> None:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait()

    def run_batch(self, ids: list[str]) -> tuple[dict[str, dict], list[str], str | None, int | None]:
        """Run ``ids`` in one worker. Returns (records, ids not reached, id in flight when it died/hung, rc)."""
        p, q = self._spawn()
        p.stdin.write(json.dumps(ids))
        p.stdin.close()
        recs: dict[str, dict] = {}
        current: str | None = None
        started_any = False
        while True:
            try:
                line = q.get(timeout=self.timeout if started_any else self.startup + self.timeout)
            except queue.Empty:
                self._kill(p)
                rest = [i for i in ids if i not in recs and i != current]
                return recs, rest, current, "hang"
            if line is None:
                p.wait()
                rest = [i for i in ids if i not in recs and i != current]
                if current is None and not rest:
                    return recs, [], None, None
                return recs, rest, current, p.returncode
            if line.startswith("START "):
                current, started_any = line[6:], True
            elif line.startswith("DONE "):
                rec = json.loads(line[5:])
                recs[rec["id"]] = rec
                current = None

    def run(self, ids: list[str], say) -> dict[str, dict]:
        out: dict[str, dict] = {}
        todo = list(ids)
        while todo:
            recs, rest, bad, rc = self.run_batch(todo)
            out.update(recs)
            if bad is not None:
                say(f"  case {bad}: {'hang' if rc == 'hang' else f'worker died (rc {rc})'}; rerunning it alone")
                alone, _, bad2, rc2 = self.run_batch([bad])
                if bad2 is None and bad in alone:
                    rec = alone[bad]
                    rec["note"] = f"its batch worker {'hung' if rc == 'hang' else f'died (rc {rc})'}; alone it ran"
                    rec["batch_failure"] = "hang" if rc == "hang" else "crash"
                    out[bad] = rec
                else:
                    out[bad] = {"id": bad, "outcome": "hang" if rc2 == "hang" else "crash", "rc": rc2,
                                "msg": f"alone: {'no answer within the case timeout' if rc2 == 'hang' else f'exit {rc2}'}"}
            elif rest and rc is not None:
                say(f"  worker died before any case (rc {rc}); {len(rest)} cases left")
                for i in rest:
                    out[i] = {"id": i, "outcome": "crash", "rc": rc, "msg": "worker died at start-up"}
                rest = []
            todo = rest
        return out


# ---------------------------------------------------------------- the server

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``dgemma-struct serve`` on a tiny random checkpoint (as tests/hardening/conftest.py), own process group."""

    def __init__(self, ckpt: Path, logdir: Path, extra: list[str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = logdir / "server.log"
        self.log = open(self.log_path, "w")
        env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        env.pop("DGEMMA_STRUCT_API_KEY", None)
        self.args = ["serve", "--model", str(ckpt), "--port", str(self.port), "--log-level", "warning",
                     "--compile-timeout", "20", "--max-tokens-cap", "128", *extra]
        self.proc = subprocess.Popen([sys.executable, "-m", "dgemma_struct.cli", *self.args], env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout_s: float = 180) -> float:
        import httpx

        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        self.stop()
        raise SystemExit(f"the server did not come up in {timeout_s:.0f}s:\n{self.tail()}")

    def tail(self, n: int = 3000) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-n:]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log.close()


def post(url: str, body: Any, timeout: float = 90.0, raw: bytes | None = None,
         headers: dict | None = None) -> tuple[Any, float, str | None]:
    """(response or None, seconds, transport error or None)."""
    import httpx

    t0 = time.perf_counter()
    try:
        if raw is not None:
            r = httpx.post(url + "/v1/chat/completions", content=raw, timeout=timeout,
                           headers=headers or {"content-type": "application/json"})
        else:
            r = httpx.post(url + "/v1/chat/completions", json=body, timeout=timeout)
        return r, time.perf_counter() - t0, None
    except httpx.TimeoutException as e:
        return None, time.perf_counter() - t0, f"timeout: {type(e).__name__}"
    except httpx.TransportError as e:
        return None, time.perf_counter() - t0, f"transport: {type(e).__name__}: {str(e)[:120]}"
    except (ValueError, RecursionError) as e:   # the client cannot encode the body (lone surrogate, depth)
        return None, time.perf_counter() - t0, f"client: {type(e).__name__}: {str(e)[:120]}"


def small_body(tag: str = "") -> dict:
    return {"messages": [{"role": "user", "content": "yes or no?"}], "max_tokens": 8,
            "guided_choice": [f"yes{tag}", f"no{tag}"]}


def concurrently(fns: list) -> list:
    out: list = [None] * len(fns)

    def go(i: int, fn) -> None:
        out[i] = fn()
    ts = [threading.Thread(target=go, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def message_flood(url: str, rounds: int, floods: int) -> dict:
    """(a): ``floods`` 3,000-message requests and one small request sent at the same moment."""
    flood_raw = json.dumps({"messages": [{"role": "user", "content": "hi"}] * 3000, "max_tokens": 8,
                            "guided_choice": ["yes", "no"]}).encode()   # encoded once: client time not counted
    for _ in range(2):
        post(url, small_body())
    idle = [post(url, small_body())[1] for _ in range(max(5, rounds))]
    flood_s, under, codes = [], [], {}
    for _ in range(rounds):
        res = concurrently([lambda: post(url, None, raw=flood_raw) for _ in range(floods)]
                           + [lambda: post(url, small_body())])
        for r, s, err in res[:-1]:
            code = (f"{r.status_code} {(r.json().get('error') or {}).get('code')}" if r is not None
                    and r.status_code != 200 else (str(r.status_code) if r is not None else err))
            codes[code] = codes.get(code, 0) + 1
            flood_s.append(s)
        r, s, err = res[-1]
        under.append(s if r is not None and r.status_code == 200 else None)
    ok_under = [x for x in under if x is not None]
    idle_med = statistics.median(idle)
    med_under = statistics.median(ok_under) if ok_under else None
    return {"rounds": rounds, "floods_per_round": floods, "flood_answers": codes,
            "flood_s": flood_s, "flood_s_median": statistics.median(flood_s), "flood_s_max": max(flood_s),
            "small_idle_s": idle, "small_idle_s_median": idle_med, "small_under_flood_s": under,
            "small_under_flood_s_median": med_under, "small_failed": under.count(None),
            "ratio_median": None if med_under is None else med_under / idle_med}


def flood_schema(r: random.Random, n_branches: int) -> dict:
    return {"anyOf": [{"type": "object", "properties": {
        _rs(r, 8): {"type": "string", "pattern": f"^{_rs(r, 5)}[0-9]{{2,40}}$"} for _ in range(5)},
        "additionalProperties": False} for _ in range(n_branches)]}


def enum_flood_schema(r: random.Random, n: int) -> dict:
    return {"type": "object", "properties": {"pick": {"enum": [_rs(r, 24) for _ in range(n * 20)]}},
            "required": ["pick"], "additionalProperties": False}


def compile_flood(url: str, rounds: int, flood: int, branches: int, kind: str = "anyOf") -> dict:
    """(b): ``flood`` distinct big schemas posted at once; 0.5 s in, a request with a new small
    constraint (never seen before: its compile is not cached) is timed."""
    r = random.Random(2026)
    nonce = _rs(r, 6)
    idle = [post(url, {"messages": [{"role": "user", "content": "pick"}], "max_tokens": 8,
                       "guided_json": {"enum": [f"a{nonce}{i}", f"b{nonce}{i}"]}})[1] for i in range(3)]
    rows = []
    for k in range(rounds):
        schemas = [(flood_schema if kind == "anyOf" else enum_flood_schema)(r, branches) for _ in range(flood)]
        size_kb = statistics.mean(len(json.dumps(s)) for s in schemas) / 1024
        small = {"enum": [f"new{k}{nonce}", f"other{k}{nonce}"]}

        def timed_small() -> tuple:
            time.sleep(0.5)
            return post(url, {"messages": [{"role": "user", "content": "pick"}], "max_tokens": 8,
                              "guided_json": small})
        t0 = time.perf_counter()
        res = concurrently([(lambda s=s: post(url, {"messages": [{"role": "user", "content": "JSON"}],
                                                     "max_tokens": 16, "guided_json": s}, timeout=120))
                            for s in schemas] + [timed_small])
        wall = time.perf_counter() - t0
        codes: dict[str, int] = {}
        msgs: dict[str, str] = {}
        for resp, s, err in res[:-1]:
            code = (str(resp.status_code) + ("" if resp.status_code == 200 else
                                            f" {(_err_obj(resp) or {}).get('code')}")) if resp is not None else err
            codes[code] = codes.get(code, 0) + 1
            if resp is not None and resp.status_code != 200:
                msgs.setdefault(code, str((_err_obj(resp) or {}).get("message"))[:200])
        resp, s, err = res[-1]
        rows.append({"round": k, "flood": flood, "schema_kb": round(size_kb, 1), "flood_answers": codes,
                     "flood_error_messages": msgs,
                     "flood_wall_s": wall, "small_s": s, "small_status": resp.status_code if resp is not None else err,
                     "small_content": _content(resp)})
    small_s = [x["small_s"] for x in rows if x["small_status"] == 200]
    return {"kind": kind, "rounds": rows, "small_new_idle_s": idle, "small_s_median": statistics.median(small_s) if small_s else None,
            "small_s_max": max(small_s) if small_s else None, "small_failed": len(rows) - len(small_s)}


def _err_obj(r: Any) -> dict | None:
    try:
        e = r.json().get("error")
        return e if isinstance(e, dict) else None
    except (ValueError, AttributeError):
        return None


def _content(r: Any) -> Any:
    try:
        return r.json()["choices"][0]["message"]["content"]
    except Exception:  # noqa: BLE001
        return None


def http_cases(cases: list[dict]) -> list[dict]:
    """The corpus cases the HTTP API can express, plus malformed request bodies."""
    out = []
    for c in cases:
        if c["http"] is not None:
            body = {"messages": [{"role": "user", "content": MSG}], **c["http"]}
            chk = c["check"] if c["check"] and c["check"][0] in ("json", "regex", "choice") else None
            out.append({"id": c["id"], "body": body, "check": chk, "must_compile": c["must_compile"]})
    m = [{"role": "user", "content": MSG}]
    odd = [("max_tokens_str", {"messages": m, "max_tokens": "x"}), ("max_tokens_huge", {"messages": m, "max_tokens": 10 ** 30}),
           ("max_tokens_neg", {"messages": m, "max_tokens": -1}), ("messages_null", {"messages": None}),
           ("messages_int", {"messages": 5}), ("messages_empty", {"messages": []}),
           ("message_no_role", {"messages": [{"content": "x"}]}), ("message_content_obj", {"messages": [
               {"role": "user", "content": {"a": 1}}]}), ("temperature_str", {"messages": m, "temperature": "hot"}),
           ("n_huge", {"messages": m, "n": 10 ** 30}), ("seed_wide", {"messages": m, "seed": 2 ** 70, "max_tokens": 4}),
           ("guided_json_int", {"messages": m, "guided_json": 5}), ("guided_json_str", {"messages": m,
                                                                                         "guided_json": "{not json"}),
           ("guided_choice_ints", {"messages": m, "guided_choice": [1, 2]}), ("two_constraints", {
               "messages": m, "guided_regex": "a", "guided_choice": ["a"]}),
           ("response_format_odd", {"messages": m, "response_format": {"type": "json_schema"}}),
           ("response_format_type", {"messages": m, "response_format": {"type": "xml"}}),
           ("tools_bad", {"messages": m, "tools": [{"type": "function"}]}),
           ("tool_choice_bad", {"messages": m, "tools": [{"type": "function", "function": {"name": "f"}}],
                                "tool_choice": {"type": "function", "function": {"name": "g"}}}),
           ("logprobs_odd", {"messages": m, "logprobs": True, "top_logprobs": 10 ** 9}),
           ("stop_huge", {"messages": m, "stop": ["x"] * 10000, "max_tokens": 4}),
           ("unknown_field", {"messages": m, "frobnicate": 1, "max_tokens": 4}),
           ("surrogate_content", {"messages": [{"role": "user", "content": "\ud800"}], "max_tokens": 4}),
           ("deep_body", {"messages": m, "guided_json": _nest(5000, "array")})]
    for name, body in odd:
        out.append({"id": f"http_body:{name}", "body": body, "check": None, "must_compile": False})
    for name, raw, hdr in [("not_json", b"{nope", None), ("empty", b"", None), ("nan_literal",
                           b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', None),
                           ("array_body", b"[1, 2]", None), ("text_plain", b"hello", {"content-type": "text/plain"}),
                           ("deep_raw", b"[" * 100000 + b"]" * 100000, None)]:
        out.append({"id": f"http_raw:{name}", "raw": raw, "headers": hdr, "check": None, "must_compile": False})
    return out


def http_corpus(server: Server, cases: list[dict], say, timeout_s: float) -> dict:
    counts = {"cases": 0, "ok_200": 0, "typed_4xx": 0, "http_5xx": 0, "overloaded_503": 0, "dropped": 0,
              "hangs": 0, "non_json_error_body": 0, "invalid_200": 0, "valid_refused": 0, "unchecked_200": 0,
              "unsendable": 0, "length_200": 0}
    samples: dict[str, list] = {k: [] for k in counts}
    per_group: dict[str, dict] = {}
    t0 = time.perf_counter()
    for c in cases:
        if not server.alive():
            samples.setdefault("server_died_before", []).append(c["id"])
            break
        r, s, err = post(server.url, c.get("body"), timeout=timeout_s, raw=c.get("raw"), headers=c.get("headers"))
        counts["cases"] += 1
        g = c["id"].split(":")[0]
        pg = per_group.setdefault(g, {"cases": 0, "200": 0, "4xx": 0, "5xx": 0, "other": 0})
        pg["cases"] += 1
        if r is None and err and err.startswith("client"):
            counts["unsendable"] += 1
            samples["unsendable"].append(f"{c['id']}: {err}")
            pg["other"] += 1
            continue
        if r is None:
            key = "hangs" if err and err.startswith("timeout") else "dropped"
            counts[key] += 1
            samples[key].append(f"{c['id']}: {err}")
            pg["other"] += 1
            continue
        if r.status_code == 200:
            pg["200"] += 1
            content = _content(r)
            try:
                finish = r.json()["choices"][0].get("finish_reason")
            except Exception:  # noqa: BLE001
                finish = None
            if finish == "length":   # cut at max_tokens: reported as such, not claimed valid
                counts["length_200"] += 1
                continue
            if c["check"] is None:
                counts["unchecked_200"] += 1
                counts["ok_200"] += 1
                continue
            kind, spec = c["check"]
            try:
                value = json.loads(content) if kind == "json" else content
                verdict = check_value(c["check"], value)
            except (TypeError, ValueError) as e:
                finish = (r.json()["choices"][0] or {}).get("finish_reason")
                verdict = None if finish == "length" else f"invalid: not JSON ({e})"
            if verdict and verdict.startswith("invalid"):
                counts["invalid_200"] += 1
                samples["invalid_200"].append(f"{c['id']}: {verdict}")
            else:
                counts["ok_200"] += 1
                if verdict:
                    counts["unchecked_200"] += 1
            continue
        e = _err_obj(r)
        good_body = e is not None and isinstance(e.get("message"), str) and "code" in e
        if not good_body:
            counts["non_json_error_body"] += 1
            samples["non_json_error_body"].append(f"{c['id']}: {r.status_code} {r.text[:120]!r}")
        if r.status_code >= 500:
            pg["5xx"] += 1
            if r.status_code == 503 and e and e.get("code") == "overloaded":
                counts["overloaded_503"] += 1
            counts["http_5xx"] += 1
            samples["http_5xx"].append(f"{c['id']}: {r.status_code} {r.text[:160]}")
        else:
            pg["4xx"] += 1
            counts["typed_4xx"] += 1
            if c["must_compile"] and e and e.get("code") in ("invalid_schema", "unsupported_schema_keyword",
                                                              "constraint_engine_error", "constraint_engine_crash"):
                counts["valid_refused"] += 1
                samples["valid_refused"].append(f"{c['id']}: {e.get('code')}: {e.get('message', '')[:120]}")
    counts["server_alive_after"] = server.alive()
    say(f"  HTTP corpus: {counts['cases']} requests in {time.perf_counter() - t0:.0f}s")
    return {"counts": counts, "per_group": per_group, "samples": {k: v[:8] for k, v in samples.items() if v},
            "wall_s": time.perf_counter() - t0}


# ---------------------------------------------------------------- summary + markdown

OUTCOMES = ("ok", "ok_unchecked", "typed", "typed_kw", "refused", "invalid", "untyped", "crash", "hang")


def summarize_api(cases: list[dict], recs: dict[str, dict]) -> dict:
    groups: dict[str, dict] = {}
    for c in cases:
        rec = recs[c["id"]]
        g = groups.setdefault(c["group"], {k: 0 for k in ("cases",) + OUTCOMES})
        g["cases"] += 1
        g[rec["outcome"]] += 1
    total = {k: sum(g[k] for g in groups.values()) for k in ("cases",) + OUTCOMES}
    bad = {k: [dict(recs[c["id"]], group=c["group"], verb=c["verb"]) for c in cases if recs[c["id"]]["outcome"] == k]
           for k in ("crash", "hang", "untyped", "invalid", "refused")}
    batch = [recs[c["id"]] for c in cases if recs[c["id"]].get("batch_failure")]
    slow = sorted(({"id": r["id"], "s": r.get("s")} for r in recs.values() if r.get("s")), key=lambda x: -x["s"])[:5]
    return {"groups": groups, "total": total, "failures": {k: v[:20] for k, v in bad.items()},
            "batch_only_failures": batch, "slowest": slow}


def targets(result: dict) -> list[dict]:
    api, srv = result["api"]["total"], result.get("server") or {}
    http = (srv.get("corpus") or {}).get("counts") or {}
    mf, cf = srv.get("message_flood") or {}, srv.get("compile_flood") or {}
    batch_crash = sum(1 for r in result["api"]["batch_only_failures"] if r["batch_failure"] == "crash")
    batch_hang = sum(1 for r in result["api"]["batch_only_failures"] if r["batch_failure"] == "hang")
    rows = [
        ("crashes (Python API, subprocess exits)", api["crash"] + batch_crash, "0", api["crash"] + batch_crash == 0),
        ("crashes (server process died)", None if not srv else int(not http.get("server_alive_after", False)), "0",
         None if not srv else bool(http.get("server_alive_after"))),
        ("hangs (Python API, per-case timeout)", api["hang"] + batch_hang, "0", api["hang"] + batch_hang == 0),
        ("hangs (HTTP, client timeout)", http.get("hangs"), "0", None if not http else http["hangs"] == 0),
        ("untyped exceptions (Python API)", api["untyped"], "0", api["untyped"] == 0),
        ("invalid returned as success (Python API)", api["invalid"], "0", api["invalid"] == 0),
        ("invalid returned as 200 (HTTP)", http.get("invalid_200"), "0", None if not http else http["invalid_200"] == 0),
        ("valid schemas refused (bounds under not/anyOf/optional; Python API)", api["refused"], "0",
         api["refused"] == 0),
        ("valid schemas refused (same, HTTP)", http.get("valid_refused"), "0",
         None if not http else http["valid_refused"] == 0),
        ("HTTP 5xx / dropped connections / non-JSON error bodies",
         None if not http else f"{http['http_5xx']} / {http['dropped']} / {http['non_json_error_body']}", "0 / 0 / 0",
         None if not http else http["http_5xx"] == http["dropped"] == http["non_json_error_body"] == 0),
        ("3,000-message request: time to its 400 (max over rounds)",
         None if not mf else f"{mf['flood_s_max'] * 1000:.0f} ms (median {mf['flood_s_median'] * 1000:.0f} ms)",
         "< 100 ms", None if not mf else mf["flood_s_max"] < 0.1),
        ("small request beside it: latency / idle latency (median)",
         None if not mf or mf["ratio_median"] is None else f"{mf['ratio_median']:.2f}×", "< 2×",
         None if not mf else (mf["ratio_median"] is not None and mf["ratio_median"] < 2 and mf["small_failed"] == 0)),
        ("new small constraint during a compile flood (max over rounds)",
         None if not cf or cf["small_s_max"] is None else f"{cf['small_s_max']:.2f} s (median {cf['small_s_median']:.2f} s)",
         "< 1 s", None if not cf else (cf["small_s_max"] is not None and cf["small_s_max"] < 1 and cf["small_failed"] == 0)),
    ]
    return [{"what": w, "measured": m, "target": t, "met": ok} for w, m, t, ok in rows]


def markdown(result: dict) -> str:
    meta, api = result["meta"], result["api"]
    L = []
    if meta["smoke"]:
        L += ["> **SMOKE RUN** (fewer cases, smaller floods: a check that the script works, not the measurement).", ""]
    tr = meta["tree"]
    L += ["# Adversarial suite (issue #26)", "",
          f"`benchmarks/adversarial.py`, {meta['date']}, commit `{tr['commit'][:12]}`"
          f"{' + uncommitted changes' if tr['dirty'] else ''}; {meta['cpu_count']} CPUs ({meta['platform']}, "
          f"Python {meta['python']}), OMP_NUM_THREADS=1, {meta['wall_s_total']:.0f} s in all. "
          f"Python API on `dgemma_struct.testing.tiny_runtime()` in {api['workers']} worker subprocess(es) "
          f"(per-case timeout {meta['case_timeout_s']:.0f} s; a case whose worker died or hung is rerun alone); "
          f"generation with `max_repairs=0, fallback=False`. Server: `dgemma-struct serve` on a tiny random "
          f"checkpoint, `{' '.join(meta['server_args'])}`. Shared data sets (../shared/data): "
          f"{'used' if meta['shared_data'] else 'absent: the JSON-Schema-Test-Suite / JSONSchemaBench cases were skipped'}.",
          "", "## Targets", "", "| target | measured | goal | met |", "|---|--:|--:|:-:|"]
    for t in result["targets"]:
        m = "n/a" if t["measured"] is None else t["measured"]
        ok = "n/a" if t["met"] is None else ("**met**" if t["met"] else "**not met**")
        L.append(f"| {t['what']} | {m} | {t['target']} | {ok} |")
    L += ["", "## Python API, per group", "",
          "ok: a value that passed the independent check; ok (unchecked): no independent checker (grammars, "
          "patterns Python's `re` cannot read); typed: a `DgemmaStructError` (typed kw: `TypeError` for an "
          "unknown keyword); refused: a `must_compile` schema that `constraint_for` refused.", "",
          "| group | cases | ok | ok (unchecked) | typed | typed kw | refused | invalid | untyped | crash | hang |",
          "|---|" + "--:|" * 10]
    for g, row in list(api["groups"].items()) + [("**total**", api["total"])]:
        L.append(f"| {g} | " + " | ".join(str(row[k]) for k in ("cases",) + OUTCOMES) + " |")
    fails = [(k, v) for k, v in api["failures"].items() if v]
    if fails or api["batch_only_failures"]:
        L += ["", "### Failures (samples)", ""]
        for k, v in fails:
            for r in v[:8]:
                L.append(f"- {k}: `{r['id']}` ({r.get('verb')}) {r.get('type', '')}: {str(r.get('msg', ''))[:160]}")
        if any("multiple of 1e-308" in str(r.get("msg")) for r in api["failures"].get("invalid", [])):
            L.append("- note on `multipleOf: 1e-308`: the checker here (Python `jsonschema`) divides the value by "
                     "1e-308, overflows to inf and reports \"not a multiple\"; whether any finite number is a multiple "
                     "of the double nearest 1e-308 is a float-semantics question. Counted as invalid all the same.")
        for r in api["batch_only_failures"]:
            L.append(f"- `{r['id']}`: {r['note']} (outcome {r['outcome']}); counted as a {r['batch_failure']}")
    L += ["", "Slowest cases: " + ", ".join(f"`{x['id']}` {x['s']:.2f} s" for x in api["slowest"])]
    srv = result.get("server")
    if srv:
        mf, cf, hc = srv["message_flood"], srv["compile_flood"], srv["corpus"]
        L += ["", "## Server", "", f"Ready in {srv['ready_s']:.1f} s.", "",
              f"**(a) 3,000-message requests.** {mf['rounds']} rounds of {mf['floods_per_round']} such requests "
              f"and one small request (`guided_choice`, 8 tokens) sent together. Answers to the floods: "
              f"{', '.join(f'{k}: {v}' for k, v in mf['flood_answers'].items())}; time to the answer: median "
              f"{mf['flood_s_median'] * 1000:.0f} ms, max {mf['flood_s_max'] * 1000:.0f} ms. Small request: idle "
              f"median {mf['small_idle_s_median'] * 1000:.0f} ms, beside the floods median "
              + ("n/a" if mf["small_under_flood_s_median"] is None else f"{mf['small_under_flood_s_median'] * 1000:.0f} ms")
              + " (ratio " + ("n/a" if mf["ratio_median"] is None else f"{mf['ratio_median']:.2f}") + "×; "
              + f"{mf['small_failed']} failed).", "",
              "**(b) Compile floods.** Each round posts `flood` distinct big schemas (none seen before) at once; "
              "0.5 s in, a request with a new small `guided_json` enum (never seen: its compile is not cached) is "
              "timed. Two kinds of flood: `anyOf` (hundreds of object branches with patterns: big, and refused by the "
              "engine at generation time) and `enum` (one property with thousands of long enum strings: compiles "
              "and generates).", "",
              "| flood kind | round | flood | KB each | flood answers | flood wall s | small request s | small status |",
              "|---|--:|--:|--:|---|--:|--:|--:|"]
        for k in cf["kinds"]:
            for r in k["rounds"]:
                L.append(f"| {k['kind']} | {r['round']} | {r['flood']} | {r['schema_kb']:.0f} | "
                         f"{', '.join(f'{c}: {v}' for c, v in r['flood_answers'].items())} | "
                         f"{r['flood_wall_s']:.1f} | {r['small_s']:.2f} | {r['small_status']} |")
        L += ["", "The small request idle (with its compile): " + "; ".join(
            f"{k['kind']} run: " + ", ".join(f"{x:.2f}" for x in k["small_new_idle_s"]) + " s" for k in cf["kinds"])]
        msgs = {c: m for k in cf["kinds"] for r in k["rounds"] for c, m in r.get("flood_error_messages", {}).items()}
        for c, m in msgs.items():
            L.append(f"- flood answer `{c}`: {m[:200]!r}")
        c = hc["counts"]
        if not c:
            L += ["", "**(c)** not run (`--no-http-corpus`)."]
            return "\n".join(L) + "\n"
        L += ["", f"**(c) The corpus over HTTP.** {c['cases']} requests (the corpus cases the API can express — "
              f"`guided_json` / `guided_regex` / `guided_grammar` / `guided_choice` / `tools` — plus malformed "
              f"bodies), one at a time, in {hc['wall_s']:.0f} s: {c['ok_200']} × 200 ({c['unchecked_200']} without "
              f"an independent check) and {c['length_200']} × 200 with `finish_reason: length` (cut at max_tokens, not "
              f"checked), {c['typed_4xx']} typed 4xx, {c['http_5xx']} × 5xx "
              f"({c['overloaded_503']} of them 503 overloaded), {c['dropped']} dropped connections, {c['hangs']} "
              f"hangs, {c['non_json_error_body']} non-JSON error bodies, {c['invalid_200']} invalid 200s, "
              f"{c['valid_refused']} valid schemas refused; {c['unsendable']} bodies the client (httpx) could not "
              f"encode (not sent); server alive after: {c['server_alive_after']}.", "",
              "| group | requests | 200 | 4xx | 5xx | no answer |", "|---|--:|--:|--:|--:|--:|"]
        for g, row in hc["per_group"].items():
            L.append(f"| {g} | {row['cases']} | {row['200']} | {row['4xx']} | {row['5xx']} | {row['other']} |")
        if hc["samples"]:
            L += ["", "Samples: " + "; ".join(f"{k}: {v[0]}" for k, v in hc["samples"].items()
                                               if k not in ("ok_200", "typed_4xx", "unchecked_200"))]
    else:
        L += ["", "## Server", "", "Not run (`--no-server`)."]
    return "\n".join(L) + "\n"


# ---------------------------------------------------------------- driver

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="fewer cases and smaller floods (< 60 s); marks the outputs")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--case-timeout-s", type=float, default=60.0, help="a Python API case past this is a hang")
    ap.add_argument("--batch", type=int, default=10 ** 6, help="cases per worker subprocess (default: all)")
    ap.add_argument("--no-server", action="store_true", help="the Python API part only")
    ap.add_argument("--no-http-corpus", action="store_true", help="skip part 2(c)")
    ap.add_argument("--flood", type=int, default=None, help="big schemas per compile-flood round (default 16; smoke 6)")
    ap.add_argument("--flood-branches", type=int, default=None, help="anyOf branches per flood schema (1000; smoke 300)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds of (a) and (b) (default 5 / 3; smoke 2)")
    ap.add_argument("--message-floods", type=int, default=1,
                    help="3,000-message requests sent beside the small request in each round of (a) (default 1)")
    ap.add_argument("--md-only", action="store_true", help="re-render the .md from the existing .json and exit")
    ap.add_argument("--no-api", action="store_true", help="skip the Python API part (server parts only)")
    ap.add_argument("--http-timeout-s", type=float, default=90.0, help="an HTTP request past this is a hang")
    ap.add_argument("--server-args", default="", help="extra 'dgemma-struct serve' arguments")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "adversarial"),
                    help="output path without extension (.json and .md are written)")
    a = ap.parse_args()
    if a.worker:
        worker(a.smoke)
        return
    if a.md_only:
        result = json.loads(Path(f"{a.out}.json").read_text())
        result["targets"] = targets(result)
        Path(f"{a.out}.md").write_text(markdown(result))
        return
    t_start = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)

    cases = corpus(a.smoke)
    say(f"corpus: {len(cases)} Python API cases")
    runner = Runner(a.smoke, a.case_timeout_s)
    recs: dict[str, dict] = {}
    ids = [c["id"] for c in cases]
    for i in range(0, 0 if a.no_api else len(ids), a.batch):
        recs.update(runner.run(ids[i:i + a.batch], say))
    if a.no_api:
        cases = []
    api = summarize_api(cases, recs)
    api["workers"] = runner.workers
    say(f"Python API done: {api['total']}")

    server_part = None
    import shlex
    extra = shlex.split(a.server_args)
    server_args: list[str] = []
    if not a.no_server:
        from dgemma_struct.testing import tiny_runtime

        tmp = Path(tempfile.mkdtemp(prefix="adversarial_"))
        rt = tiny_runtime()
        ckpt = tmp / "tiny-ckpt"
        rt.model.save_pretrained(ckpt)
        rt.tokenizer.save_pretrained(ckpt)
        del rt
        server = Server(ckpt, tmp, extra)
        server_args = server.args[:1] + ["--model", "<tiny>"] + server.args[3:]
        try:
            ready = server.wait_ready()
            say(f"server ready in {ready:.1f}s")
            rounds = a.rounds or (3 if a.smoke else 10)
            mf = message_flood(server.url, rounds, a.message_floods)
            say(f"(a) message flood: 400 in max {mf['flood_s_max'] * 1000:.0f} ms; ratio {mf['ratio_median']}")
            cfs = []
            for kind in ("anyOf", "enum"):
                cfs.append(compile_flood(server.url, a.rounds or (1 if a.smoke else 2), a.flood or (6 if a.smoke else 16),
                                         a.flood_branches or (300 if a.smoke else 1000), kind))
                say(f"(b) compile flood ({kind}): small max {cfs[-1]['small_s_max']}")
            cf = {"kinds": cfs, "small_s_max": max((x["small_s_max"] for x in cfs if x["small_s_max"] is not None),
                                                   default=None),
                  "small_s_median": statistics.median([r["small_s"] for x in cfs for r in x["rounds"]]),
                  "small_failed": sum(x["small_failed"] for x in cfs)}
            hcases = http_cases(cases)
            hcases = hcases[::6] + [h for h in hcases if h["id"].startswith("http_")] if a.smoke else hcases
            hc = (http_corpus(server, hcases, say, a.http_timeout_s) if not a.no_http_corpus else
                  {"counts": {}, "per_group": {}, "samples": {}, "wall_s": 0})
            server_part = {"ready_s": ready, "message_flood": mf, "compile_flood": cf, "corpus": hc,
                           "log_tail": server.tail(2000) if not server.alive() else ""}
        finally:
            server.stop()
    meta = {"date": dt.datetime.now().isoformat(timespec="seconds"), "smoke": a.smoke,
            "cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "tree": tree_info(ROOT), "case_timeout_s": a.case_timeout_s, "server_args": server_args,
            "shared_data": SHARED.is_dir(), "command": " ".join(sys.argv),
            "wall_s_total": time.perf_counter() - t_start}
    result: dict[str, Any] = {"meta": meta, "api": api, "server": server_part}
    result["targets"] = targets(result)
    result["cases"] = [dict(recs[c["id"]], group=c["group"], verb=c["verb"]) for c in cases]
    js, mdp = write_results(result, a.out, markdown)
    say(f"wrote {js}, {mdp}")


if __name__ == "__main__":
    main()
