"""#15.3/15.5/15.7: connections (idle floods, slow clients, disconnects), bodies that must be
4xx (lone surrogates), bounded error bodies, codes never null, docs behind the API key."""
from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from server_harness import running_server

MSG = [{"role": "user", "content": "Give the answer as JSON."}]


@pytest.fixture(scope="module")
def url(rt):
    with running_server(rt, max_tokens_cap=256, default_max_tokens=32, header_timeout_s=1.5,
                        timeout_keep_alive_s=1, max_connections=40) as u:
        yield u


def _addr(url: str) -> tuple[str, int]:
    host, port = url.rsplit("//", 1)[1].split(":")
    return host, int(port)


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_health_stays_reachable_under_an_idle_connection_flood(url):
    socks = []
    try:
        for _ in range(120):                           # 3x max_connections idle sockets
            s = socket.create_connection(_addr(url))
            socks.append(s)
        time.sleep(0.2)
        t0 = time.monotonic()
        h = httpx.get(url + "/health", timeout=10)
        assert h.status_code == 200 and h.json()["status"] == "ok"
        assert time.monotonic() - t0 < 5
        # the oldest idle ones were shed to stay within the cap
        assert _closed_by_server(socks[0], 3)
    finally:
        for s in socks:
            s.close()


def test_a_slow_client_is_disconnected(url):
    s = socket.create_connection(_addr(url))
    try:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n")  # never finishes
        t0 = time.monotonic()
        assert _closed_by_server(s, 10)
        assert time.monotonic() - t0 < 8
    finally:
        s.close()
    s = socket.create_connection(_addr(url))
    try:   # headers complete, body trickles
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"messages\"")
        assert _closed_by_server(s, 10)
    finally:
        s.close()
    assert httpx.get(url + "/health", timeout=10).status_code == 200


def test_disconnect_cancels_a_non_streaming_request(url):
    # an answer that cannot be short (a JSON object could close after a few tokens, then nothing is
    # left running to cancel): 8 samples of 240 alternating letters and digits are ~240 tokens each,
    # about 3 s on the tiny model
    body = {"messages": MSG, "guided_regex": "([a-z][0-9]){120}", "max_tokens": 250, "seed": 0, "n": 8}
    # compile it once first: the abandoned request must be running, not compiling, when it goes
    httpx.post(url + "/v1/chat/completions", json={**body, "max_tokens": 4}, timeout=120)
    before = httpx.get(url + "/health").json()["cancelled_rows"]
    with pytest.raises(httpx.TimeoutException):
        httpx.post(url + "/v1/chat/completions", json=body, timeout=0.5)
    deadline = time.monotonic() + 60
    while httpx.get(url + "/health").json()["cancelled_rows"] == before:
        assert time.monotonic() < deadline, "the abandoned row was never dropped"
        time.sleep(0.2)
    r = httpx.post(url + "/v1/chat/completions", json={"messages": MSG, "guided_choice": ["x", "y"],
                                                        "max_tokens": 8}, timeout=60)
    assert r.status_code == 200


def _err(r: httpx.Response) -> dict:
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"], r.text                          # never null
    return err


def test_lone_surrogates_are_400(url):
    for raw in [b'{"messages": [{"role": "user", "content": "hi \\ud800 there"}]}',
                b'{"messages": [{"role": "user", "content": "x"}], "guided_regex": "a\\udfff"}',
                b'{"messages": [{"role": "user", "content": "x"}], "guided_choice": ["\\ud800"]}',
                b'{"prompt": "\\ud83d", "max_tokens": 4}']:
        path = "/v1/completions" if raw.startswith(b'{"prompt"') else "/v1/chat/completions"
        r = httpx.post(url + path, content=raw, headers={"content-type": "application/json"}, timeout=60)
        assert r.status_code == 400, (raw, r.text)
        assert _err(r)["code"] == "invalid_unicode"


def test_error_bodies_are_bounded_and_coded(url):
    huge = "start: " + " | ".join(f'"tok{i}"' for i in range(20000)) + " | ("
    r = httpx.post(url + "/v1/chat/completions", json={"messages": MSG, "guided_grammar": huge}, timeout=120)
    assert r.status_code == 400 and len(huge) > 100_000
    assert len(r.content) < 4096 and _err(r)["code"] == "invalid_grammar"
    for method, path, body in [("GET", "/v1/chat/completions", None), ("GET", "/nope", None),
                               ("POST", "/v1/chat/completions", {"messages": "x"}),
                               ("DELETE", "/v1/models", None)]:
        r = httpx.request(method, url + path, json=body, timeout=30)
        assert 400 <= r.status_code < 500
        _err(r)


def test_docs_need_the_api_key(rt):
    with running_server(rt, api_key="k") as u:
        for path in ("/docs", "/openapi.json", "/redoc"):
            assert httpx.get(u + path).status_code == 401
        assert httpx.get(u + "/openapi.json", headers={"Authorization": "Bearer k"}).status_code == 200
        assert httpx.get(u + "/health").status_code == 200
