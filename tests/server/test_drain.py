"""SIGTERM drains ``dgemma-struct serve`` (``serve()`` in a subprocess, the tiny runtime with a slowed
forward so a request is in flight): readiness turns 503, new work is refused with 503 and
Retry-After, the request in flight still gets its 200, and the process exits — at once when the
work is done, and no later than ``drain_timeout_s`` (plus a second) when it is not."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

SCRIPT = textwrap.dedent("""
    import sys, time
    import torch
    torch.set_num_threads(1)
    from dgemma_struct.testing import tiny_runtime
    from dgemma_struct.server import ServerConfig, serve
    rt = tiny_runtime()
    forward = rt.model.forward
    def slow(*a, **k):
        time.sleep(float(sys.argv[3]))
        return forward(*a, **k)
    rt.model.forward = slow
    serve(ServerConfig(port=int(sys.argv[1]), drain_timeout_s=float(sys.argv[2]), isolate_compiles=False,
                       max_tokens_cap=256), rt, log_level="info")
""")
BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 96}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(drain_s: float, delay_s: float) -> tuple[subprocess.Popen, str]:
    port = _port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(port), str(drain_s), str(delay_s)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    while True:
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() - t0 < 120, "the server did not become ready"
        try:
            if httpx.get(url + "/health/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)


def _in_flight(url: str) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def go():
        out["r"] = httpx.post(url + "/v1/chat/completions", json=BODY, timeout=60,
                              headers={"x-request-id": "drain-req-1"})
    t = threading.Thread(target=go)
    t.start()
    t0 = time.monotonic()
    while httpx.get(url + "/health").json().get("in_flight", 0) < 1:
        assert time.monotonic() - t0 < 10
        time.sleep(0.02)
    return t, out


def test_sigterm_finishes_in_flight_work_refuses_new_work_then_exits():
    proc, url = _start(drain_s=30, delay_s=0.05)
    try:
        t, out = _in_flight(url)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        ready = httpx.get(url + "/health/ready", timeout=5)
        assert ready.status_code == 503 and ready.json()["status"] == "draining"
        refused = httpx.post(url + "/v1/chat/completions", json=BODY, timeout=5)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
        assert refused.headers["retry-after"]
        t.join(60)
        assert out["r"].status_code == 200, out["r"].text
        t0 = time.monotonic()
        assert proc.wait(30) == 0
        assert time.monotonic() - t0 < 10     # exits once the work is done, not at the 30 s limit
        log = proc.stdout.read()
        # every log line carries the request id: the access line of the request and of the refusal
        assert "[drain-req-1]" in log and '"POST /v1/chat/completions HTTP/1.1" 200' in log, log[-2000:]
        assert f"[{refused.headers['x-request-id']}]" in log, log[-2000:]
    finally:
        proc.kill()


def test_the_drain_is_bounded():
    proc, url = _start(drain_s=1.5, delay_s=0.5)     # the request in flight needs ~20 s
    try:
        _in_flight(url)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        took = time.monotonic() - t0
        # the limit, uvicorn's 1 s cut, then the running canvas ends (6 forwards of 0.5 s here);
        # measured 6.2 s on a loaded 2-core machine
        assert took < 1.5 + 1 + 3 + 5, took
    finally:
        proc.kill()
