"""``logprobs`` / ``top_logprobs`` (chat) and ``logprobs`` (completions) through the real ``openai``
SDK against uvicorn on loopback: the SDK parses the objects, the entries line up with the text,
the values are log-probabilities, streams carry the entries of their deltas, bad values are 400."""
from __future__ import annotations

import math

import openai
import pytest

MSG = [{"role": "user", "content": "Give the answer as JSON."}]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                           "color": {"type": "string", "enum": ["red", "green", "blue"]}},
          "required": ["ok", "color"], "additionalProperties": False}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}


@pytest.fixture()
def oai(server_url):
    return openai.OpenAI(base_url=server_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _check_content(content, text, k):
    assert content, "no entries"
    assert "".join(e.token for e in content) == text          # the entries spell the answer
    for e in content:
        assert e.logprob <= 0.0
        assert e.bytes == list(e.token.encode("utf-8")) or (e.token == "\ufffd" and len(e.bytes) == 1)
        assert len(e.top_logprobs) <= k
        assert sum(math.exp(a.logprob) for a in e.top_logprobs) <= 1.0 + 1e-5
        lps = [a.logprob for a in e.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        if e.top_logprobs and e.logprob > lps[-1]:             # better than the k-th: it is among the top
            assert any(a.token == e.token and abs(a.logprob - e.logprob) < 1e-6 for a in e.top_logprobs)


def test_chat_json_schema_logprobs(oai):
    resp = oai.chat.completions.create(model="tiny-random", messages=MSG, max_tokens=48, seed=1, logprobs=True,
                                       top_logprobs=3, response_format=JSON_FORMAT)
    c = resp.choices[0]
    assert c.finish_reason == "stop"
    _check_content(c.logprobs.content, c.message.content, 3)
    assert c.logprobs.content[0].logprob == 0.0               # '{"ok":' is forced by the schema
    assert c.logprobs.content[0].top_logprobs[0].logprob == 0.0
    assert any(e.logprob < 0 for e in c.logprobs.content)     # and something was sampled
    plain = oai.chat.completions.create(model="tiny-random", messages=MSG, max_tokens=48, seed=1,
                                        response_format=JSON_FORMAT).choices[0]
    assert plain.message.content == c.message.content and plain.logprobs is None


def test_chat_free_text_logprobs_without_top(oai):
    c = oai.chat.completions.create(model="tiny-random", messages=MSG, max_tokens=20, seed=4,
                                    logprobs=True).choices[0]
    _check_content(c.logprobs.content, c.message.content, 0)
    assert all(e.top_logprobs == [] for e in c.logprobs.content)
    same = oai.chat.completions.create(model="tiny-random", messages=MSG, max_tokens=20, seed=4).choices[0]
    assert same.message.content == c.message.content          # recording changes nothing


def test_completions_legacy_logprobs(oai):
    resp = oai.completions.create(model="tiny-random", prompt="abc", max_tokens=16, seed=2, logprobs=2,
                                  extra_body={"guided_regex": "[a-z]{3}-[0-9]{2}"})
    c = resp.choices[0]
    lp = c.logprobs
    assert "".join(lp.tokens) == c.text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert all(x <= 0.0 for x in lp.token_logprobs)
    assert any(x < 0.0 for x in lp.token_logprobs)
    assert "-" in lp.tokens and lp.token_logprobs[lp.tokens.index("-")] == 0.0   # the forced '-'
    for top in lp.top_logprobs:
        assert 1 <= len(top) <= 2 and sum(math.exp(v) for v in top.values()) <= 1.0 + 1e-5


def test_stream_chunks_carry_their_entries(oai):
    kw = dict(model="tiny-random", messages=MSG, max_tokens=48, seed=3, logprobs=True, top_logprobs=2,
              response_format=JSON_FORMAT)
    full = oai.chat.completions.create(**kw).choices[0]
    text, entries = "", []
    for chunk in oai.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            piece = ch.delta.content or ""
            text += piece
            got = ch.logprobs.content if ch.logprobs is not None else []
            assert "".join(e.token for e in got) == piece          # a delta's entries spell that delta
            entries.extend(got)
    assert text == full.message.content
    assert [(e.token, e.logprob) for e in entries] == [(e.token, e.logprob) for e in full.logprobs.content]


def test_completions_stream_offsets(oai):
    kw = dict(model="tiny-random", prompt="abc", max_tokens=24, seed=6, logprobs=1)
    full = oai.completions.create(**kw).choices[0]
    offsets, tokens = [], []
    for chunk in oai.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            if ch.logprobs is not None:
                offsets += ch.logprobs.text_offset
                tokens += ch.logprobs.tokens
    assert tokens == full.logprobs.tokens and offsets == full.logprobs.text_offset


@pytest.mark.parametrize("body", [
    {"top_logprobs": 2},                        # top_logprobs without logprobs
    {"logprobs": False, "top_logprobs": 2},
    {"logprobs": True, "top_logprobs": 21},
    {"logprobs": True, "top_logprobs": -1},
])
def test_chat_bad_values_are_400(oai, body):
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model="tiny-random", messages=MSG, max_tokens=8, extra_body=body)
    assert err.value.status_code == 400
    assert err.value.body["param"] in ("top_logprobs", "logprobs")
    assert err.value.body["type"] == "invalid_request_error"


@pytest.mark.parametrize("k", [-1, 21])
def test_completions_bad_values_are_400(oai, k):
    with pytest.raises(openai.BadRequestError) as err:
        oai.completions.create(model="tiny-random", prompt="abc", max_tokens=8, logprobs=k)
    assert err.value.body["param"] == "logprobs"
