"""#15.1: inputs that crash llguidance (a segfault in-process) get typed 4xx answers from a real
server subprocess, which stays healthy and keeps serving."""
from __future__ import annotations

import httpx
import pytest

MSG = [{"role": "user", "content": "Give the answer as JSON."}]
I64_MIN = -(2 ** 63)
CRASHERS = [
    {"const": I64_MIN},                                  # the reported reproducer (SIGSEGV in-process)
    {"enum": [I64_MIN]},
    {"type": "integer", "const": I64_MIN},
    {"type": "integer", "minimum": I64_MIN, "maximum": I64_MIN},
    {"type": "object", "properties": {"a": {"const": I64_MIN}}, "required": ["a"]},
    {"const": 2 ** 64},                                  # beyond u64
    {"type": "integer", "maximum": -(2 ** 63) - 1},
    {"type": "number", "const": 1e308, "multipleOf": 1e-308},
]


def _error(r: httpx.Response) -> dict:
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] and err["message"] and len(r.content) < 4096
    return err


@pytest.mark.parametrize("schema", CRASHERS, ids=[str(i) for i in range(len(CRASHERS))])
def test_crashing_schema_is_a_4xx_and_the_server_survives(real_server, schema):
    url, proc = real_server
    r = httpx.post(url + "/v1/chat/completions", timeout=120,
                   json={"messages": MSG, "max_tokens": 16, "guided_json": schema})
    assert proc.poll() is None, "the server process died"
    assert r.status_code < 500, r.text
    if r.status_code != 200:
        assert 400 <= r.status_code < 500
        _error(r)
    h = httpx.get(url + "/health", timeout=10)
    assert h.status_code == 200 and h.json()["status"] == "ok"


def test_the_reproducer_is_typed_and_the_server_keeps_serving(real_server):
    """Whether the constraint layer rejects it, compiles it, or llguidance crashes on it (then in
    a compile worker), the answer is a typed 4xx or a valid 200."""
    url, proc = real_server
    r = httpx.post(url + "/v1/chat/completions", timeout=120,  # room for the 20-digit literal (exact since #26)
                   json={"messages": MSG, "max_tokens": 48, "guided_json": {"const": I64_MIN}})
    assert r.status_code in (200, 400, 422), r.text
    if r.status_code == 200:
        assert r.json()["choices"][0]["message"]["content"] == str(I64_MIN)
    else:
        assert _error(r)["code"] in ("constraint_engine_crash", "invalid_schema", "unsupported_schema_keyword",
                                     "constraint_engine_error", "generation_failed")
    # and the server still answers real work
    ok = httpx.post(url + "/v1/chat/completions", timeout=120,
                    json={"messages": MSG, "max_tokens": 8, "guided_choice": ["yes", "no"]})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] in ("yes", "no")
    assert proc.poll() is None


def test_a_contained_crash_maps_to_a_precise_400():
    from dgemma_struct.constraints.compile_pool import CompileCrashed
    from dgemma_struct.server.http_errors import api_error_for

    e = api_error_for(CompileCrashed("the constraint engine crashed (SIGSEGV)"), param="guided_json")
    assert (e.status, e.code, e.param) == (400, "constraint_engine_crash", "guided_json")
