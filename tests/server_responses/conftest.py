"""``POST /v1/responses`` and custom tools through the real ``openai`` SDK against uvicorn on loopback,
serving the embedded model (Gemma 4's dialect: tool-call and channel tokens, trained on tool calls)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))

from server_harness import running_server  # noqa: E402

from dgemma_struct.testing import embedded_model_available  # noqa: E402

MODEL = "dgemma-struct-embedded"


def pytest_collection_modifyitems(items):
    if not embedded_model_available():
        skip = pytest.mark.skip(reason="src/dgemma_struct/embedded/model.safetensors is missing")
        for item in items:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def server_url():
    from dgemma_struct.runtime import DiffusionRuntime

    with running_server(DiffusionRuntime.default(), max_tokens_cap=512, default_max_tokens=96,
                        request_timeout_s=120) as url:
        yield url


@pytest.fixture(scope="session")
def oai(server_url):
    import openai

    client = openai.OpenAI(base_url=server_url + "/v1", api_key="unused", max_retries=0, timeout=180)
    yield client
    client.close()
