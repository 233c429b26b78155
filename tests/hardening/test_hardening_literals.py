"""#26.1: no input crashes the Python API. The issue's crash inputs (wide integers and integral
floats beyond i64 under ``"type": "integer"``, ``%json`` blocks in Lark grammars) are replayed in a
subprocess (a segfault there fails the test instead of killing it), and a Hypothesis fuzz drives
the one number screen (:mod:`dgemma_struct.constraints.literals`) against llguidance in a
subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

FLOATS = [-1e308, -1.7976931348623157e308, -9.223372036854776e18, -1.8446744073709552e19]
SCHEMAS = [{"type": "integer", "const": v} for v in FLOATS]
SCHEMAS += [{"type": "integer", "minimum": v, "maximum": v} for v in FLOATS]
SCHEMAS += [{"type": "integer", "minimum": v, "maximum": v + 1} for v in FLOATS]
SCHEMAS += [{"type": "integer", "const": 1.8446744073709552e19}, {"type": "integer", "enum": [-1e308, 3]},
            {"allOf": [{"type": "integer"}, {"const": -1e308}]}, {"type": "integer", "const": -9223372036854775807},
            {"type": ["integer", "string"], "const": -1e308},
            {"type": "object", "properties": {"a": {"type": "integer", "const": -1e308}}, "required": ["a"]}]
GRAMMARS = ['start: %json {"const": -9223372036854775808}', 'start: %json {"type": "integer", "const": -1e308}',
            'start: "a" %json {"type": "integer", "minimum": -9.223372036854776e18, "maximum": -9.2e18}',
            'start: %json {"const": 18446744073709551616}']
TOOL_SCHEMAS = [{"type": "object", "properties": {"n": {"type": "integer", "const": -1e308}}, "required": ["n"]},
                {"type": "object", "properties": {"n": {"type": "integer", "minimum": -1e308, "maximum": -1e308}}}]

_REPLAY = textwrap.dedent('''
    import json, sys
    import dgemma_struct as ds
    from dgemma_struct.errors import DgemmaStructError
    from dgemma_struct.testing import tiny_runtime
    cases = json.loads(sys.stdin.read())
    rt = tiny_runtime()
    K = dict(runtime=rt, max_new_tokens=8, max_repairs=0, fallback=False)
    for kind, spec in cases:
        print("RUN", kind, json.dumps(spec), flush=True)
        try:
            if kind == "json":
                ds.generate_json("x", spec, **K)
            elif kind == "grammar":
                ds.generate_grammar("x", spec, **K)
            elif kind == "grounded":
                ds.generate_grounded("x", spec, source="the value is 12", runtime=rt, max_new_tokens=8)
            else:
                from dgemma_struct.tools.constraint import compile_tool_calls
                from dgemma_struct.testing import gemma4_shaped_tokenizer_dir
                from transformers import AutoTokenizer
                tok = AutoTokenizer.from_pretrained(str(gemma4_shaped_tokenizer_dir()))
                compile_tool_calls([{"type": "function", "function": {"name": "f", "parameters": spec}}], tok)
            print("DONE ok", flush=True)
        except DgemmaStructError as e:
            print("DONE typed", type(e).__name__, flush=True)
        except Exception as e:
            print("DONE untyped", type(e).__name__, str(e)[:200], flush=True)
''')


def _run(code: str, stdin: str, timeout: float, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.run([sys.executable, "-c", code, *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_the_issue_crash_inputs_are_typed_or_served_in_a_subprocess():
    cases = [["json", s] for s in SCHEMAS] + [["grammar", g] for g in GRAMMARS] + [["tool", s] for s in TOOL_SCHEMAS]
    cases += [["grounded", s] for s in TOOL_SCHEMAS]  # grounded specs compile their %json parts the same way
    r = _run(_REPLAY, json.dumps(cases), timeout=600)
    lines = r.stdout.splitlines()
    last = [ln for ln in lines if ln.startswith("RUN")][-1:] or ["(none)"]
    assert r.returncode == 0, f"the interpreter died (rc {r.returncode}) on {last[0]}\n{r.stderr[-2000:]}"
    done = [ln for ln in lines if ln.startswith("DONE")]
    assert len(done) == len(cases)
    assert not [ln for ln in done if "untyped" in ln], done
    # the %json blocks with wide numbers are refused (typed), never handed to the engine
    assert all("typed GrammarError" in d for d, (k, _) in zip(done, cases) if k == "grammar")


_FUZZ = textwrap.dedent('''
    import json, sys
    import llguidance as llg
    from hypothesis import given, settings, strategies as st, HealthCheck
    from dgemma_struct.constraints.json_schema import prepare_json_schema
    from dgemma_struct.constraints.grammars import compile_grammar
    from dgemma_struct.constraints.specs import Grammar
    from dgemma_struct.constraints.tokenizer import get_tokenizer_info
    from dgemma_struct.errors import DgemmaStructError
    from dgemma_struct.testing import gemma3_style_tokenizer
    info = get_tokenizer_info(gemma3_style_tokenizer(300), [0])
    EDGE = [2 ** 63, -(2 ** 63), -(2 ** 63) + 1, 2 ** 63 - 1, -(2 ** 63) + 512, 2 ** 64, -(2 ** 64), 10 ** 30,
            -1e308, 1e308, -1.7976931348623157e308, -9.223372036854776e18, 9.223372036854776e18,
            -1.8446744073709552e19, 1.8446744073709552e19, -9.2233720368547e18, 0, -1, 5, 0.5]
    NUM = st.one_of(st.sampled_from(EDGE), st.floats(min_value=-1e300, max_value=1e300, allow_nan=False),
                    st.integers(-2 ** 70, 2 ** 70))
    KW = st.sampled_from(["const", "enum", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "eq", "pair"])

    def leaf(kw, v, typ):
        s = {"type": typ}
        if kw == "enum":
            s["enum"] = [v]
        elif kw == "eq":
            s.update(minimum=v, maximum=v)
        elif kw == "pair":
            s.update(minimum=v, maximum=v + 1)
        else:
            s[kw] = v
        return s

    WRAP = st.sampled_from(["root", "allOf", "anyOf", "prop", "items", "not", "json"])
    n = {"runs": 0}

    @settings(max_examples=int(sys.argv[1]), deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(KW, NUM, st.sampled_from(["integer", "number", ["integer", "null"]]), WRAP)
    def run(kw, v, typ, wrap):
        s = leaf(kw, v, typ)
        if wrap == "allOf":
            s = {"allOf": [{"type": "integer"}, {k: x for k, x in s.items() if k != "type"}]}
        elif wrap == "anyOf":
            s = {"anyOf": [s, {"type": "string"}]}
        elif wrap == "prop":
            s = {"type": "object", "properties": {"a": s}, "required": ["a"]}
        elif wrap == "items":
            s = {"type": "array", "items": s, "minItems": 1}
        elif wrap == "not":
            s = {"not": s}
        print("RUN", wrap, json.dumps(s), flush=True)
        n["runs"] += 1
        try:
            if wrap == "json":
                compile_grammar(Grammar("start: %json " + json.dumps(s)), info)
            else:
                prepare_json_schema(s, info.lltok)
        except DgemmaStructError:
            pass

    run()
    print("FUZZED", n["runs"], flush=True)
''')


@pytest.mark.parametrize("examples", [300])
def test_hypothesis_drives_the_number_screen_in_a_subprocess(examples):
    r = _run(_FUZZ, "", 600, str(examples))
    runs = [ln for ln in r.stdout.splitlines() if ln.startswith("RUN")]
    assert r.returncode == 0, f"the interpreter died (rc {r.returncode}) on {runs[-1:]}\n{r.stderr[-2000:]}"
    assert "FUZZED" in r.stdout and len(runs) >= examples // 2, r.stdout[-500:] + r.stderr[-2000:]


def test_the_screen_rule_is_one_rule_for_ints_and_floats():
    from dgemma_struct.constraints.literals import has_wide_number, is_wide_number

    assert all(is_wide_number(v) for v in FLOATS + [2 ** 63, -(2 ** 63), 2 ** 64, -9223372036854775807, 10 ** 400])
    assert not any(is_wide_number(v) for v in [True, 0, 2 ** 62, -9.2233720368547e18, 1.5, "9" * 30, None])
    assert has_wide_number({"a": [1, {"b": -1e308}]}) and not has_wide_number({"a": [1, {"b": -1e308}]}, floats=False)
