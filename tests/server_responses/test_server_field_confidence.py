"""``"field_confidence": true`` on chat completions (and its refusal without a JSON constraint)."""
from __future__ import annotations

import json

import httpx
from conftest import MODEL

PROMPT = "Extract the name, age and email as JSON.\nYou can write to Julia Muller (45) at julia68@mail.org."
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "email": {"type": "string"}},
          "required": ["name", "age", "email"], "additionalProperties": False}


def test_chat_field_confidence(server_url):
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 96, "seed": 1,
            "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}}
    plain = httpx.post(server_url + "/v1/chat/completions", json=body, timeout=120).json()
    asked = httpx.post(server_url + "/v1/chat/completions", json={**body, "field_confidence": True}, timeout=120).json()
    choice = asked["choices"][0]
    assert "field_confidence" not in plain["choices"][0]
    assert choice["message"]["content"] == plain["choices"][0]["message"]["content"]   # recording draws nothing
    conf = choice["field_confidence"]
    assert set(conf) == {"/" + k for k in json.loads(choice["message"]["content"])}
    assert all(0.0 <= p <= 1.0 for p in conf.values())
    with httpx.stream("POST", server_url + "/v1/chat/completions", json={**body, "field_confidence": True,
                                                                         "stream": True}, timeout=120) as r:
        chunks = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
    assert [c["choices"][0]["field_confidence"] for c in chunks if "field_confidence" in c["choices"][0]] == [conf]


def test_field_confidence_needs_a_json_constraint(server_url):
    r = httpx.post(server_url + "/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                         "field_confidence": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "field_confidence"
