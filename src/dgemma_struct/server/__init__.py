"""OpenAI-compatible HTTP server for dgemma-struct (``dgemma-struct serve``).

Example::

    from dgemma_struct.server import ServerConfig, create_app, serve
    serve(ServerConfig(port=8000))            # blocks; the embedded model on 127.0.0.1:8000
"""
from __future__ import annotations

from .app import create_app
from .batcher import Batcher
from .config import ServerConfig, load_runtime
from .http_errors import APIError, QueueFull, ShuttingDown, api_error_for
from .state import ServerState

__all__ = ["ServerConfig", "ServerState", "create_app", "load_runtime", "serve", "Batcher", "QueueFull",
           "ShuttingDown", "APIError", "api_error_for"]


def serve(config: ServerConfig | None = None, runtime=None, *, log_level: str = "info") -> None:
    """Run the server with uvicorn until interrupted (loads the model first, so a bad ``--model``
    fails before the port opens). SIGTERM drains: readiness turns 503, new requests get 503 with
    ``Retry-After``, in-flight requests finish within ``config.drain_timeout_s``, then it exits.
    Every log line carries the request id (``[request_id]``)."""
    from .connections import raise_fd_limit, uvicorn_config
    from .lifecycle import DrainingServer

    config = config or ServerConfig.from_env()
    if runtime is None:
        runtime = load_runtime(config.model, config.device, config.dtype)
    raise_fd_limit()
    app = create_app(runtime, config)
    ucfg = uvicorn_config(app, config, log_level=log_level)
    _log_request_ids(log_level)
    DrainingServer(ucfg, app.state.lifecycle, config.drain_timeout_s).run()


def _log_request_ids(level: str) -> None:
    import logging

    from uvicorn.logging import AccessFormatter, DefaultFormatter

    for name, fmt in (("uvicorn.error", DefaultFormatter("%(levelprefix)s [%(request_id)s] %(message)s")),
                      ("uvicorn.access", AccessFormatter(
                          '%(levelprefix)s [%(request_id)s] %(client_addr)s - "%(request_line)s" %(status_code)s'))):
        for h in logging.getLogger(name).handlers:
            h.setFormatter(fmt)
    server_log = logging.getLogger("dgemma_struct.server")
    if not server_log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(DefaultFormatter("%(levelprefix)s [%(request_id)s] %(message)s"))
        server_log.addHandler(handler)
        server_log.setLevel(level.upper())
        server_log.propagate = False
