"""Real third-party clients (openai, litellm, instructor, langchain-openai, pydantic-ai) against a real
uvicorn on 127.0.0.1.

One module-scoped server per test module, serving the tiny random runtime. Nothing here may reach
the network: litellm reads its model-cost map from the copy it ships (``LITELLM_LOCAL_MODEL_COST_MAP``)
and its telemetry / callbacks are off; these variables are set at import time, before any test
module imports litellm. Only the public API and HTTP are used (``create_app``, ``ServerConfig``,
``uvicorn_config``, ``tiny_runtime``), so the tests survive internal refactors.
"""
from __future__ import annotations

import os

# before litellm (or anything importing it) is imported: no network at import, no telemetry
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ.setdefault("LITELLM_TELEMETRY", "False")
os.environ.setdefault("LITELLM_LOG", "ERROR")
os.environ.setdefault("DISABLE_AIOHTTP_TRANSPORT", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# langchain / langsmith: no tracing, no run uploads; pydantic-ai: logfire (if ever installed) sends nothing
os.environ["LANGSMITH_TRACING"] = "false"
os.environ["LANGCHAIN_TRACING_V2"] = "false"
os.environ.setdefault("LOGFIRE_SEND_TO_LOGFIRE", "false")

import pytest  # noqa: E402
from clients_harness import running_server  # noqa: E402

from dgemma_struct.testing import tiny_runtime  # noqa: E402


@pytest.fixture(scope="session")
def rt():
    return tiny_runtime()


@pytest.fixture(scope="module")
def server_url(rt):
    with running_server(rt, max_tokens_cap=1024, default_max_tokens=64, request_timeout_s=120) as url:
        yield url


@pytest.fixture(scope="module")
def model_id(server_url):
    import httpx

    return httpx.get(f"{server_url}/v1/models", timeout=30).json()["data"][0]["id"]


@pytest.fixture(scope="module")
def oai(server_url):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0, timeout=180)
    yield client
    client.close()


@pytest.fixture(scope="module")
def embedded_server_url():
    """A server on the embedded model (Gemma 4's dialect: tool and channel tokens, trained on tool calls)."""
    from dgemma_struct.runtime import DiffusionRuntime

    with running_server(DiffusionRuntime.default(), max_tokens_cap=1024, default_max_tokens=96,
                        request_timeout_s=120) as url:
        yield url
