"""The FastAPI helper exposes per-field confidence: ``typed_route(confidence=True)`` returns the
value with its confidence mapping, and ``StructuredGenerator.details`` carries it."""
from __future__ import annotations

from typing import Literal

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict, Field

from dgemma_struct.fastapi import StructuredGenerator, typed_route


class Flag(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ok: bool
    level: Literal["low", "high"]
    n: int = Field(ge=0, le=9)


def test_typed_route_with_confidence(tiny_runtime):
    app = FastAPI()
    gen = StructuredGenerator(tiny_runtime, max_new_tokens=48, isolate_compile=False)
    typed_route(app, "/flag", schema=Flag, prompt_template="Extract the flag as JSON.\n{text}", generator=gen)
    typed_route(app, "/flag/scored", schema=Flag, prompt_template="Extract the flag as JSON.\n{text}",
                generator=gen, confidence=True)
    with TestClient(app) as c:
        plain = c.post("/flag", json={"text": "level is high"})
        r = c.post("/flag/scored", json={"text": "level is high"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert Flag.model_validate(body["value"]) == Flag.model_validate(plain.json())   # the same value
        assert set(body["confidence"]) == {"/ok", "/level", "/n"}
        assert all(0 <= p <= 1 for p in body["confidence"].values())
        schema = c.get("/openapi.json").json()
        ref = schema["paths"]["/flag/scored"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert ref["$ref"].endswith("FlagWithConfidence")


@pytest.mark.anyio
async def test_details_carry_confidence(tiny_runtime):
    gen = StructuredGenerator(tiny_runtime, max_new_tokens=48, isolate_compile=False, confidence=True)
    res = await gen.details("Extract the flag as JSON.\nok", Flag)
    assert set(res.confidence) == {"/ok", "/level", "/n"} and res.logprobs is None
    res = await gen.details("Extract the flag as JSON.\nok", Flag, confidence=False)
    assert res.confidence is None
