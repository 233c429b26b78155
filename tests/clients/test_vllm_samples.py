"""vLLM's own structured-output test samples (tests/data/vllm, copied from vLLM's test suite), each
sent through the ``openai`` SDK to a real uvicorn on 127.0.0.1 in the request shapes vLLM documents:
OpenAI's ``response_format`` json_schema, ``extra_body={"structured_outputs": {...}}`` and the older
``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar`` fields, with vLLM's ``n``.

Every answer is checked independently of the server (jsonschema, ``re.fullmatch``, membership, a
Lark parse), exactly as vLLM's tests check theirs; a rejection must be a documented 4xx with an
OpenAI error body. The model is the tiny random runtime: these tests check validity, not quality.
"""
from __future__ import annotations

import json
import re
import time

import jsonschema
import openai
import pytest
from clients_harness import vllm_json, vllm_text
from lark import Lark

PROMPT = "Give an example JSON for an employee profile that fits this schema."


def _chat(oai, model_id, content=PROMPT, **kw):
    kw.setdefault("seed", 0)
    return oai.chat.completions.create(model=model_id, messages=[{"role": "user", "content": content}], **kw)


def _contents(resp, n=1):
    assert len(resp.choices) == n
    out = []
    for choice in resp.choices:
        assert choice.finish_reason == "stop", (choice.finish_reason, choice.message.content)
        assert choice.message.content is not None
        out.append(choice.message.content)
    return out


