"""Plain typed pydantic models on the embedded model (issue #32): eight models of the typed corpus
(date, AwareDatetime, UUID, IPv4Address + timedelta, IntEnum, Decimal, HttpUrl, time) in diffusion
mode, one seed. Every request returns a value the model validates, none ends in GenerationFailed, and
no number literal is beyond its type (an integer outside int64, > 17 significant digits, overflow)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from dgemma_struct import generate

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


corpus = _load("typed_corpus")
bench = _load("typed_models")


def test_the_output_checks_catch_what_they_count():
    assert bench.number_beyond_type("9" * 40)
    assert bench.number_beyond_type("1" + "0" * 19)                      # above int64
    assert bench.number_beyond_type("0.12345678901234567890")            # 20 significant digits
    assert bench.number_beyond_type("1e400")                             # overflows a double
    assert not bench.number_beyond_type("-9223372036854775808")          # int64's minimum
    assert not bench.number_beyond_type("0.000000000001234")
    assert bench.number_literals('{"a":1,"b":[2.5,-3e2]}') == ["1", "2.5", "-3e2"]
    cut_off = '{"id":"00601400-6300-0044-4440-444444400440","n":[5555555555555555,-1234567890123456789.5'
    assert bench.number_literals(cut_off) == ["5555555555555555", "-1234567890123456789.5"]   # not the UUID
    assert bench.long_strings({"a": ["x" * 201, "y" * 200]}) == ["x" * 201]


@pytest.mark.parametrize("name", corpus.E2E_CASES)
def test_a_plain_typed_model_gives_a_valid_value(embedded_runtime, name):
    case = corpus.case(name)
    res = generate(case.prompt, case.model, runtime=embedded_runtime, seed=0, mode="diffusion",
                   return_details=True)       # GenerationFailed would fail the test here
    value = case.model.model_validate_json(res.text)
    assert value == res.value
    big = [n for n in bench.number_literals(res.text) if bench.number_beyond_type(n)]
    assert not big, f"{name}: number literals beyond their type: {big} in {res.text!r}"
