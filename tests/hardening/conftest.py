"""The adversarial suite: reproducers of the hardening issue (#15), run against real servers.
``real_server`` is ``dgemma-struct serve`` in a subprocess (a native crash there would kill it,
not the tests); ``server_harness`` (tests/server) runs uvicorn in a thread."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))

from dgemma_struct.testing import tiny_runtime  # noqa: E402


@pytest.fixture(scope="session")
def rt():
    return tiny_runtime()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def real_server(rt, tmp_path_factory):
    """``dgemma-struct serve`` on a tiny checkpoint in a subprocess; yields (url, process)."""
    ckpt = tmp_path_factory.mktemp("tiny-ckpt")
    rt.model.save_pretrained(ckpt)
    rt.tokenizer.save_pretrained(ckpt)
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, "-m", "dgemma_struct.cli", "serve", "--model", str(ckpt),
                             "--port", str(port), "--log-level", "warning", "--compile-timeout", "20",
                             "--max-tokens-cap", "128"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out = proc.stdout.read().decode(errors="replace")
            pytest.fail(f"the server did not come up: {out[-2000:]}")
        time.sleep(0.2)
    try:
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
