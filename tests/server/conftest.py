"""A real uvicorn server on 127.0.0.1 (a random free port) in a background thread, serving the
tiny random runtime; stopped after the tests that use it."""
from __future__ import annotations

import httpx
import pytest
from server_harness import running_server

from dgemma_struct.testing import tiny_runtime


@pytest.fixture(scope="session")
def rt():
    return tiny_runtime()


@pytest.fixture(scope="module")
def server_url(rt):
    with running_server(rt, max_tokens_cap=256, default_max_tokens=64) as url:
        yield url


@pytest.fixture()
def client(server_url):
    with httpx.Client(base_url=server_url, timeout=60) as c:
        yield c
