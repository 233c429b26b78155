"""Per-field confidence (issue #36) on the real constrained road: every leaf gets a probability,
requesting it changes no output, enum / boolean / choice values get their option's probability."""
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from pydantic import BaseModel

from dgemma_struct import generate, generate_batch, generate_json, stream
from dgemma_struct.constraints import Choice, Regex
from dgemma_struct.grounding import generate_grounded
from dgemma_struct.options import GenerateOptions
from dgemma_struct.repair.field_confidence import leaf_spans, pointer
from dgemma_struct.results import GenerationResult
from dgemma_struct.testing import json_schemas

MODES = ["diffusion", "ar"]


class Person(BaseModel):
    name: str
    age: int
    email: str


PERSON = "Extract the name, age and email as JSON.\nYou can write to Julia Muller (45) at julia68@mail.org."


def leaves(value, path=()):
    if isinstance(value, dict) and value:
        return {k: v for key, sub in value.items() for k, v in leaves(sub, path + (key,)).items()}
    if isinstance(value, list) and value:
        return {k: v for i, sub in enumerate(value) for k, v in leaves(sub, path + (i,)).items()}
    return {pointer(path): value}


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(schema=json_schemas(max_depth=2, max_properties=3))
def test_every_leaf_has_a_confidence_in_0_1(tiny_runtime, mode, schema):
    r = generate_json("Answer as JSON.", schema, runtime=tiny_runtime, mode=mode, max_new_tokens=96,
                      return_details=True, confidence=True)
    want = leaves(json.loads(r.text))
    assert set(r.confidence) == set(want), (r.text, r.confidence)
    assert all(0.0 <= p <= 1.0 and not math.isnan(p) for p in r.confidence.values())
    assert r.logprobs is None   # recorded for the confidence only, not handed back


@pytest.mark.parametrize("mode", MODES)
def test_the_same_output_with_and_without_confidence(embedded_runtime, mode):
    plain = generate_json(PERSON, schema=Person, runtime=embedded_runtime, mode=mode, return_details=True)
    conf = generate_json(PERSON, schema=Person, runtime=embedded_runtime, mode=mode, return_details=True,
                         confidence=True)
    assert conf.token_ids == plain.token_ids and conf.text == plain.text
    assert plain.confidence is None
    assert set(conf.confidence) == {"/name", "/age", "/email"}
    # sampled (temperature 1 in AR) rows too: the recording draws nothing
    s0 = generate_batch([PERSON] * 2, Person, runtime=embedded_runtime, mode=mode, seed=[3, 4], temperature=1.0)
    s1 = generate_batch([PERSON] * 2, Person, runtime=embedded_runtime, mode=mode, seed=[3, 4], temperature=1.0,
                        confidence=True)
    assert [r.token_ids for r in s0] == [r.token_ids for r in s1]
    assert all(r.confidence is not None for r in s1)


def test_confidence_is_the_product_of_the_value_tokens(embedded_runtime):
    r = generate_json(PERSON, schema=Person, runtime=embedded_runtime, return_details=True, confidence=True,
                      logprobs=1)
    assert r.logprobs is not None   # asked for: kept
    tok = embedded_runtime.tokenizer
    pieces = [tok.decode([t], skip_special_tokens=False) for t in r.token_ids]
    starts = [sum(map(len, pieces[:k])) for k in range(len(pieces))]
    s, e = leaf_spans(r.text)["/name"]
    lps = [x.logprob for x, a, p in zip(r.logprobs, starts, pieces) if a < e and a + len(p) > s]
    assert r.confidence["/name"] == pytest.approx(math.exp(sum(lps)))


def test_enum_and_boolean_get_the_probability_of_the_chosen_option(tiny_runtime):
    schema = {"type": "object", "properties": {"color": {"type": "string", "enum": ["crimson", "teal"]},
                                               "ok": {"type": "boolean"}},
              "required": ["color", "ok"], "additionalProperties": False}
    seen = set()
    for seed in range(4):
        r = generate_json("Pick.", schema, runtime=tiny_runtime, seed=seed, return_details=True, confidence=True,
                          logprobs=2)
        tok = tiny_runtime.tokenizer
        pieces = [tok.decode([t], skip_special_tokens=False) for t in r.token_ids]
        starts = [sum(map(len, pieces[:k])) for k in range(len(pieces))]
        for ptr in ("/color", "/ok"):
            s, e = leaf_spans(r.text)[ptr]
            entries = [x for x, a, p in zip(r.logprobs, starts, pieces) if a < e and a + len(p) > s]
            deciding = [x for x in entries if not x.forced]
            # the value is decided where its tokens are not forced; the forced rest counts 1
            assert r.confidence[ptr] == pytest.approx(math.exp(sum(x.logprob for x in deciding)))
            if len(deciding) == 1:   # one decision: the chosen option's share among the allowed ones
                alts = {a.token_id: a.logprob for a in deciding[0].top_logprobs}
                assert sum(math.exp(v) for v in alts.values()) <= 1 + 1e-6
            seen.add(json.loads(r.text)[ptr[1:]])
    assert seen   # the loop ran


def test_choice_and_regex_have_one_root_field(tiny_runtime):
    r = generate("Pick a colour.", Choice(["red", "green", "blue"]), runtime=tiny_runtime, return_details=True,
                 confidence=True)
    assert list(r.confidence) == [""] and 0 < r.confidence[""] <= 1
    r = generate("Two digits.", Regex("[0-9]{2}"), runtime=tiny_runtime, return_details=True, confidence=True)
    assert list(r.confidence) == [""] and 0 <= r.confidence[""] <= 1


def test_low_confidence_lists_the_fields_below_the_threshold(tiny_runtime):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["name", "age"], "additionalProperties": False}
    r = generate_json("Who?", schema, runtime=tiny_runtime, return_details=True, confidence=True)
    conf = r.confidence
    assert r.low_confidence(1.01) == sorted(conf, key=conf.get)          # everything, least confident first
    assert r.low_confidence(0.0) == []
    mid = sorted(conf.values())[0] + 1e-9
    assert r.low_confidence(mid) == [min(conf, key=conf.get)]
    assert GenerationResult(text="", token_ids=[]).low_confidence() == []
    assert r.to_dict()["confidence"] == conf


def test_stream_final_event_and_grounded_carry_it(embedded_runtime):
    # stream() takes the knob through ``options`` (its keyword list does not name it yet)
    events = list(stream(PERSON, Person, runtime=embedded_runtime, options=GenerateOptions(confidence=True)))
    final = events[-1]
    assert final.done and set(final.confidence) == {"/name", "/age", "/email"}
    assert all(e.confidence is None for e in events[:-1])
    g = generate_grounded(PERSON, Person, ground="all", runtime=embedded_runtime, confidence=True)
    assert set(g.confidence) == {"/name", "/age", "/email"} and g.to_dict()["confidence"] == g.confidence
