"""Hardening of the constraint layer (issue #15): inputs known to crash or hang llguidance never reach
it, every failure is a typed error with a bounded message, and validation is exact."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dgemma_struct.constraints import Choice, Grammar, JsonSchema, Regex, compile_constraint
from dgemma_struct.constraints.safety import (MAX_ERROR_CHARS, MAX_SCHEMA_DEPTH, MAX_SPEC_BYTES, clip,
                                              engine_guard, is_wide_int)
from dgemma_struct.errors import (ChoiceError, ConstraintEngineError, ConstraintError, DgemmaStructError,
                                  GrammarError, RegexError, SchemaError)

N63 = -2 ** 63
# values that segfaulted llguidance 1.9 (double value == -2**63) or raised ValueError (>= 2**64)
CRASHERS = [
    {"const": N63}, {"const": N63 + 1}, {"const": N63 + 512}, {"enum": [1, N63]}, {"enum": [N63 + 2]},
    {"type": "integer", "minimum": N63}, {"type": "integer", "maximum": N63}, {"type": "integer", "minimum": N63 - 1},
    {"type": "integer", "exclusiveMinimum": N63}, {"type": "integer", "exclusiveMaximum": 2 ** 64},
    {"type": "number", "multipleOf": 2 ** 64}, {"type": "string", "maxLength": 2 ** 64},
    {"type": "array", "maxItems": 2 ** 63}, {"type": "object", "maxProperties": 2 ** 64 - 1},
    {"const": 2 ** 64}, {"const": -2 ** 64}, {"enum": [2 ** 70]}, {"default": 2 ** 64, "type": "integer"},
    {"type": "object", "properties": {"a": {"const": N63}}, "required": ["a"]},
    {"anyOf": [{"const": N63}, {"type": "string"}]},
    {"const": [N63]}, {"const": {"x": 2 ** 65}},
]


def test_crashing_inputs_in_a_subprocess():
    """The known crashers go through compile_constraint (and matches) in a child process: each gets a
    typed result (compiled, or a DgemmaStructError) and the child exits 0 (a native crash would kill it)."""
    emb = Path(__file__).resolve().parents[2] / "src" / "dgemma_struct" / "embedded"
    code = textwrap.dedent(f"""
        import json, sys
        from transformers import AutoTokenizer
        from dgemma_struct.constraints import compile_constraint
        from dgemma_struct.errors import DgemmaStructError
        tok = AutoTokenizer.from_pretrained({str(emb)!r})
        out = []
        for s in json.loads(sys.stdin.read()):
            try:
                c = compile_constraint(s, tokenizer=tok)
                w = c.canvas_walker()
                w.walk(c.tokenize("-9223372036854775808"))
                out.append(["ok", c.matches("-9223372036854775808"), c.matches("5")])
            except DgemmaStructError as e:
                out.append([type(e).__name__, len(str(e))])
        print("RESULT" + json.dumps(out))
    """)
    p = subprocess.run([sys.executable, "-c", code], input=json.dumps(CRASHERS), capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    res = json.loads(p.stdout.split("RESULT", 1)[1])
    assert len(res) == len(CRASHERS)
    by = dict(zip(map(json.dumps, CRASHERS), res))
    # exact validation of what the grammar had to leave out
    assert by[json.dumps({"const": N63})] == ["ok", True, False]
    assert by[json.dumps({"enum": [1, N63]})] == ["ok", True, False]
    assert by[json.dumps({"type": "integer", "minimum": N63})] == ["ok", True, True]
    # a maximum at or below -2**63 leaves only values the model never writes: refused, naming the keyword (#26)
    assert by[json.dumps({"type": "integer", "maximum": N63})][0] == "SchemaError"
    assert by[json.dumps({"const": 2 ** 64})][:2] == ["ok", False]
    for r in res:
        assert r[0] == "ok" or (r[0].endswith("Error") and r[1] <= 2 * MAX_ERROR_CHARS)


def test_wide_int_rule():
    assert is_wide_int(N63) and is_wide_int(N63 + 512) and is_wide_int(2 ** 64) and is_wide_int(10 ** 400)
    assert not is_wide_int(N63 + 1024) and not is_wide_int(2 ** 62) and not is_wide_int(True)
    assert not is_wide_int(1.5e300)


def test_const_near_min_int64_kept_exact(hf_tok):
    c = compile_constraint({"const": N63 + 7}, tokenizer=hf_tok)
    assert "const" in c.semantic_keywords
    assert c.matches(str(N63 + 7)) and not c.matches(str(N63 + 8)) and not c.matches('"x"')


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_numbers(hf_tok, bad):
    with pytest.raises(SchemaError, match="not a JSON number"):
        compile_constraint({"type": "number", "maximum": bad}, tokenizer=hf_tok)


def test_non_finite_in_json_text(hf_tok):
    with pytest.raises(SchemaError):
        compile_constraint(JsonSchema(json.dumps({"type": "number", "maximum": 1}).replace("1}", "1e400}")), tokenizer=hf_tok)


def _nested(depth: int) -> dict:
    s: dict = {"type": "string"}
    for _ in range(depth):
        s = {"type": "object", "properties": {"a": s}}
    return s


def test_depth_limit(hf_tok):
    ok = _nested(MAX_SCHEMA_DEPTH // 2 - 2)  # two containers per level
    c = compile_constraint(ok, tokenizer=hf_tok)
    assert c.kind == "json"
    with pytest.raises(SchemaError, match=f"more than {MAX_SCHEMA_DEPTH} levels"):
        compile_constraint(_nested(MAX_SCHEMA_DEPTH), tokenizer=hf_tok)
    with pytest.raises(SchemaError, match="nested too deeply"):
        compile_constraint(_nested(5000), tokenizer=hf_tok)  # far beyond Python's recursion limit


def test_cycles(hf_tok):
    s: dict = {"type": "object", "properties": {}}
    s["properties"]["self"] = s
    with pytest.raises(SchemaError, match="cycle"):
        compile_constraint(s, tokenizer=hf_tok)
    lst: list = []
    lst.append(lst)
    with pytest.raises(SchemaError, match="cycle"):
        compile_constraint({"enum": lst}, tokenizer=hf_tok)


@pytest.mark.parametrize("kw", ["not", "if", "oneOf", "anyOf", "allOf"])
def test_ref_cycles_without_progress(hf_tok, kw):
    sub = {"$ref": "#"}
    s = {kw: [sub, {"type": "string"}] if kw.endswith("Of") else sub}
    with pytest.raises(SchemaError, match="consumes no input"):
        compile_constraint(s, tokenizer=hf_tok)
    with pytest.raises(SchemaError, match="consumes no input"):
        compile_constraint({"$defs": {"a": {"not": {"$ref": "#/$defs/b"}}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}},
                            "$ref": "#/$defs/a"}, tokenizer=hf_tok)


def test_recursive_schema_through_properties_still_works(hf_tok):
    s = {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                              "kids": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                                                       "maxItems": 2}},
                            "required": ["v"]}}, "$ref": "#/$defs/node"}
    c = compile_constraint(s, tokenizer=hf_tok)
    assert c.matches('{"v":1,"kids":[{"v":2}]}') and not c.matches('{"kids":[]}')


def test_multiple_of_decimal(hf_tok):
    c = compile_constraint({"type": "number", "multipleOf": 0.1, "minimum": 0.25, "maximum": 0.35}, tokenizer=hf_tok)
    # the grammar is exactly the multiples in range, in their shortest spelling (#26: llguidance's own
    # compile accepted nothing here); "0.30" is valid but not a spelling the grammar writes
    assert c.matches("0.3") and not c.grammar_accepts("0.30") and c.validate_text("0.30").ok
    assert not c.matches("0.2") and not c.matches("0.31") and not c.matches("0.4")
    c2 = compile_constraint({"type": "number", "multipleOf": 0.25}, tokenizer=hf_tok)
    assert c2.matches("1.0") and c2.matches("0.75") and not c2.matches("0.3")


def test_numbers_beyond_double_are_invalid(hf_tok):
    c = compile_constraint({"type": "number"}, tokenizer=hf_tok)
    out = c.validate_text("3e616")
    assert not out.ok and "IEEE double" in str(out.errors[0])
    assert not c.matches("-3e616") and c.matches("3e16")


def test_lark_import_rejected(hf_tok, tmp_path):
    secret = tmp_path / "secret.lark"
    secret.write_text("SECRET_RULE: \"top secret line\"\n")
    for imp in [f"%import .secret (SECRET_RULE)", "%import secret.SECRET_RULE", f"  %import {tmp_path}.x"]:
        with pytest.raises(GrammarError, match="not allowed") as ei:
            compile_constraint(Grammar(f"start: SECRET_RULE\n{imp}\n"), tokenizer=hf_tok)
        assert "top secret" not in str(ei.value)
    c = compile_constraint(Grammar("start: NUMBER\n%import common.NUMBER\n"), tokenizer=hf_tok)
    assert c.matches("42")


def test_error_messages_bounded(hf_tok):
    big = "start: " + " | ".join(f'"w{i}"' for i in range(20000)) + " | (\n"  # ~200 KB, broken at the end
    with pytest.raises(GrammarError) as ei:
        compile_constraint(Grammar(big), tokenizer=hf_tok)
    assert len(str(ei.value)) < 3 * MAX_ERROR_CHARS
    with pytest.raises(RegexError) as ei:
        compile_constraint(Regex("a" * 50000 + "("), tokenizer=hf_tok)
    assert len(str(ei.value)) < 3 * MAX_ERROR_CHARS
    with pytest.raises(SchemaError) as ei:
        compile_constraint({"type": "string", "pattern": 5, "description": "x" * 100000}, tokenizer=hf_tok)
    assert len(str(ei.value)) < 3 * MAX_ERROR_CHARS
    assert len(clip("y" * 10 ** 6)) < MAX_ERROR_CHARS + 60


def test_size_limits(hf_tok):
    with pytest.raises(RegexError, match="too long"):
        compile_constraint(Regex("a" * (MAX_SPEC_BYTES + 1)), tokenizer=hf_tok)
    with pytest.raises(GrammarError, match="too long"):
        compile_constraint(Grammar("start: \"" + "a" * MAX_SPEC_BYTES + "\""), tokenizer=hf_tok)
    with pytest.raises(ChoiceError, match="too long"):
        compile_constraint(Choice(["a" * 1000] * 1001), tokenizer=hf_tok)
    with pytest.raises(ChoiceError, match="surrogate"):
        compile_constraint(Choice(["ok", "\ud800"]), tokenizer=hf_tok)


def test_engine_guard_converts_panics_only():
    Panic = type("PanicException", (BaseException,), {})
    with pytest.raises(ConstraintEngineError, match="while testing"):
        with engine_guard("testing"):
            raise Panic("boom")
    with pytest.raises(SchemaError):
        with engine_guard("testing", SchemaError):
            raise Panic("boom")
    with pytest.raises(KeyboardInterrupt):
        with engine_guard("testing"):
            raise KeyboardInterrupt
    with pytest.raises(ValueError):
        with engine_guard("testing"):
            raise ValueError("plain")


def test_every_error_is_typed(hf_tok):
    bad_specs = [{"type": 5}, {"$ref": "#/nope"}, {"minLength": 3, "maxLength": 1}, {"enum": []}, {1: "x"},
                 {"type": "object", "properties": {"a": {"type": "integer", "minimum": {}}}}]
    for s in bad_specs:
        with pytest.raises(DgemmaStructError):
            compile_constraint(s, tokenizer=hf_tok)
    with pytest.raises(ConstraintError):
        compile_constraint({"type": "string"}, tokenizer=object())


# -- matcher error state (issue #15.3): the walker never returns an all-zero row ------------------
from dgemma_struct.constraints import bitmask_to_bool  # noqa: E402
from dgemma_struct.errors import ConstraintCompileTimeout, ConstraintLimitError  # noqa: E402
import numpy as np  # noqa: E402

DEAD_ENDS = {
    "only_infinite_objects": {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
    "only_infinite_arrays": {"type": "array", "items": {"$ref": "#"}, "minItems": 1},
    "1000_optional_properties": {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(1000)}},
}


@pytest.mark.parametrize("name", sorted(DEAD_ENDS))
def test_dead_end_masks_are_typed_errors(hf_tok, name):
    c = compile_constraint(DEAD_ENDS[name], tokenizer=hf_tok)
    w = c.canvas_walker()
    toks: list[int] = []
    with pytest.raises(ConstraintEngineError) as ei:
        for _ in range(40):
            r = w.walk(toks)
            row = bitmask_to_bool(r.bitmasks[r.n_valid][None], c.vocab_size)[0]
            assert row.any(), "the walker returned an all-zero mask row"
            toks.append(int(np.flatnonzero(row)[0]))
    assert isinstance(ei.value, ConstraintLimitError) and isinstance(ei.value, ConstraintCompileTimeout)
    assert "no token is allowed" in str(ei.value)
    # the walker is still usable: the empty draft's mask is valid
    assert w.walk([]).bitmasks[0].any()


def test_walker_matcher_error_state_is_engine_error(hf_tok):
    c = compile_constraint({"type": "integer"}, tokenizer=hf_tok)
    w = c.canvas_walker()
    w._work.consume_tokens(c.tokenize('"x"'))  # the engine's matcher driven into its error state
    assert w._work.is_error()
    with pytest.raises(ConstraintEngineError, match="error state"):
        w.walk(c.tokenize("12"))
    r = w.walk(c.tokenize("12"))  # reset after the fault: walking works again
    assert r.n_valid == len(c.tokenize("12"))
