"""Budget closing end to end (issue 12): vLLM's ``sample_json_schema`` at ``max_new_tokens=500`` on the
tiny random runtime (the one the server tests serve) must end in a valid value within the budget.

Repairs and the AR fallback are off, so the first attempt itself must close in time: before the
fix the closing plan was ``None`` inside the email's domain (the beam search merged ``.1`` with
``.a`` and never wrote a two-letter TLD), the row ran out of tokens and the call raised
``LengthError`` after a minute of plan searches.
"""
from __future__ import annotations

import json
import pathlib
import time

import jsonschema
import pytest

from dgemma_struct import api
from dgemma_struct.testing import tiny_runtime as build_tiny_runtime

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "vllm"
VLLM_PROMPT = "Give an example JSON for an employee profile that fits this schema: {schema}"


@pytest.fixture(scope="module")
def server_runtime():
    """The server tests' runtime (``tiny_runtime()`` with its defaults)."""
    return build_tiny_runtime()


def _check(rt, name: str, prompt: str, max_tokens: int, seed: int):
    schema = json.loads((DATA / name).read_text())
    t0 = time.perf_counter()
    res = api.generate([{"role": "user", "content": prompt.format(schema=schema)}], schema, runtime=rt,
                       max_new_tokens=max_tokens, seed=seed, max_repairs=0, fallback=False, timeout_s=60,
                       return_details=True)
    dt = time.perf_counter() - t0
    jsonschema.validate(json.loads(res.text), schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    assert res.stats.finish_reason == "stop"
    assert len(res.token_ids) < max_tokens
    assert res.stats.budget_closing  # the random model never ends by itself: closing did it
    return dt


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vllm_sample_json_schema_closes_at_500_tokens(server_runtime, seed):
    dt = _check(server_runtime, "sample_json_schema.json", VLLM_PROMPT, 500, seed)
    assert dt < 30, f"{dt:.1f} s"


def test_vllm_sample_json_schema_short_prompt(server_runtime):
    _check(server_runtime, "sample_json_schema.json", "Give an example.", 500, 0)


def test_complex_schema_email_closes_at_300_tokens(server_runtime):
    """sample_complex_json_schema: the email's local part must be closed (``@x.xx``) in time."""
    _check(server_runtime, "sample_complex_json_schema.json",
           "Give an example JSON for an employee profile that fits this schema.", 300, 0)
