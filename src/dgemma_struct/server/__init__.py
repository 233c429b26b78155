"""OpenAI-compatible HTTP server for dgemma-struct (``dgemma-struct serve``).

Example::

    from dgemma_struct.server import ServerConfig, create_app, serve
    serve(ServerConfig(port=8000))            # blocks; the embedded model on 127.0.0.1:8000
"""
from __future__ import annotations

from .app import create_app
from .batcher import Batcher
from .config import ServerConfig, load_runtime
from .errors import APIError, QueueFull, ShuttingDown, api_error_for
from .state import ServerState

__all__ = ["ServerConfig", "ServerState", "create_app", "load_runtime", "serve", "Batcher", "QueueFull",
           "ShuttingDown", "APIError", "api_error_for"]


def serve(config: ServerConfig | None = None, runtime=None, *, log_level: str = "info") -> None:
    """Run the server with uvicorn until interrupted (loads the model first, so a bad ``--model``
    fails before the port opens)."""
    import uvicorn

    from .connections import raise_fd_limit, uvicorn_config

    config = config or ServerConfig.from_env()
    if runtime is None:
        runtime = load_runtime(config.model, config.device, config.dtype)
    raise_fd_limit()
    uvicorn.Server(uvicorn_config(create_app(runtime, config), config, log_level=log_level)).run()
