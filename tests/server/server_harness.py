"""``running_server``: the app under a real uvicorn on 127.0.0.1:<free port>, in a thread; it
yields once ``/health/ready`` answers 200 (the warm-up generation ran)."""
from __future__ import annotations

import contextlib
import threading
import time

import httpx
import uvicorn

from dgemma_struct.server import ServerConfig, create_app
from dgemma_struct.server.connections import uvicorn_config


@contextlib.contextmanager
def running_app(runtime, *, wait_ready: bool = True, verdicts=None, **config):
    """Start the app with uvicorn on 127.0.0.1:<free port>; yields ``(base URL, app)``."""
    cfg = ServerConfig(**config)
    app = create_app(runtime, cfg, verdicts=verdicts)
    server = uvicorn.Server(uvicorn_config(app, cfg, log_level="warning", port=0))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    t0 = time.monotonic()
    while not server.started:
        if not thread.is_alive() or time.monotonic() - t0 > 30:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    while wait_ready and httpx.get(url + "/health/ready", timeout=30).status_code != 200:
        if time.monotonic() - t0 > 120:
            raise RuntimeError("the server did not become ready: " + httpx.get(url + "/health/ready").text)
        time.sleep(0.05)
    try:
        yield url, app
    finally:
        server.should_exit = True
        thread.join(15)


@contextlib.contextmanager
def running_server(runtime, **config):
    """Start the app with uvicorn on 127.0.0.1:<free port>; yields the base URL once it is ready."""
    with running_app(runtime, **config) as (url, _):
        yield url
