"""#26.8: the documented 64 KB header cap holds when the headers arrive in one piece (h11 only bounds
headers that arrive in parts). Loopback only."""
from __future__ import annotations

import httpx
import pytest
from server_harness import running_server


@pytest.fixture(scope="module")
def url(rt):
    with running_server(rt, max_tokens_cap=32, default_max_tokens=8) as u:
        yield u


def test_seventy_kilobytes_of_headers_are_refused(url):
    r = httpx.get(url + "/v1/models", headers={"x-pad": "a" * 70_000}, timeout=30)
    assert r.status_code == 431, r.status_code
    assert r.json()["error"]["code"] == "request_header_fields_too_large"


def test_headers_under_the_cap_pass(url):
    r = httpx.get(url + "/v1/models", headers={"x-pad": "a" * 30_000}, timeout=30)
    assert r.status_code == 200
