"""The ``choice_probabilities`` extension through the openai SDK against uvicorn on loopback: every
option's probability on each choice (summing to 1, equal to the Python API's), only with a choice
constraint, never with streaming; bad uses are 400 with OpenAI's error body."""
from __future__ import annotations

import openai
import pytest

from dgemma_struct.choice_scores import choice_probabilities

MSG = [{"role": "user", "content": "Is the sky blue?"}]
OPTIONS = ["yes", "no", "maybe"]


@pytest.fixture()
def oai(server_url):
    return openai.OpenAI(base_url=server_url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.mark.parametrize("estimator", [True, "ar"])
def test_every_choice_carries_every_options_probability(oai, rt, estimator):
    resp = oai.chat.completions.create(model="tiny-random", messages=MSG, max_tokens=8, seed=3, n=2,
                                       extra_body={"guided_choice": OPTIONS, "choice_probabilities": estimator})
    for c in resp.choices:
        assert c.message.content in OPTIONS
        probs = c.model_extra["choice_probabilities"]
        assert list(probs) == OPTIONS
        assert abs(sum(probs.values()) - 1.0) < 1e-6
        assert all(0.0 <= p <= 1.0 for p in probs.values())
    assert resp.choices[0].model_extra["choice_probabilities"] == resp.choices[1].model_extra["choice_probabilities"]
    want = choice_probabilities(MSG, OPTIONS, runtime=rt, estimator="canvas" if estimator is True else estimator)
    got = resp.choices[0].model_extra["choice_probabilities"]
    assert all(abs(got[o] - want[o]) < 1e-6 for o in OPTIONS)


def test_completions_endpoint_and_no_field_unless_asked(oai):
    resp = oai.completions.create(model="tiny-random", prompt="Is the sky blue?", max_tokens=8, seed=3,
                                  extra_body={"guided_choice": OPTIONS, "choice_probabilities": True})
    assert abs(sum(resp.choices[0].model_extra["choice_probabilities"].values()) - 1.0) < 1e-6
    plain = oai.completions.create(model="tiny-random", prompt="Is the sky blue?", max_tokens=8, seed=3,
                                   extra_body={"guided_choice": OPTIONS})
    assert "choice_probabilities" not in (plain.choices[0].model_extra or {})


@pytest.mark.parametrize("body", [
    {"choice_probabilities": True},                                                   # no choice constraint
    {"guided_regex": "[a-z]{3}", "choice_probabilities": True},                       # not a choice
    {"guided_choice": OPTIONS, "choice_probabilities": "beam"},                       # unknown estimator
    {"guided_choice": OPTIONS, "choice_probabilities": True, "stream": True},         # streaming
])
def test_bad_uses_are_400(client, body):
    r = client.post("/v1/chat/completions", json={"model": "tiny-random", "messages": MSG, "max_tokens": 8, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"].startswith("choice_probabilities") and err["message"]
