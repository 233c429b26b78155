"""Connection limits for uvicorn: a request must arrive within ``header_timeout_s`` (slow or
idle clients are disconnected), at most ``max_connections`` are held (beyond that the oldest
*idle* connections are closed, so ``/health`` and real requests still get through a flood of idle
sockets), plus uvicorn's own ``timeout_keep_alive``, ``limit_concurrency`` and h11 header-size
limit, all from :class:`~dgemma_struct.server.ServerConfig`.

Example::

    import uvicorn
    from dgemma_struct.server import ServerConfig, create_app
    from dgemma_struct.server.connections import uvicorn_config

    cfg = ServerConfig(port=8000)
    uvicorn.Server(uvicorn_config(create_app(config=cfg), cfg)).run()
"""
from __future__ import annotations

import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["guarded_protocol", "uvicorn_config", "raise_fd_limit"]


def guarded_protocol(header_timeout_s: float, max_connections: int) -> type:
    """An h11 protocol class with a request-arrival timeout and an idle-connection cap."""

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._opened = time.monotonic()
            self._arrival_timer = None
            self._arm()
            if len(self.connections) > max_connections:
                self._shed()

        def _idle(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _shed(self) -> None:
            """Close the oldest idle connections until within the cap (this one included, last)."""
            idle = sorted((c for c in list(self.connections) if isinstance(c, GuardedH11Protocol) and c._idle()
                           and c is not self), key=lambda c: c._opened)
            excess = len(self.connections) - max_connections
            for c in idle[:excess]:
                c._drop()
            if len(self.connections) > max_connections:
                self._drop()

        def _drop(self) -> None:
            self._disarm()
            self.connections.discard(self)
            if self.transport is not None and not self.transport.is_closing():
                self.transport.close()

        def _arm(self) -> None:
            self._disarm()
            if header_timeout_s and header_timeout_s > 0:
                self._arrival_timer = self.loop.call_later(header_timeout_s, self._arrival_timeout)

        def _disarm(self) -> None:
            timer = getattr(self, "_arrival_timer", None)
            if timer is not None:
                timer.cancel()
                self._arrival_timer = None

        def _arrival_timeout(self) -> None:
            self._arrival_timer = None
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete and not cycle.more_body:
                return   # a whole request arrived and is being answered
            self._drop()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete and not cycle.more_body:
                self._disarm()   # the whole request is in

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._opened = time.monotonic()
            self._arm()          # the next request on this connection must arrive in time too

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return GuardedH11Protocol


def raise_fd_limit() -> None:
    """Raise the soft open-file limit to the hard limit (more sockets before EMFILE)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def uvicorn_config(app: Any, config: Any, *, log_level: str = "info", port: int | None = None) -> uvicorn.Config:
    """The ``uvicorn.Config`` for ``app`` with the connection limits of ``config`` (a
    :class:`~dgemma_struct.server.ServerConfig`); ``port`` overrides ``config.port`` (0 = any)."""
    return uvicorn.Config(
        app, host=config.host, port=config.port if port is None else port, log_level=log_level, lifespan="on",
        http=guarded_protocol(config.header_timeout_s, config.max_connections),
        timeout_keep_alive=max(1, int(round(config.timeout_keep_alive_s))),
        limit_concurrency=config.limit_concurrency,
        h11_max_incomplete_event_size=config.h11_max_incomplete_event_size)
