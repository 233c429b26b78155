"""The outermost ASGI layer of the server (:class:`Edge`): the request id, drain refusals,
``Retry-After``, request metrics, one log line per request, and the API-key/body-size
:class:`~.guard.Guard` for everything but the probes and ``/metrics``.

* **Request ids**: ``x-request-id`` is honoured when the client sends a sane one (at most 128
  printable ASCII characters), generated otherwise; it is echoed on every response and set in
  :data:`REQUEST_ID` (a contextvar), which :func:`install_log_context` adds to every log record
  as ``request_id`` (``-`` outside a request).
* **Drain**: once :class:`~.lifecycle.Lifecycle` is draining, new ``/v1/*`` requests get 503
  ``shutting_down`` with ``Retry-After`` (another replica can take them); requests already
  admitted run to the end.
* **Retry-After** on every 429 and 503 (``ServerConfig.retry_after_s``).
* The probes (``/health``, ``/health/live``, ``/health/ready``) and ``/metrics`` never need the
  API key (kubelets and Prometheus do not send one; they carry no user data).

Example::

    from dgemma_struct.server.edge import REQUEST_ID, request_id_of
    assert request_id_of({"headers": [(b"x-request-id", b"abc-1")]}) == "abc-1"
    assert REQUEST_ID.get() == "-"
"""
from __future__ import annotations

import contextvars
import json
import logging
import time
import uuid
from typing import Any

from .config import ServerConfig
from .http_errors import error_body, safe_json_bytes
from .guard import Guard
from .lifecycle import Lifecycle
from .metrics import Metrics

__all__ = ["Edge", "REQUEST_ID", "request_id_of", "install_log_context", "PUBLIC_PATHS"]

#: The id of the request being answered (``-`` outside one).
REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("dgemma_struct_request_id", default="-")
PUBLIC_PATHS = frozenset({"/health", "/health/live", "/health/ready", "/metrics"})
log = logging.getLogger("dgemma_struct.server.access")


def request_id_of(scope: dict) -> str:
    """The client's ``x-request-id`` when it is sane (1-128 printable ASCII characters), else a new id."""
    for k, v in scope.get("headers") or ():
        if k.lower() == b"x-request-id":
            if 0 < len(v) <= 128 and all(0x21 <= b <= 0x7E for b in v):
                return v.decode("ascii")
            break
    return uuid.uuid4().hex


def install_log_context() -> None:
    """Give every log record a ``request_id`` attribute (the current request's id, or ``-``).
    Idempotent; wraps the current log record factory."""
    old = logging.getLogRecordFactory()
    if getattr(old, "_dgemma_request_id", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = old(*args, **kwargs)
        record.request_id = REQUEST_ID.get()
        return record
    factory._dgemma_request_id = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def _error_code(body: bytes) -> str | None:
    try:
        err = json.loads(body).get("error")
        return err.get("code") if isinstance(err, dict) else None
    except (ValueError, AttributeError):
        return None


class Edge:
    """Pure ASGI middleware in front of :class:`~.guard.Guard`; see the module docstring."""

    def __init__(self, app: Any, config: ServerConfig, lifecycle: Lifecycle, metrics: Metrics):
        self.app = app
        self.guarded = Guard(app, config=config)
        self.config, self.lifecycle, self.metrics = config, lifecycle, metrics

    async def _refuse(self, send: Any, rid: str) -> None:
        data = safe_json_bytes(error_body(503, "the server is shutting down; retry on another replica",
                                          type="server_error", code="shutting_down"))
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                                (b"x-request-id", rid.encode()),
                                (b"retry-after", str(self.config.retry_after_s).encode())]})
        await send({"type": "http.response.body", "body": data})

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        public = path in PUBLIC_PATHS
        rid = request_id_of(scope)
        token = REQUEST_ID.set(rid)
        seen: dict[str, Any] = {"status": None, "code": None, "error": False}
        retry = str(self.config.retry_after_s).encode()

        async def send_(msg: dict) -> None:
            if msg["type"] == "http.response.start":
                status = msg["status"]
                seen["status"], seen["error"] = status, status >= 400
                headers = [h for h in msg.get("headers") or () if h[0].lower() != b"x-request-id"]
                headers.append((b"x-request-id", rid.encode()))
                if status in (429, 503) and not any(h[0].lower() == b"retry-after" for h in headers):
                    headers.append((b"retry-after", retry))
                msg = {**msg, "headers": headers}
            elif msg["type"] == "http.response.body" and seen["error"] and seen["code"] is None:
                seen["code"] = _error_code(msg.get("body", b"")) or "-"
            await send(msg)

        t0 = time.perf_counter()
        tracked = not public
        try:
            if tracked and path.startswith("/v1/") and self.lifecycle.draining:
                seen["status"], seen["code"] = 503, "shutting_down"
                return await self._refuse(send, rid)
            if tracked:
                self.lifecycle.in_flight += 1
                self.metrics.in_flight.inc()
            try:
                await (self.app if public else self.guarded)(scope, receive, send_)
            finally:
                if tracked:
                    self.lifecycle.in_flight -= 1
                    self.metrics.in_flight.dec()
        finally:
            if tracked:
                status = seen["status"] or 500
                code = seen["code"] if seen["code"] not in (None, "-") else None
                self.metrics.request(status, code)
                if status >= 400:
                    self.lifecycle.errors += 1
                log.debug("%s %s -> %s%s in %.0f ms", scope.get("method"), path, status,
                         f" ({code})" if code else "", (time.perf_counter() - t0) * 1000)
            REQUEST_ID.reset(token)
