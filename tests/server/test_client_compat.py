"""#12 through the real ``openai`` SDK against uvicorn on loopback: n, stop, sampling and seeds,
json_object with a schema, max_tokens on free text, GBNF grammars, and the default stream being
exactly the non-streamed answer."""
from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

MSG = [{"role": "user", "content": "Give the answer as JSON."}]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                           "color": {"type": "string", "enum": ["red", "green", "blue"]}},
          "required": ["ok", "color"], "additionalProperties": False}


@pytest.fixture()
def oai(server_url):
    return openai.OpenAI(base_url=server_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_n_choices_each_valid(oai):
    resp = oai.chat.completions.create(model="tiny-random", messages=MSG, max_tokens=48, n=3, seed=5,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "a", "schema": SCHEMA}})
    assert [c.index for c in resp.choices] == [0, 1, 2]
    for c in resp.choices:
        if c.finish_reason == "stop":
            jsonschema.validate(json.loads(c.message.content), SCHEMA)
        else:
            assert c.finish_reason == "length"
    regex = oai.chat.completions.create(model="tiny-random", messages=MSG, max_tokens=16, n=4,
                                        extra_body={"guided_regex": "[a-z]{3}[0-9]"})
    texts = [c.message.content for c in regex.choices]
    assert len(texts) == 4 and all(re.fullmatch("[a-z]{3}[0-9]", t) for t in texts)
    assert len(set(texts)) > 1                           # independent samples, not one answer four times


def test_completions_n_with_several_prompts(oai):
    resp = oai.completions.create(model="tiny-random", prompt=["a", "b"], n=2, max_tokens=8,
                                  extra_body={"guided_choice": ["x", "y", "z"]})
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    assert all(c.text in ("x", "y", "z") for c in resp.choices)


def _free(oai, **kw):
    return oai.chat.completions.create(model="tiny-random", messages=MSG, max_tokens=24, **kw).choices[0]


def test_seed_reproduces_and_no_seed_is_fresh(oai):
    a, b = _free(oai, seed=11), _free(oai, seed=11)
    assert a.message.content == b.message.content
    unseeded = {_free(oai).message.content for _ in range(3)}
    assert len(unseeded) > 1                             # no seed: a fresh one per request
    c1 = oai.chat.completions.create(model="tiny-random", messages=MSG, max_tokens=16, seed=3,
                                     extra_body={"guided_regex": "[a-z]{6}"}).choices[0].message.content
    c2 = oai.chat.completions.create(model="tiny-random", messages=MSG, max_tokens=16, seed=3,
                                     extra_body={"guided_regex": "[a-z]{6}"}).choices[0].message.content
    assert c1 == c2


def test_temperature_changes_the_sampling(oai):
    greedy = [_free(oai, seed=s, temperature=0.0).message.content for s in range(3)]
    hot = [_free(oai, seed=s, temperature=1.5).message.content for s in range(3)]
    assert greedy != hot                                 # same seeds, other temperature: other samples
    assert greedy[0] == _free(oai, seed=0, temperature=0.0).message.content
    assert _free(oai, seed=1, temperature=1.0, top_p=0.5).message.content is not None


def test_stop_cuts_free_text(oai):
    full = _free(oai, seed=21)
    text = full.message.content
    assert len(text) >= 6, text
    stop = text[3:6]
    cut = _free(oai, seed=21, stop=[stop, "\u2603never"])
    assert cut.finish_reason == "stop"
    assert cut.message.content == text[:text.find(stop)]
    assert stop not in cut.message.content


def test_stop_is_ignored_inside_a_constraint(oai):
    """A constraint decides where its output ends: a stop never truncates a constrained value."""
    resp = oai.chat.completions.create(model="tiny-random", messages=MSG, max_tokens=16, stop=["-"],
                                       extra_body={"guided_regex": "[0-9]{2}-[0-9]{2}"})
    assert re.fullmatch("[0-9]{2}-[0-9]{2}", resp.choices[0].message.content)
    assert resp.choices[0].finish_reason == "stop"


def test_max_tokens_caps_free_text(oai, client):
    for n in (1, 3):
        c = oai.chat.completions.create(model="tiny-random", messages=MSG, max_tokens=n, seed=2)
        assert c.usage.completion_tokens <= n
        assert c.choices[0].finish_reason in ("length", "stop")


def test_json_object_with_a_schema_enforces_it(client):
    """instructor 1.3 sends {"type": "json_object", "schema": ...}."""
    seen = 0
    for seed in range(4):
        r = client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 48, "seed": seed,
                                                      "response_format": {"type": "json_object", "schema": SCHEMA}})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        if choice["finish_reason"] == "stop":
            jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)
            seen += 1
    assert seen


@pytest.mark.parametrize("field", ["guided_grammar", "structured_outputs"])
def test_gbnf_grammar(oai, field):
    gbnf = 'root ::= "SELECT " col " FROM " tbl\ncol ::= "a" | "b"\ntbl ::= "t1" | "t2"'
    extra = {"guided_grammar": gbnf} if field == "guided_grammar" else {"structured_outputs": {"grammar": gbnf}}
    resp = oai.chat.completions.create(model="tiny-random", messages=MSG, max_tokens=24, extra_body=extra)
    assert re.fullmatch(r"SELECT [ab] FROM t[12]", resp.choices[0].message.content)


def test_default_stream_is_the_validated_answer(oai):
    """The default stream sends the same (validated, repaired) answer a non-streamed request
    gets: it can never diverge from what it sent."""
    kw = dict(model="tiny-random", messages=MSG, max_tokens=48, seed=9,
              response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}})
    plain = oai.chat.completions.create(**kw).choices[0]
    chunks = list(oai.chat.completions.create(stream=True, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == plain.finish_reason
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 1   # in deltas, not one blob


def test_stream_errors_are_http_4xx_before_the_stream(client):
    r = client.post("/v1/chat/completions", json={"messages": MSG, "stream": True, "guided_regex": "(("})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_regex"
