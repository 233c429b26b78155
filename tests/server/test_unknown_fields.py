"""No silent loss of a constraint (issue 23): an unknown body field naming a constraint or a limit
is a 400 ``unknown_parameter`` with a hint; other unknown fields are logged once per name; OpenAI's
``strict: true`` and vLLM's ``disable_additional_properties`` close the schema's objects."""
from __future__ import annotations

import logging

import pytest

from dgemma_struct.server import completions
from dgemma_struct.server.completions import check_fields
from dgemma_struct.server.http_errors import APIError
from dgemma_struct.server.protocol import ChatCompletionRequest, CompletionRequest, spec_of

MSG = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def _chat(**kw):
    return ChatCompletionRequest.model_validate({"messages": MSG, **kw})


@pytest.mark.parametrize("body, param, hint", [
    ({"guided_regx": "[0-9]+"}, "guided_regx", "guided_regex"),
    ({"max_token": 5}, "max_token", "max_tokens"),
    ({"structured_output": {"regex": "a"}}, "structured_output", "structured_outputs"),
    ({"json_schema": SCHEMA}, "json_schema", None),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strictt": True}}},
     "response_format.json_schema.strictt", "strict"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}, "schema": SCHEMA}},
     "response_format.schema", "schema"),
    ({"structured_outputs": {"regx": "a", "choice": ["a"]}}, "structured_outputs.regx", "regex"),
])
def test_constraint_typos_are_400_with_hint(body, param, hint):
    for req in (_chat(**body), CompletionRequest.model_validate({"prompt": "hi", **body})):
        with pytest.raises(APIError) as e:
            check_fields(req)
        assert (e.value.status, e.value.code, e.value.param) == (400, "unknown_parameter", param)
        if hint:
            assert f"did you mean {hint!r}" in str(e.value.body())


def test_other_unknown_fields_are_logged_once(caplog):
    completions._warned.discard("top_k_weird")
    with caplog.at_level(logging.WARNING, logger="dgemma_struct.server"):
        for _ in range(3):
            check_fields(_chat(top_k_weird=3, tool_choice="auto", presence_penalty=0.5))
    hits = [r for r in caplog.records if "top_k_weird" in r.getMessage()]
    assert len(hits) == 1
    assert not [r for r in caplog.records if "tool_choice" in r.getMessage() or "presence" in r.getMessage()]
    check_fields(_chat(response_format={"type": "json_object", "schema": SCHEMA}))  # instructor's shape is known


def test_strict_true_closes_objects_and_plain_schema_stays_open():
    rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}}
    assert spec_of(_chat(response_format=rf))[0]["additionalProperties"] is False
    rf["json_schema"]["strict"] = False
    assert "additionalProperties" not in spec_of(_chat(response_format=rf))[0]
    so = {"json": SCHEMA, "disable_additional_properties": True}
    assert spec_of(_chat(structured_outputs=so))[0]["additionalProperties"] is False


def test_typo_over_http_is_400(client):
    r = client.post("/v1/chat/completions", json={"messages": MSG, "guided_regx": "[0-9]+", "max_tokens": 8})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "unknown_parameter" and err["param"] == "guided_regx" and "guided_regex" in err["message"]
    r = client.post("/v1/completions", json={"prompt": "hi", "max_token": 8})
    assert r.status_code == 400 and r.json()["error"]["code"] == "unknown_parameter"
    r = client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 4, "unheard_of": 1})
    assert r.status_code == 200
