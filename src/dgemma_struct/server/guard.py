"""The ASGI middleware in front of the app: the header-size cap (431), the API key (401) and the
body-size limit (413), checked before the app reads a byte.

h11's ``max_incomplete_event_size`` only bounds headers that arrive in pieces: headers that arrive
in one read pass it whatever their size, so the documented cap is enforced here too."""
from __future__ import annotations

import hmac
from typing import Any

from .config import ServerConfig
from .http_errors import error_body, safe_json_bytes


class Guard:
    """Pure ASGI middleware: API key (401) and body-size limit (413) before the app reads a byte."""

    def __init__(self, app: Any, config: ServerConfig):
        self.app = app
        self.config = config

    async def _send_error(self, send: Any, status: int, body: dict, headers: list | None = None) -> None:
        data = safe_json_bytes(body)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(data)).encode())] + (headers or [])})
        await send({"type": "http.response.body", "body": data})

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        cap = self.config.h11_max_incomplete_event_size
        raw = scope.get("headers") or []
        size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") + \
            sum(len(k) + len(v) + 4 for k, v in raw)
        if cap and size > cap:
            return await self._send_error(send, 431, error_body(
                431, f"the request headers exceed {cap} bytes", code="request_header_fields_too_large"),
                [(b"connection", b"close")])
        if self.config.api_key and path != "/health":   # /docs and /openapi.json too
            auth = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
            token = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(token.encode(), self.config.api_key.encode()):
                return await self._send_error(send, 401, error_body(
                    401, "missing or invalid API key (send 'Authorization: Bearer <key>')",
                    code="invalid_api_key"), [(b"www-authenticate", b"Bearer")])
        limit = self.config.max_body_bytes
        headers = dict(scope.get("headers") or [])
        try:
            declared = int(headers.get(b"content-length", b"0") or 0)
        except ValueError:
            declared = 0
        too_large = error_body(413, f"the request body exceeds {limit} bytes", code="request_too_large")
        if declared > limit:
            return await self._send_error(send, 413, too_large)
        if scope.get("method") in ("POST", "PUT", "PATCH") and b"content-length" not in headers:
            # chunked upload: buffer up to the limit, then replay
            chunks, size = [], 0
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    return
                chunks.append(msg.get("body", b""))
                size += len(chunks[-1])
                if size > limit:
                    return await self._send_error(send, 413, too_large)
                if not msg.get("more_body"):
                    break
            body = b"".join(chunks)
            sent = False

            async def replay() -> dict:
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()
            return await self.app(scope, replay, send)
        return await self.app(scope, receive, send)
