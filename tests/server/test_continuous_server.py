"""The server's continuous batching on the embedded model, against uvicorn on loopback:
concurrent requests and live streams share running batches, every answer validates, and with
``mode_choice="auto"`` the server picks diffusion or AR per batch and says which it used."""
from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import pytest
from server_harness import running_server

from dgemma_struct.testing import embedded_model_available
from dgemma_struct.training.corpus import make_corpus
from dgemma_struct.training.evaluate import HELD_OUT_SEED

pytestmark = pytest.mark.skipif(not embedded_model_available(),
                                reason="src/dgemma_struct/embedded/model.safetensors is missing")

CORPUS = [e for e in make_corpus(200, seed=HELD_OUT_SEED) if e.get("schema")][:10]


def _body(e: dict, seed: int, **kw) -> dict:
    return {"messages": [{"role": "user", "content": e["prompt"]}], "max_tokens": 128, "seed": seed,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": e["schema"]}}, **kw}


async def _one(client: httpx.AsyncClient, e: dict, seed: int, stream: bool) -> str:
    if not stream:
        r = await client.post("/v1/chat/completions", json=_body(e, seed))
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"], r.json()["dgemma_stats"]["mode"]
    text, finish = "", None
    async with client.stream("POST", "/v1/chat/completions", json=_body(e, seed, stream=True)) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                for c in chunk["choices"]:
                    text += c["delta"].get("content") or ""
                    finish = c.get("finish_reason") or finish
    assert finish == "stop"
    return text, None


async def _many(url: str, streams: set[int]) -> list:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        return await asyncio.gather(*[_one(client, e, i, i in streams) for i, e in enumerate(CORPUS)])


@pytest.mark.parametrize("mode_choice", ["requested", "auto"])
def test_concurrent_requests_and_live_streams_share_batches(mode_choice):
    with running_server(None, max_batch_size=8, stream_live=True, mode_choice=mode_choice) as url:
        out = asyncio.run(_many(url, streams={1, 4, 7}))
        health = httpx.get(url + "/health").json()
    for (text, _), e in zip(out, CORPUS):
        jsonschema.validate(json.loads(text), e["schema"])
    sched = health["scheduler"]
    assert health["continuous_rows"] >= len(CORPUS) and health["streams"] == 3
    assert sched["largest_batch"] >= 2                       # requests really ran together
    assert sched["rows_diffusion"] + sched["rows_ar"] >= len(CORPUS)
    modes = {m for _, m in out if m is not None}
    if mode_choice == "requested":
        assert sched["rows_ar"] == 0 and modes == {"diffusion"}
    else:
        assert modes <= {"diffusion", "ar"} and set(sched["mode_rates"]) == {"diffusion", "ar"}
