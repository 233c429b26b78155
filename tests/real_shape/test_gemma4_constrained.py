"""Constrained generation end to end on a random-weight DiffusionGemma of the real shape (vocab
262,144, canvas 256, 5:1 sliding/full layers) with the Gemma 4 tokenizer (issue #10). Random weights
write nonsense, so every value being valid, the stop token stripped and no crash is the constraint
layer's doing. Outputs are kept short so the module runs in CI on two cores."""
from __future__ import annotations

import json
import re

import pytest

from dgemma_struct import api

STOP_SPELLINGS = ("<eos>", "<turn|>", "<|tool_response>")


@pytest.fixture(scope="module")
def runtime(gemma4_random_runtime):
    return gemma4_random_runtime


def _clean(res) -> None:
    assert not any(s in res.text for s in STOP_SPELLINGS), res.text
    assert not set(res.token_ids) & {1, 106, 50}


SCHEMA = {"type": "object", "properties": {"note": {"type": "string", "maxLength": 12},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["note", "n"], "additionalProperties": False}


@pytest.mark.parametrize("mode", ["diffusion", "ar"])
def test_json(runtime, mode):
    res = api.generate_json("Give a note and a number as JSON.", SCHEMA, max_new_tokens=40, mode=mode,
                            max_repairs=1, return_details=True, runtime=runtime)
    _clean(res)
    value = json.loads(res.text)
    assert set(value) == {"note", "n"} and len(value["note"]) <= 12 and 0 <= value["n"] <= 99
    assert res.value == value


def test_regex_with_newlines(runtime):
    pat = r"[a-z]{1,4}\n[0-9]{1,3}\n?"
    res = api.generate_regex("Two lines.", pat, max_new_tokens=16, max_repairs=1, return_details=True,
                             runtime=runtime)
    _clean(res)
    assert re.fullmatch(pat, res.text), res.text


def test_choice_with_newline(runtime):
    choices = ["yes\nsure", "no\n", "maybe"]
    res = api.generate_choice("Pick one.", choices, max_new_tokens=8, return_details=True, runtime=runtime)
    _clean(res)
    assert res.text in choices and res.value == res.text


def test_grammar_of_lines(runtime):
    grammar = 'start: line line?\nline: WORD "\\n"\nWORD: /[a-z]{1,5}/\n'
    res = api.generate_grammar("Write a line or two.", grammar, max_new_tokens=16, max_repairs=1,
                               return_details=True, runtime=runtime)
    _clean(res)
    assert re.fullmatch(r"([a-z]{1,5}\n){1,2}", res.text), res.text
