"""End to end with the embedded model: the server loads it itself (``create_app()`` with no
runtime), and the openai client gets schema-valid JSON, regex matches and a stream."""
from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest
from server_harness import running_server

from dgemma_struct.testing import embedded_model_available

pytestmark = pytest.mark.skipif(not embedded_model_available(),
                                reason="src/dgemma_struct/embedded/model.safetensors is missing")

ORDER = {"type": "object", "properties": {
    "order_id": {"type": "string", "pattern": r"^ORD-\d{5}$"}, "product": {"type": "string", "maxLength": 40},
    "quantity": {"type": "integer", "minimum": 0}, "price": {"type": "number", "minimum": 0},
    "status": {"type": "string", "enum": ["pending", "shipped", "delivered", "cancelled"]}},
    "required": ["order_id", "product", "quantity", "price", "status"], "additionalProperties": False}
PROMPT = "Extract the order_id, product, quantity, price and status as JSON.\nORD-49763 is cancelled: 19 desk for 761.89 per unit."


@pytest.fixture(scope="module")
def oai():
    with running_server(None) as url:         # None: the app loads the embedded model at start-up
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_embedded_json_regex_and_stream(oai):
    assert oai.models.list().data[0].id == "dgemma-struct-embedded"
    resp = oai.chat.completions.create(
        model="dgemma-struct-embedded", messages=[{"role": "user", "content": PROMPT}], max_tokens=96,
        response_format={"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER, "strict": True}})
    jsonschema.validate(json.loads(resp.choices[0].message.content), ORDER)
    assert resp.choices[0].finish_reason == "stop"

    phone = oai.chat.completions.create(
        model="dgemma-struct-embedded", max_tokens=24, extra_body={"guided_regex": r"\d{3}-\d{3}-\d{4}"},
        messages=[{"role": "user", "content": "Give the phone number.\nYou can call Bob on 769-757-2638 after six."}])
    assert re.fullmatch(r"\d{3}-\d{3}-\d{4}", phone.choices[0].message.content)

    chunks = list(oai.chat.completions.create(
        model="dgemma-struct-embedded", messages=[{"role": "user", "content": PROMPT}], max_tokens=96, stream=True,
        extra_body={"structured_outputs": {"json": ORDER}}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), ORDER)
    assert chunks[-1].choices[0].finish_reason == "stop"