def _valid_json(text, schema):
    value = json.loads(text)
    jsonschema.validate(value, schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    return value


def _lark_parse(grammar_text, text):
    Lark(grammar_text).parse(text)  # raises on an invalid output


# ------------------------------------------------------------------ JSON Schema samples
JSON_CASES = [
    # (file, request shape, max_tokens, n); vLLM's own calls use max_tokens 500-1000 and n up to 3
    ("entrypoints_sample_json_schema.json", "response_format", 500, 1),
    ("sample_complex_json_schema.json", "structured_outputs", 300, 1),
    ("sample_definition_json_schema.json", "structured_outputs", 300, 2),
    ("entrypoints_sample_definition_json_schema.json", "guided_json", 300, 1),
    ("sample_enum_json_schema.json", "guided_json", 300, 1),
    ("unsupported_json_schema.json", "guided_json", 300, 1),   # xgrammar rejects it; we must not
    ("car_description_json_schema.json", "response_format", 200, 1),
    ("min_max_length_json_schema.json", "guided_json_string", 200, 1),
    ("no_additional_properties_json_schema.json", "structured_outputs", 200, 1),
]


def _json_request(shape, schema):
    if shape == "response_format":
        return {"response_format": {"type": "json_schema",
                                    "json_schema": {"name": "sample", "schema": schema, "strict": True}}}
    if shape == "structured_outputs":
        return {"extra_body": {"structured_outputs": {"json": schema}}}
    if shape == "guided_json":
        return {"extra_body": {"guided_json": schema}}
    if shape == "guided_json_string":  # vLLM accepts the schema as a JSON string too
        return {"extra_body": {"guided_json": json.dumps(schema)}}
    raise AssertionError(shape)


def _case_id(case):
    name = case.values[0] if hasattr(case, "values") else case[0]
    return name.removesuffix(".json")


@pytest.mark.parametrize("name, shape, max_tokens, n", JSON_CASES, ids=[_case_id(c) for c in JSON_CASES])
def test_vllm_json_schema_samples(oai, model_id, name, shape, max_tokens, n):
    schema = vllm_json(name)
    resp = _chat(oai, model_id, max_tokens=max_tokens, n=n, **_json_request(shape, schema))
    for text in _contents(resp, n):
        _valid_json(text, schema)


VLLM_EMPLOYEE_PROMPT = "Give an example JSON for an employee profile that fits this schema: {schema}"


@pytest.mark.parametrize("prompt", [
    pytest.param(VLLM_EMPLOYEE_PROMPT, id="vllm-prompt"),
    pytest.param("Give an example.", id="short-prompt"),
])
def test_vllm_sample_json_schema_at_500_tokens(oai, model_id, prompt):
    """vLLM's main schema (tests/v1/entrypoints/conftest.py) at max_tokens=500, the smallest budget
    vLLM's tests give it, with vLLM's own prompt; must be a 200, finish_reason "stop", valid. Bounded
    by a 90 s client timeout (a disconnect cancels the request server-side)."""
    schema = vllm_json("sample_json_schema.json")
    t0 = time.monotonic()
    try:
        resp = _chat(oai.with_options(timeout=90), model_id, prompt.format(schema=schema), max_tokens=500,
                     response_format={"type": "json_schema",
                                      "json_schema": {"name": "employee", "schema": schema, "strict": True}})
    except (openai.APITimeoutError, openai.APIStatusError) as exc:
        pytest.fail(f"no valid answer after {time.monotonic() - t0:.0f} s: {exc!r}")
    (text,) = _contents(resp)
    _valid_json(text, schema)


def test_vllm_json_object_n2(oai, model_id):
    """vLLM's json_object test: n=2, each a JSON object."""
    resp = _chat(oai, model_id, "Generate a JSON object with curly braces for a person with name and age "
                 "fields for John Smith who is 31 years old.", max_tokens=100, n=2,
                 extra_body={"structured_outputs": {"json_object": True}})
    for text in _contents(resp, 2):
        assert isinstance(json.loads(text), dict)


# ------------------------------------------------------------------ regex, choice, grammars
def test_vllm_regex_guided_regex_n3(oai, model_id):
    regex = vllm_text("sample_regex.txt")
    resp = _chat(oai, model_id, f"Give an example IPv4 address with this regex: {regex}", max_tokens=20, n=3,
                 extra_body={"guided_regex": regex})
    for text in _contents(resp, 3):
        assert re.fullmatch(regex, text, re.ASCII), text


def test_vllm_regex_completions_structured_outputs(oai, model_id):
    """/v1/completions, vLLM's completion-test shape: several prompts x n."""
    regex = vllm_text("sample_regex.txt")
    resp = oai.completions.create(model=model_id, prompt=[f"Give an example IPv4 address with this regex: {regex}",
                                                          "An IPv4 address:"],
                                  max_tokens=20, n=2, seed=0, extra_body={"structured_outputs": {"regex": regex}})
    assert len(resp.choices) == 4
    for choice in resp.choices:
        assert choice.finish_reason == "stop"
        assert re.fullmatch(regex, choice.text, re.ASCII), choice.text


@pytest.mark.parametrize("shape", ["guided_choice", "structured_outputs"])
def test_vllm_choice(oai, model_id, shape):
    choices = vllm_json("sample_guided_choice.json")
    extra = {"guided_choice": choices} if shape == "guided_choice" else {"structured_outputs": {"choice": choices}}
    resp = _chat(oai, model_id, "The best language for type-safe systems programming is ", max_tokens=10, n=2,
                 extra_body=extra)
    for text in _contents(resp, 2):
        assert text in choices


@pytest.mark.parametrize("name, shape", [("sample_sql_ebnf.gbnf", "structured_outputs"),
                                         ("sample_sql_lark.lark", "guided_grammar")])
def test_vllm_sql_grammars(oai, model_id, name, shape):
    """vLLM's EBNF (GBNF) and Lark SQL grammars; both outputs are parsed with the Lark sample (the
    two grammars define the same language, without whitespace)."""
    grammar = vllm_text(name)
    extra = {"guided_grammar": grammar} if shape == "guided_grammar" else {"structured_outputs": {"grammar": grammar}}
    resp = _chat(oai, model_id, "Generate a sql statement that selects col_1 from table_1 where it is equal to 1",
                 max_tokens=100, extra_body=extra)
    (text,) = _contents(resp)
    _lark_parse(vllm_text("sample_sql_lark.lark"), text)


def test_vllm_invalid_grammar_is_a_documented_400(oai, model_id):
    """vLLM's "not a grammar" sample: a 400 invalid_grammar with an OpenAI error body."""
    with pytest.raises(openai.BadRequestError) as info:
        _chat(oai, model_id, max_tokens=50, extra_body={"guided_grammar": vllm_text("invalid_grammar.txt")})
    err = info.value.body
    assert isinstance(err, dict) and err["type"] == "invalid_request_error" and err["code"] == "invalid_grammar"
    assert isinstance(err["message"], str) and err["message"]
