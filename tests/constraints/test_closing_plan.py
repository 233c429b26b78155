"""Budget closing at its root (issue #12): ``closing.closing_plan`` finds a completion whenever
the grammar can still be closed, and prefers completions that pass validation (formats)."""
from __future__ import annotations

import json
import pathlib
import re
import time

import pytest

from dgemma_struct.constraints import Regex, compile_constraint
from dgemma_struct.constraints.closing import closing_candidates, closing_plan, plan_still_closes
from dgemma_struct.constraints.closing_search import run_shape, stepwise_closing

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


def test_email_domain_after_long_run_closes_with_letter_tld(hf_tok):
    # vLLM's sample_json_schema email: deep in the domain the shortest completion is '.' + two
    # letters; the old beam search merged '.1' with '.a' (equal masks) and found no plan at all
    schema = json.loads((pathlib.Path(__file__).resolve().parents[1] / "data" / "vllm" /
                         "sample_json_schema.json").read_text())
    c = compile_constraint(schema, tokenizer=hf_tok)
    prefix = ('{"name":"A","age":1,"skills":[],"grade":"A","email":"x@' + "mekillsel9Xquantity" * 6)
    text, dt = _close(c, prefix, max_n=40)
    assert c.validate_text(text).ok, text
    assert text.endswith('","work_history":[]}') and len(text) - len(prefix) <= 25, text
    assert dt < 5.0


def test_regex_closes_through_class_without_representative(hf_tok):
    # no fixed representative ('1', '0', 'a', 'A') is allowed after '#': the first allowed letter is tried
    c = compile_constraint(Regex(r"#(foo|bar)+@[xy]{2}"), tokenizer=hf_tok)
    text, _ = _close(c, "#foob", max_n=12)
    assert re.fullmatch(r"#(foo|bar)+@[xy]{2}", text), text
    w = c.canvas_walker()
    w.commit(c.tokenize("#"))  # the stepwise search alone (its local search starts with no candidate allowed)
    plan = stepwise_closing(w, *closing_candidates(c.tokenizer_info)[:2], 12, *closing_candidates(c.tokenizer_info)[2:])
    assert plan is not None and re.fullmatch(r"#(foo|bar)+@[xy]{2}", "#" + c.tokenizer_info.lltok.decode_str(plan))


def test_run_shape_and_plan_reuse(hf_tok):
    assert run_shape(b'x.1a') == b"1a" and run_shape(b"ab.") == b"" and run_shape(b"Zz9q") == b"a1a"
    c = compile_constraint({"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]},
                           tokenizer=hf_tok)
    w = c.canvas_walker()
    w.commit(c.tokenize('{"s":"ab'))
    plan = closing_plan(w, *closing_candidates(c.tokenizer_info)[:2], 8, *closing_candidates(c.tokenizer_info)[2:])
    assert plan is not None and plan_still_closes(w, plan)
    w.commit(c.tokenize("cd"))  # the string grows: the same plan still closes it
    assert plan_still_closes(w, plan)
    assert not plan_still_closes(w, plan[1:])  # without the closing quote it does not


def test_a_reused_plan_must_pass_the_masks_not_only_the_matcher(hf_tok):
    # a plan made inside a string (``"`` ``,"`` ...) stops being one the walker walks when the string
    # reaches its maxLength: the bytes ``","b":"`` are then forced and the mask allows only their own
    # tokens (``","``), while the matcher still consumes ``"`` ``,"`` (the guide committed such a plan)
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 4}, "b": {"enum": ["x"]}},
              "required": ["a", "b"], "additionalProperties": False}
    c = compile_constraint(schema, tokenizer=hf_tok)
    cands = closing_candidates(c.tokenizer_info, max_len=None)
    w = c.canvas_walker()
    w.commit(c.tokenize('{"a":"'))
    plan = closing_plan(w, *cands[:2], 20, *cands[2:])
    assert plan is not None and plan_still_closes(w, plan)
    w.commit(c.tokenize("yyyy"))
    eos = c.eos_token_id
    assert w.walk(plan + [eos]).n_valid == 0, "the scenario needs a plan the masks refuse at maxLength"
    assert not plan_still_closes(w, plan)
    fresh = closing_plan(w, *cands[:2], 20, *cands[2:])
    assert fresh is not None and w.walk(fresh + [eos]).n_valid == len(fresh) + 1
    assert c.tokenizer_info.lltok.decode_str(fresh) == '","b":"x"}'
