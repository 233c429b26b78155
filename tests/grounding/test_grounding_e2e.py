"""Grounded extraction end to end with the embedded model: diffusion and AR, a batch, an explicit
source, every grounded value verbatim in the source at the offsets returned."""
from __future__ import annotations

import json
from typing import Annotated

import pytest
from pydantic import BaseModel

from dgemma_struct.errors import GroundingError, PromptTooLongError
from dgemma_struct.grounding import Grounded, GroundedResult, generate_grounded, generate_grounded_batch
from dgemma_struct.runtime import DiffusionRuntime

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "email": {"type": "string", "format": "email"}},
          "required": ["name", "age", "email"], "additionalProperties": False}
PROMPTS = ["Extract the name, age and email as JSON.\nTara Zhang is 42 and can be reached at tzhang@post.io.",
           "Meet Omar Klein, age 35, email oklein@mail.org.\nReturn a JSON object with name, age and email."]


class Contact(BaseModel):
    name: Annotated[str, Grounded()]
    phone: Annotated[str, Grounded()]
    city: Annotated[str, Grounded()]


@pytest.fixture(scope="module")
def rt():
    return DiffusionRuntime.default()


def check_grounded(res: GroundedResult) -> None:
    assert res.spans, "no grounded values"
    for s in res.spans:
        assert res.sources[s.doc][s.start:s.end] == s.text == str(s.value)
        node = res.json_value
        for p in s.path:
            node = node[p]
        assert node == s.value


@pytest.mark.parametrize("mode", ["diffusion", "ar"])
def test_plain_schema_request_level(rt, mode):
    res = generate_grounded(PROMPTS[0], PERSON, ground="all", runtime=rt, mode=mode, seed=0, max_new_tokens=64)
    check_grounded(res)
    assert {s.pointer for s in res.spans} == {"/name", "/age", "/email"}
    assert res.value["age"] == 42 and "@" in res.value["email"]
    assert "<mark" in res.to_html() and json.loads(json.dumps(res.to_dict()))["spans"]


def test_pydantic_marker_diffusion(rt):
    prompt = "Extract the name, phone and city as JSON.\nCall Nina Park in Lisbon on 415-555-0199."
    res = generate_grounded(prompt, Contact, runtime=rt, seed=1, max_new_tokens=64)
    assert isinstance(res.value, Contact)
    check_grounded(res)
    assert res.value.city in prompt and res.value.phone in prompt


def test_batch_and_explicit_source(rt):
    sources = [None, "Meet Omar Klein, age 35, email oklein@mail.org."]
    out = generate_grounded_batch(PROMPTS, PERSON, sources=sources, ground="all", runtime=rt, seed=0,
                                  max_new_tokens=64)
    assert len(out) == 2
    for res in out:
        assert isinstance(res, GroundedResult)
        check_grounded(res)
    assert out[1].sources == (sources[1],)


def test_source_not_in_prompt_is_shown_to_the_model(rt):
    res = generate_grounded("Extract the name, age and email as JSON.", PERSON, ground="all", runtime=rt,
                            source="Zoe Young is 29 and writes to zyoung@inbox.dev.", seed=0, max_new_tokens=64)
    check_grounded(res)
    assert res.value["age"] == 29


def test_bad_input(rt):
    with pytest.raises(GroundingError, match="empty"):
        generate_grounded("Extract as JSON.", PERSON, ground="all", runtime=rt, source="  ")
    with pytest.raises(PromptTooLongError):
        generate_grounded("Extract as JSON.", PERSON, ground="all", runtime=rt,
                          source="Tara Zhang is 42. " * (rt.max_context // 4))
    big = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1000, "x-grounded": True}}}
    with pytest.raises(GroundingError, match="no number"):
        generate_grounded(PROMPTS[0], {**big, "required": ["n"]}, runtime=rt)
    assert generate_grounded(PROMPTS[0], big, runtime=rt, max_new_tokens=16).value == {}   # optional: left out
    out = generate_grounded_batch([PROMPTS[0], "no digits"], {"type": "object", "properties": {
        "n": {"type": "integer", "x-grounded": True}}, "required": ["n"]}, runtime=rt, return_exceptions=True,
        max_new_tokens=16)
    assert isinstance(out[0], GroundedResult) and out[0].value["n"] == 42
    assert isinstance(out[1], GroundingError)
    # a per-row seed list follows the rows still running after a refused one
    out = generate_grounded_batch(["no digits", PROMPTS[0]], {"type": "object", "properties": {
        "n": {"type": "integer", "x-grounded": True}}, "required": ["n"]}, runtime=rt, return_exceptions=True,
        max_new_tokens=16, seed=[3, 0])
    assert isinstance(out[0], GroundingError) and isinstance(out[1], GroundedResult) and out[1].value["n"] == 42


def test_demo_text_and_html(rt, tmp_path):
    from dgemma_struct.grounding import DEMO_PROMPT, demo
    out = demo(rt, html_path=str(tmp_path / "g.html"))
    assert out.count("grounded:") == 2 and out.count("constrained:") == 2 and "/age@" in out
    page = (tmp_path / "g.html").read_text()
    assert page.startswith("<!doctype html>") and "<mark" in page and "Tara Zhang" in page
    assert DEMO_PROMPT.split("\n")[1][:10] in page
