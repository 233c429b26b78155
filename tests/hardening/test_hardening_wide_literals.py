"""#26.5: wide integer literals in ``const`` / ``enum`` (beyond int64: ``2**70``, integral floats such as
``-1e308`` under ``"type": "integer"``) are emitted *exactly* into the grammar, as quoted Lark literals
(llguidance never reads them as numbers), instead of being left to validation, which the model never
meets by chance. The inputs are crash inputs of the engine, so generation runs in a subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

W = 2 ** 70
CASES = [  # (schema, the wide value every output must hold, where)
    ({"type": "integer", "const": W}, W, []),
    ({"const": -W}, -W, []),
    ({"type": "integer", "const": -1e308}, -1e308, []),
    ({"type": "integer", "const": -9.223372036854776e18}, -9.223372036854776e18, []),
    ({"type": "integer", "enum": [W, W + 1]}, None, []),
    ({"type": "object", "properties": {"a": {"type": "integer", "const": W}, "b": {"type": "boolean"}},
      "required": ["a"]}, W, ["a"]),
    ({"type": "object", "properties": {"n": {"type": "string", "maxLength": 2}, "a": {"const": -W}},
      "required": ["n", "a"], "additionalProperties": False}, -W, ["a"]),
    ({"type": "array", "items": {"type": "integer", "const": W}, "minItems": 1, "maxItems": 2}, W, [0]),
    ({"anyOf": [{"type": "integer", "const": W}, {"type": "null"}]}, None, []),
    ({"type": ["object", "null"], "properties": {"a": {"const": W}}, "required": ["a"]}, None, []),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/w"}}, "required": ["a"],   # a pydantic-style model
      "$defs": {"w": {"type": "object", "properties": {"v": {"const": W}}, "required": ["v"]}}}, W, ["a", "v"]),
]
TREE = {"$defs": {"node": {"type": "object", "properties": {"v": {"const": -W}, "kids": {
    "type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 1}}, "required": ["v"]}}, "$ref": "#/$defs/node"}

_GEN = textwrap.dedent('''
    import json, sys
    import dgemma_struct as ds
    from dgemma_struct.errors import DgemmaStructError
    from dgemma_struct.testing import tiny_runtime
    rt = tiny_runtime()
    for s in json.loads(sys.stdin.read()):
        print("RUN", json.dumps(s), flush=True)
        for seed in (0, 1):
            try:
                v = ds.generate_json("x", s, runtime=rt, max_new_tokens=160, max_repairs=0, fallback=False, seed=seed)
                print("VALUE", json.dumps(v), flush=True)
            except DgemmaStructError as e:
                print("VALUE", json.dumps({"typed": type(e).__name__, "msg": str(e)[:200]}), flush=True)
''')


def _run(code: str, stdin: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True, text=True, timeout=600,
                          env=env)


def _at(v, where):
    for k in where:
        v = v[k]
    return v


def test_wide_consts_and_enums_are_generated_exactly_in_a_subprocess():
    r = _run(_GEN, json.dumps([s for s, _, _ in CASES]))
    runs = [ln for ln in r.stdout.splitlines() if ln.startswith("RUN")]
    assert r.returncode == 0, f"the interpreter died (rc {r.returncode}) on {runs[-1:]}\n{r.stderr[-2000:]}"
    values = [json.loads(ln[6:]) for ln in r.stdout.splitlines() if ln.startswith("VALUE")]
    assert len(values) == 2 * len(CASES), r.stdout[-2000:]
    for i, (schema, want, where) in enumerate(CASES):
        for v in values[2 * i:2 * i + 2]:
            assert not (isinstance(v, dict) and "typed" in v), (schema, v)  # before: GenerationFailed, always
            if want is not None:
                got = _at(v, where)
                assert got == want and type(got) is type(want), (schema, v)
            elif "enum" in schema:
                assert v in schema["enum"], (schema, v)
            else:
                assert v is None or v in (W, {"a": W}), (schema, v)


def test_the_grammar_spells_wide_literals_as_quoted_text(rt):
    from dgemma_struct.constraints import compile_constraint
    from dgemma_struct.constraints.literals import screen_lark_json

    for schema, lit in [({"type": "integer", "const": W}, str(W)), ({"type": "integer", "const": -1e308}, "-1e+308"),
                        ({"type": "object", "properties": {"a": {"enum": [W, 3]}}, "required": ["a"]}, str(W)),
                        ({"type": ["object", "null"], "properties": {"a": {"const": W}}, "required": ["a"]}, str(W))]:
        c = compile_constraint(schema, tokenizer=rt.tokenizer)
        assert json.dumps(lit) in c.grammar, c.grammar          # a quoted Lark literal
        screen_lark_json(c.grammar)                              # no %json block holds a wide number
        assert c.matches(lit if "properties" not in schema else "{\"a\":" + str(W) + "}")
        assert not c.matches(str(W + 1) if "properties" not in schema else "{\"a\":" + str(W + 1) + "}")


def test_a_recursive_ref_keeps_the_literal_exact_at_every_level(rt):
    from dgemma_struct.constraints import compile_constraint

    c = compile_constraint(TREE, tokenizer=rt.tokenizer)
    assert json.dumps(str(-W)) in c.grammar
    assert c.matches(f'{{"v":{-W},"kids":[{{"v":{-W},"kids":[]}}]}}')
    assert not c.matches(f'{{"v":{-W},"kids":[{{"v":5}}]}}') and not c.matches(f'{{"v":{-W},"kids":[{{}},{{}}]}}')


def test_wide_literals_the_lark_form_cannot_reach_still_compile(rt):
    """Under ``not`` or in a tuple the literal stays out of the grammar (the superset; validation decides)."""
    from dgemma_struct.constraints import compile_constraint

    c = compile_constraint({"type": "integer", "not": {"const": W}}, tokenizer=rt.tokenizer)
    assert c.matches("5") and not c.matches(str(W))
    c = compile_constraint({"type": "array", "prefixItems": [{"const": W}], "items": False}, tokenizer=rt.tokenizer)
    assert c.matches(f"[{W}]") and not c.matches("[5]")


NARROW = [({"type": "number", "minimum": 1e-300, "maximum": 1e-299}, 1e-300),
          ({"type": "number", "minimum": 0, "maximum": 1e-300}, 0.0),
          ({"type": "number", "exclusiveMinimum": 1e-300, "exclusiveMaximum": 3e-300}, 2e-300),
          ({"type": "integer", "minimum": -1e-300, "maximum": 1e-300}, 0)]


def test_a_range_narrower_than_any_written_number_pins_one_valid_value(rt):
    """#26.5, extreme float bounds: a tiny bound leaves the grammar (llguidance cannot compile it), and a
    range that narrow would then never be met; the grammar copy pins one valid value, spelled short."""
    import dgemma_struct as ds
    from dgemma_struct.constraints import compile_constraint

    for schema, want in NARROW:
        c = compile_constraint(schema, tokenizer=rt.tokenizer)
        assert c.matches(json.dumps(want)) and not c.matches("1"), (schema, c.grammar)
        for seed in (0, 1):
            got = ds.generate_json("x", schema, runtime=rt, max_new_tokens=24, max_repairs=0, fallback=False,
                                   seed=seed)
            assert got == want, (schema, got)
    c = compile_constraint({"type": "number", "minimum": -1e-300, "maximum": 5}, tokenizer=rt.tokenizer)
    assert c.matches("3.5") and c.matches("0")  # a wide range keeps its superset grammar


def test_wide_float_literals_without_an_integer_are_spelled_short_and_exactly(rt):
    """A wide float ``const`` / ``enum`` with no ``integer`` anywhere was handed to llguidance, which
    spells it as all its digits: 301 for ``1e300`` (a LengthError: "every output needs at least 309
    tokens" on JSONSchemaBench), and digits the validator then refuses (``10**300`` is not the double
    ``1e300``). It is now written as its JSON text, where the structure allows."""
    from dgemma_struct.constraints import compile_constraint

    c = compile_constraint({"enum": [1e300, 2]}, tokenizer=rt.tokenizer)
    assert c.matches("1e+300") and c.matches("2") and not c.matches("1" + "0" * 300) and not c.matches("3")
    c = compile_constraint({"type": "object", "properties": {"a": {"enum": [1e300, "x"]}}, "required": ["a"]},
                           tokenizer=rt.tokenizer)
    assert c.matches('{"a":1e+300}') and c.matches('{"a":"x"}') and not c.matches('{"a":5}')


def test_an_all_of_with_finite_branches_is_their_common_literals(rt):
    """``allOf: [{enum: [1e308]}, {not: ...}]`` (JSONSchemaBench Synthesized): the grammar copy dropped
    the enum and wrote no literal (only one-branch ``allOf`` was reached), so any number was drafted
    and validation refused it four times. The grammar is now the branches' common literals (validation
    still checks the rest)."""
    from dgemma_struct.constraints import compile_constraint

    s = {"allOf": [{"enum": [1e308]}, {"not": {"multipleOf": 0.123456789, "type": "integer"}}]}
    c = compile_constraint(s, tokenizer=rt.tokenizer)
    assert c.grammar_accepts("1e+308") and not c.grammar_accepts("-143") and c.matches("1e+308")
    c = compile_constraint({"allOf": [{"enum": [1e308, -1e308, 5]}, {"const": -1e308}]}, tokenizer=rt.tokenizer)
    assert c.matches("-1e+308") and not c.grammar_accepts("1e+308") and not c.grammar_accepts("5")


def test_multiple_of_is_exact_for_huge_quotients():
    """``1e308 / 0.123456789`` is not an integer; a 28-digit Decimal quotient rounded it to one, so
    ``not: {multipleOf: 0.123456789}`` refused 1e308 (the JSON-Schema-Test-Suite's "float division = inf")."""
    from dgemma_struct.constraints.json_schema import make_validator

    cases = [(0.123456789, 1e308, False), (0.1, 0.3, True), (0.0001, 0.0075, True), (0.0001, 0.00751, False),
             (1e-8, 12391239123, True), (0.01, 1e308, True), (1.5, 4.5, True), (2, 7, False), (3, 2 ** 70 * 3, True)]
    for step, x, ok in cases:
        assert make_validator({"multipleOf": step}).is_valid(x) is ok, (step, x)
    assert make_validator({"not": {"type": "integer", "multipleOf": 0.123456789}}).is_valid(1e308)
