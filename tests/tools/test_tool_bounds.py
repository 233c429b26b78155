"""Tool arguments honour array bounds as the JSON path does (issue 23): a model with
``tags: list[str] = Field(min_length=2, max_length=2)`` gets calls with exactly two tags; the same
schema through both surfaces accepts the same values."""
from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, Field

from dgemma_struct.testing import embedded_runtime  # noqa: F401  (a session-scoped fixture)
from dgemma_struct.tools import compile_tool_calls, encode_arguments

STOPS = [1, 106, 50]
S = '<|"|>'


class Tag(BaseModel):
    """Tag a post."""
    tags: list[str] = Field(min_length=2, max_length=2)


class Pick(BaseModel):
    """Pick up to three numbers and a short code."""
    nums: list[int] = Field(default=[], max_length=3)
    code: str = Field(min_length=2, max_length=4)


def call(name, args):
    return f"<|tool_call>call:{name}{encode_arguments(args)}<tool_call|>"


VALUES = {"Tag": [{"tags": t} for t in ([], ["a"], ["a", "b"], ["a", "b", "c"])],
          "Pick": [{"nums": n, "code": c} for c in ("x", "xy", "wxyz", "vwxyz") for n in ([], [1, 2, 3], [1, 2, 3, 4])]}


@pytest.fixture(scope="module")
def tools_c(gemma4_tokenizer):
    return compile_tool_calls([Tag, Pick], gemma4_tokenizer, stop_token_ids=STOPS)


def test_bounded_list_exact_length(tools_c):
    assert tools_c.grammar_accepts(call("Tag", {"tags": ["a", "b"]}))
    for n in (0, 1, 3):
        assert not tools_c.grammar_accepts(call("Tag", {"tags": ["t"] * n})), n


@pytest.mark.parametrize("model", [Tag, Pick])
def test_same_schema_same_verdicts_on_both_surfaces(tools_c, gemma4_tokenizer, model):
    from dgemma_struct.constraints import compile_constraint
    js = compile_constraint(model, gemma4_tokenizer, stop_token_ids=STOPS)
    for args in VALUES[model.__name__]:
        as_json = js.matches(json.dumps(args, separators=(",", ":")))
        text = call(model.__name__, args)
        assert tools_c.grammar_accepts(text) is as_json, args  # the grammar, not only validation
        assert tools_c.validate_text(text).ok is as_json, args


@pytest.mark.parametrize("mode", ["ar", "diffusion"])
def test_embedded_model_bounded_list_tool_is_called_validly(embedded_runtime, mode):
    """Before: ``GenerationFailed ... is too long`` every time (the grammar let the list grow)."""
    from dgemma_struct import generate_tool_calls
    for seed in range(3):
        res = generate_tool_calls("Tag the post 'Diffusion models for structured output' with two tags.", [Tag],
                                  tool_choice="required", runtime=embedded_runtime, mode=mode, seed=seed,
                                  max_new_tokens=48)
        assert res.calls and all(len(c.arguments["tags"]) == 2 for c in res.calls)


def test_tool_arguments_are_strict_objects(tools_c):
    """No undeclared key in tool arguments: the grammar writes declared keys only, validation agrees."""
    text = call("Tag", {"tags": ["a", "b"], "extra": 1})
    assert not tools_c.grammar_accepts(text)
    out = tools_c.validate_text(text)
    assert not out.ok and "extra" in str(out.errors)


class Code(BaseModel):
    """A code with a pattern and a length."""
    code: str = Field(pattern=r"^[A-Z]+$", min_length=2, max_length=3)


def test_pattern_and_length_both_in_the_tool_grammar(gemma4_tokenizer):
    from dgemma_struct.constraints import compile_constraint
    c = compile_tool_calls([Code], gemma4_tokenizer, stop_token_ids=STOPS)
    js = compile_constraint(Code, gemma4_tokenizer, stop_token_ids=STOPS)
    for code in ("A", "AB", "ABC", "ABCD", "ab", "A1"):
        ok = js.matches(json.dumps({"code": code}, separators=(",", ":")))
        assert c.grammar_accepts(call("Code", {"code": code})) is ok, code
