"""Helpers for tests/clients: ``running_server`` (the app under a real uvicorn on 127.0.0.1:<free
port>, in a thread) and the vLLM samples of tests/data/vllm. Public API only."""
from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path

import uvicorn

from dgemma_struct.server import ServerConfig, create_app
from dgemma_struct.server.connections import uvicorn_config

VLLM_DATA = Path(__file__).resolve().parents[1] / "data" / "vllm"


def vllm_json(name: str):
    """A JSON sample copied from vLLM's tests (see tests/data/vllm/README.md)."""
    return json.loads((VLLM_DATA / name).read_text())


def vllm_text(name: str) -> str:
    return (VLLM_DATA / name).read_text()


@contextlib.contextmanager
def running_server(runtime, **config):
    """The app under uvicorn on 127.0.0.1:<free port>, in a thread; yields the base URL."""
    cfg = ServerConfig(**config)
    app = create_app(runtime, cfg)
    server = uvicorn.Server(uvicorn_config(app, cfg, log_level="warning", port=0))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    t0 = time.monotonic()
    while not server.started:
        if not thread.is_alive() or time.monotonic() - t0 > 30:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
