"""Budget closing at its root (issue #12): ``closing.closing_plan`` finds a completion whenever
the grammar can still be closed, and prefers completions that pass validation (formats)."""
from __future__ import annotations

import json
import time

import pytest

from dgemma_struct.constraints import Regex, compile_constraint
from dgemma_struct.constraints.closing import closing_candidates, closing_plan

# vLLM's ``sample_json_schema`` (vllm tests/conftest.py, Apache-2.0), the schema of its structured-output tests
VLLM_SAMPLE_JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "email": {"type": "string", "pattern": r"^\S+@\S+\.\S+$"},
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 10}, "minItems": 3},
        "work_history": {"type": "array", "items": {"type": "object", "properties": {
            "company": {"type": "string"}, "duration": {"type": "number", "minimum": 0.0, "maximum": 100.0},
            "position": {"type": "string"}}, "required": ["company", "position"]}, "maxItems": 3},
    },
    "required": ["name", "age", "email", "skills", "work_history"],
}


def _close(c, prefix: str, max_n: int = 96):
    w = c.canvas_walker()
    toks = c.tokenize(prefix)
    w.commit(toks)
    t0 = time.perf_counter()
    plan = closing_plan(w, *closing_candidates(c.tokenizer_info)[:2], max_n,
                          *closing_candidates(c.tokenizer_info)[2:])
    dt = time.perf_counter() - t0
    assert plan is not None, f"no closing plan after {prefix!r}"
    text = c.tokenizer_info.lltok.decode_str(toks + plan)
    assert c.grammar_accepts(text), text
    return text, dt


@pytest.mark.parametrize("prefix", [
    '{"name":"Ann","age":3,"email":"a.b-c.d-',          # local part: the greedy walk used up '.' and '-'
    '{"name":"Ann","age":3,"email":"x@y',               # domain without a dot yet
    '{"name":"Ann","age":3,"email":"x@y.',              # dot without a TLD
    '{"name":"Ann","age":3,"email":"x@y.z","skills":["a"',  # minItems 3 still to satisfy
    '{"name":"Ann","age":3,"email":"x@y.z","skills":["a","b","c"],"work_history":[{"company":"C","duration":1',
    '{"name":"A',
])
def test_vllm_sample_schema_closes(hf_tok, prefix):
    c = compile_constraint(VLLM_SAMPLE_JSON_SCHEMA, tokenizer=hf_tok)
    text, dt = _close(c, prefix)
    assert c.validate_text(text).ok, text
    assert dt < 5.0


def test_date_format_closing_validates(hf_tok):
    c = compile_constraint({"type": "object", "properties": {"d": {"type": "string", "format": "date"}},
                            "required": ["d"]}, tokenizer=hf_tok)
    for prefix in ['{"d":"', '{"d":"20', '{"d":"2024-0']:
        text, _ = _close(c, prefix)
        out = c.validate_text(text)
        assert out.ok, (text, out.errors)


def test_regex_that_greedy_cannot_close(hf_tok):
    # after "ab" the greedy byte walk prefers unused punctuation; the shortest completion is "@b.cc"
    c = compile_constraint(Regex(r"[a-z.\-]+@[a-z]+\.[a-z]{2,}"), tokenizer=hf_tok)
    text, _ = _close(c, "a.-b", max_n=12)
    assert text.startswith("a.-b") and "@" in text
    w = c.canvas_walker()
    w.commit(c.tokenize("a"))
    assert closing_plan(w, *closing_candidates(c.tokenizer_info)[:2], 2, *closing_candidates(c.tokenizer_info)[2:]) \
        is None  # '@' + one letter + '.' + two letters: at least 5 tokens of these candidates


def test_candidates_cached_per_tokenizer(hf_tok):
    c = compile_constraint({"type": "string"}, tokenizer=hf_tok)
    a = closing_candidates(c.tokenizer_info)
    assert closing_candidates(c.tokenizer_info) is a
    assert len(a[3]) == len(a[2]) and b'"' in a[3]
