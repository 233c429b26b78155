"""``dgemma_struct.fastapi``: the dependency and ``typed_route``, with a tiny random runtime."""
from __future__ import annotations

from typing import Literal

from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict, Field

from dgemma_struct.fastapi import (GENERATION_ERROR_STATUS, GenerationErrorResponse, StructuredGenerator,
                                   generation_error_responses, structured_generator, typed_route)


class Flag(BaseModel):
    model_config = ConfigDict(extra="forbid")   # a closed object: the random test model would add keys forever
    ok: bool
    level: Literal["low", "high"]
    n: int = Field(ge=0, le=9)


def make_app(rt) -> FastAPI:
    app = FastAPI()
    gen = structured_generator(runtime=rt, max_new_tokens=48)

    @app.post("/flag", response_model=Flag)
    async def flag(text: str, g: StructuredGenerator = Depends(gen)):
        return await g.json(f"Classify as JSON.\n{text}", Flag)

    @app.get("/pick")
    async def pick(g: StructuredGenerator = Depends(gen)):
        return {"choice": await g.choice("Pick one.", ["left", "right"]),
                "code": await g.regex("A code.", "[A-Z]{2}[0-9]"),
                "sum": await g.grammar("A sum.", 'start: NUM "+" NUM\nNUM: /[0-9]/')}

    @app.get("/hot")
    async def hot(g: StructuredGenerator = Depends(gen)):
        return {"code": await g.regex("A code.", "[A-Z]{2}[0-9]", temperature=2.0, top_p=0.9, seed=3)}

    @app.get("/bad-temperature")
    async def bad_temperature(g: StructuredGenerator = Depends(gen)):
        return await g.regex("A code.", "[A-Z]{2}[0-9]", temperature=-1.0)

    @app.get("/broken")
    async def broken(g: StructuredGenerator = Depends(gen)):
        return await g.regex("x", "((")

    @app.get("/too-short", responses=generation_error_responses())
    async def too_short(g: StructuredGenerator = Depends(gen)):
        return await g.json("x", Flag, max_new_tokens=2)

    typed_route(app, "/extract/flag", schema=Flag, prompt_template="Extract the flag as JSON.\n{text}", runtime=rt,
                max_new_tokens=48)
    return app


def test_dependency_and_typed_route(rt):
    with TestClient(make_app(rt)) as c:
        r = c.post("/flag", params={"text": "all good"})
        assert r.status_code == 200 and Flag.model_validate(r.json()), r.text
        r = c.get("/pick")
        assert r.status_code == 200
        body = r.json()
        assert body["choice"] in ("left", "right") and len(body["code"]) == 3 and "+" in body["sum"]
        r = c.post("/extract/flag", json={"text": "level is high"})
        assert r.status_code == 200 and Flag.model_validate(r.json())
        assert c.post("/extract/flag", json={"nope": 1}).status_code == 422      # FastAPI's body validation
        schema = c.get("/openapi.json").json()
        resp = schema["paths"]["/extract/flag"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert resp["$ref"].endswith("/Flag")


def test_typed_errors_become_http_4xx(rt):
    with TestClient(make_app(rt)) as c:
        r = c.get("/broken")
        assert r.status_code == 400 and r.json()["detail"]["code"] == "invalid_regex"
        r = c.get("/too-short")
        # a generation failure has its own status and body, distinct from FastAPI's validation 422
        assert r.status_code == GENERATION_ERROR_STATUS == 502
        body = GenerationErrorResponse.model_validate(r.json())
        assert body.detail.code == "length_exceeded" and body.detail.type == "generation_error"
        bad = c.post("/extract/flag", json={"nope": 1})
        assert bad.status_code == 422 and isinstance(bad.json()["detail"], list)


def test_generation_errors_are_in_the_openapi_schema(rt):
    with TestClient(make_app(rt)) as c:
        spec = c.get("/openapi.json").json()
    for path, method in (("/extract/flag", "post"), ("/too-short", "get")):
        resp = spec["paths"][path][method]["responses"]["502"]
        ref = resp["content"]["application/json"]["schema"]["$ref"]
        assert ref.endswith("/GenerationErrorResponse")
    detail = spec["components"]["schemas"]["GenerationErrorDetail"]
    assert {"message", "type", "code", "partial_text"} <= set(detail["properties"])


def test_sampling_options_pass_through(rt):
    with TestClient(make_app(rt)) as c:
        r = c.get("/hot")
        assert r.status_code == 200 and len(r.json()["code"]) == 3
        r = c.get("/bad-temperature")
        assert r.status_code == 400, r.text
