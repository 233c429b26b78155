"""The OpenAI-compatible FastAPI app: ``/v1/chat/completions``, ``/v1/completions``,
``/v1/models``, ``/health``.

Example::

    from dgemma_struct.server import ServerConfig, create_app
    app = create_app(config=ServerConfig(api_key="secret"))     # the embedded model
    # uvicorn.run(app, host="127.0.0.1", port=8000)
"""
from __future__ import annotations

import asyncio
import hmac
import json
import os
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dgemma_struct.api import constraint_for
from dgemma_struct.errors import DgemmaStructError, GenerationTimeout, ModelLoadError
from dgemma_struct.runtime import DiffusionRuntime

from .batcher import Batcher, QueueFull, ShuttingDown
from .errors import APIError, api_error_for, error_body
from .protocol import ChatCompletionRequest, CompletionRequest, prompt_of_messages, spec_of


@dataclass
class ServerConfig:
    """Server settings. ``from_env`` reads ``DGEMMA_STRUCT_HOST/PORT/MODEL/API_KEY``."""

    host: str = "127.0.0.1"
    port: int = 8000
    model: str | None = None              # a local checkpoint directory; None = the embedded model
    api_key: str | None = None            # when set, /v1/* needs ``Authorization: Bearer <key>``
    served_model_name: str | None = None  # the id /v1/models reports (default: the runtime's name)
    max_batch_size: int = 8
    max_wait_ms: float = 10.0
    max_queue: int = 64
    request_timeout_s: float = 60.0
    max_body_bytes: int = 1_000_000
    max_tokens_cap: int = 1024
    default_max_tokens: int = 256
    compile_timeout_s: float = 10.0
    max_concurrent_compiles: int = 2
    max_repairs: int = 2
    max_prompts_per_request: int = 16

    @classmethod
    def from_env(cls, **overrides: Any) -> "ServerConfig":
        env = {"host": os.environ.get("DGEMMA_STRUCT_HOST"), "port": os.environ.get("DGEMMA_STRUCT_PORT"),
               "model": os.environ.get("DGEMMA_STRUCT_MODEL"), "api_key": os.environ.get("DGEMMA_STRUCT_API_KEY")}
        values = {k: v for k, v in env.items() if v}
        if "port" in values:
            values["port"] = int(values["port"])
        values.update({k: v for k, v in overrides.items() if v is not None})
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


def load_runtime(model: str | None) -> DiffusionRuntime:
    """``model`` = a local checkpoint directory, or None for the embedded model. Never the hub."""
    if not model:
        return DiffusionRuntime.default()
    if not os.path.isdir(model):
        raise ModelLoadError(f"--model must be a local checkpoint directory; {model!r} is not one")
    return DiffusionRuntime.from_pretrained(model, local_files_only=True)


class ServerState:
    def __init__(self, runtime: DiffusionRuntime, config: ServerConfig):
        self.runtime = runtime
        self.config = config
        self.model_id = config.served_model_name or runtime.name
        self.created = int(time.time())
        self.batcher = Batcher(runtime, max_batch_size=config.max_batch_size, max_wait_ms=config.max_wait_ms,
                               max_queue=config.max_queue, max_repairs=config.max_repairs)
        self.compile_sem = asyncio.Semaphore(config.max_concurrent_compiles)

    # ------------------------------------------------------------------ request handling
    async def compile(self, spec: Any, param: str | None) -> Any:
        if spec is None:
            return None
        async with self.compile_sem:
            try:
                return await asyncio.wait_for(asyncio.to_thread(constraint_for, spec, self.runtime),
                                              self.config.compile_timeout_s)
            except asyncio.TimeoutError:
                raise APIError(400, f"compiling the constraint took longer than {self.config.compile_timeout_s:g} s",
                               param=param, code="constraint_too_complex") from None
            except DgemmaStructError as err:
                raise api_error_for(err, param=param) from None
            except Exception as err:  # noqa: BLE001 - a malformed spec the compiler did not anticipate
                raise APIError(400, f"cannot compile the constraint: {type(err).__name__}: {err}", param=param,
                               code="invalid_constraint") from None

    def check(self, req: Any) -> int:
        if req.model not in (None, "", self.model_id):
            raise APIError(404, f"the model {req.model!r} does not exist; this server serves {self.model_id!r}",
                           param="model", code="model_not_found")
        if (req.n or 1) != 1:
            raise APIError(400, "only n=1 is supported", param="n", code="unsupported_parameter")
        if getattr(req, "tools", None):
            raise APIError(400, "tools are not supported; use response_format or structured_outputs",
                           param="tools", code="unsupported_parameter")
        if getattr(req, "logprobs", None) or getattr(req, "echo", None):
            raise APIError(400, "logprobs/echo are not supported", param="logprobs", code="unsupported_parameter")
        max_tokens = req.max_completion_tokens or req.max_tokens or self.config.default_max_tokens
        if max_tokens > self.config.max_tokens_cap:
            raise APIError(400, f"max_tokens={max_tokens} exceeds this server's limit of {self.config.max_tokens_cap}",
                           param="max_tokens", code="max_tokens_too_large")
        return max_tokens

    def prompt_tokens(self, prompt: Any) -> int:
        try:
            return len(self.runtime.encode_prompt(prompt))
        except DgemmaStructError as err:
            raise api_error_for(err) from None

    async def run(self, req: Any, prompts: list[Any], *, chat: bool) -> Any:
        max_tokens = self.check(req)
        spec, param = spec_of(req)
        constraint = await self.compile(spec, param)
        n_prompt = await asyncio.to_thread(lambda: [self.prompt_tokens(p) for p in prompts])
        seed = 0 if req.seed is None else int(req.seed) % (2 ** 63)
        timeout = self.config.request_timeout_s
        if req.stream:
            if len(prompts) != 1:
                raise APIError(400, "streaming takes one prompt", param="prompt", code="unsupported_parameter")
            return await self.stream(req, prompts[0], constraint, max_tokens, seed, n_prompt[0], chat=chat)
        try:
            results = await asyncio.gather(*[self.batcher.submit(p, constraint, max_new_tokens=max_tokens, seed=seed,
                                                                 timeout_s=timeout) for p in prompts])
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - mapped to an OpenAI error response
            raise _http_error(err, param) from None
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        choices = []
        for i, r in enumerate(results):
            if chat:
                choices.append({"index": i, "message": {"role": "assistant", "content": r.text, "refusal": None},
                                "logprobs": None, "finish_reason": r.stats.finish_reason or "stop"})
            else:
                choices.append({"index": i, "text": r.text, "logprobs": None,
                                "finish_reason": r.stats.finish_reason or "stop"})
        completion = sum(len(r.token_ids) for r in results)
        body = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": self.model_id, "choices": choices, "system_fingerprint": None,
                "usage": {"prompt_tokens": sum(n_prompt), "completion_tokens": completion,
                          "total_tokens": sum(n_prompt) + completion},
                "dgemma_stats": [r.stats.to_dict() for r in results] if len(results) > 1 else results[0].stats.to_dict()}
        return JSONResponse(body)

    async def stream(self, req: Any, prompt: Any, constraint: Any, max_tokens: int, seed: int, n_prompt: int, *,
                     chat: bool) -> StreamingResponse:
        events = self.batcher.stream(prompt, constraint, max_new_tokens=max_tokens, seed=seed,
                                     timeout_s=self.config.request_timeout_s)
        try:
            first = await events.__anext__()   # errors before the first canvas are plain HTTP errors
        except StopAsyncIteration:
            first = None
        except asyncio.CancelledError:
            await events.aclose()
            raise
        except Exception as err:  # noqa: BLE001
            await events.aclose()
            raise _http_error(err, None) from None
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        include_usage = bool((req.stream_options or {}).get("include_usage"))

        def chunk(text: str | None, finish: str | None, *, role: bool = False, extra: dict | None = None) -> str:
            if chat:
                delta: dict[str, Any] = {}
                if role:
                    delta["role"] = "assistant"
                if text is not None:
                    delta["content"] = text
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            body = {"id": rid, "object": obj, "created": created, "model": self.model_id, "choices": [choice]}
            if extra:
                body.update(extra)
            return "data: " + json.dumps(body) + "\n\n"

        async def sse() -> AsyncIterator[str]:
            sent = ""
            canvases = 0
            try:
                if chat:
                    yield chunk("", None, role=True)
                ev = first
                while ev is not None:
                    if not ev.done:
                        canvases += 1
                        if ev.text.startswith(sent) and len(ev.text) > len(sent):
                            yield chunk(ev.text[len(sent):], None)
                            sent = ev.text
                    else:
                        if not ev.text.startswith(sent):
                            raise APIError(500, "the validated output differs from the streamed prefix (a repair "
                                                "rewrote it); retry without streaming", type="server_error",
                                           code="stream_diverged")
                        if len(ev.text) > len(sent):
                            yield chunk(ev.text[len(sent):], None)
                        completion = len(ev.token_ids)
                        yield chunk(None if chat else "", "stop", extra={"dgemma_stats": {"canvases": canvases}})
                        if include_usage:
                            yield "data: " + json.dumps({
                                "id": rid, "object": obj, "created": created, "model": self.model_id, "choices": [],
                                "usage": {"prompt_tokens": n_prompt, "completion_tokens": completion,
                                          "total_tokens": n_prompt + completion}}) + "\n\n"
                        yield "data: [DONE]\n\n"
                        return
                    try:
                        ev = await events.__anext__()
                    except StopAsyncIteration:
                        ev = None
                raise APIError(500, "the stream ended without a validated output", type="server_error",
                               code="stream_incomplete")
            except (asyncio.CancelledError, GeneratorExit):
                raise
            except BaseException as err:  # noqa: BLE001 - ends the stream with an error event, never "stop"
                e = _http_error(err, None)
                body = e.body()
                body["error"]["status"] = e.status
                yield "data: " + json.dumps(body) + "\n\n"
            finally:
                await events.aclose()

        return StreamingResponse(sse(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _http_error(err: BaseException, param: str | None) -> APIError:
    if isinstance(err, QueueFull):
        return APIError(429, str(err), type="rate_limit_error", code="queue_full")
    if isinstance(err, ShuttingDown):
        return APIError(503, str(err), type="server_error", code="unavailable")
    if isinstance(err, GenerationTimeout):
        return APIError(504, str(err) or "the request timed out", type="timeout_error", code="timeout")
    return api_error_for(err, param=param)


class _Guard:
    """Pure ASGI middleware: API key (401) and body-size limit (413) before the app reads a byte."""

    def __init__(self, app: Any, config: ServerConfig):
        self.app = app
        self.config = config

    async def _send_error(self, send: Any, status: int, body: dict, headers: list | None = None) -> None:
        data = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(data)).encode())] + (headers or [])})
        await send({"type": "http.response.body", "body": data})

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if self.config.api_key and path.startswith("/v1"):
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


def create_app(runtime: DiffusionRuntime | None = None, config: ServerConfig | None = None) -> FastAPI:
    """The server app. ``runtime`` = any :class:`DiffusionRuntime` (default: ``config.model`` or the
    embedded model, loaded at start-up). The generation worker starts with the app's lifespan."""
    config = config or ServerConfig()
    holder: dict[str, ServerState] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        rt = runtime if runtime is not None else await asyncio.to_thread(load_runtime, config.model)
        state = ServerState(rt, config)
        state.batcher.start()
        holder["state"] = state
        app.state.dgemma = state
        try:
            yield
        finally:
            state.batcher.stop()

    app = FastAPI(title="dgemma-struct", version="0.1.0", lifespan=lifespan,
                  description="OpenAI-compatible structured generation with DiffusionGemma models")

    def state() -> ServerState:
        if "state" not in holder:
            raise APIError(503, "the model is still loading", type="server_error", code="unavailable")
        return holder["state"]

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        errs = exc.errors()
        first = errs[0] if errs else {}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        where = ".".join(loc)
        msg = first.get("msg", "invalid request body")
        more = f" (and {len(errs) - 1} more problem(s))" if len(errs) > 1 else ""
        return JSONResponse(error_body(400, f"invalid request: {where + ': ' if where else ''}{msg}{more}",
                                       param=where or None, code="invalid_request_body"), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        typ = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return JSONResponse(error_body(exc.status_code, str(exc.detail), type=typ, code=code),
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(DgemmaStructError)
    async def _typed(request: Request, exc: DgemmaStructError):
        e = _http_error(exc, None)
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        return JSONResponse(error_body(500, f"internal error: {type(exc).__name__}", type="server_error",
                                       code="internal_error"), status_code=500)

    @app.post("/v1/chat/completions", summary="Chat completion with an optional output constraint")
    async def chat_completions(body: ChatCompletionRequest):
        return await state().run(body, [prompt_of_messages(body.messages)], chat=True)

    @app.post("/v1/completions", summary="Text completion (the prompt is sent as one user message)")
    async def completions(body: CompletionRequest):
        prompts = [body.prompt] if isinstance(body.prompt, str) else list(body.prompt)
        if not prompts:
            raise APIError(400, "prompt must not be empty", param="prompt", code="invalid_request")
        if len(prompts) > config.max_prompts_per_request:
            raise APIError(400, f"at most {config.max_prompts_per_request} prompts per request", param="prompt",
                           code="too_many_prompts")
        return await state().run(body, prompts, chat=False)

    @app.get("/v1/models")
    async def models():
        s = state()
        return {"object": "list", "data": [{"id": s.model_id, "object": "model", "created": s.created,
                                            "owned_by": "dgemma-struct"}]}

    @app.get("/v1/models/{model_id}")
    async def model(model_id: str):
        s = state()
        if model_id != s.model_id:
            raise APIError(404, f"the model {model_id!r} does not exist", param="model", code="model_not_found")
        return {"id": s.model_id, "object": "model", "created": s.created, "owned_by": "dgemma-struct"}

    @app.get("/health")
    async def health():
        if "state" not in holder:
            return JSONResponse({"status": "loading"}, status_code=503)
        s = holder["state"]
        ok = s.batcher.alive
        return JSONResponse({"status": "ok" if ok else "worker_down", "model": s.model_id,
                             "queue_depth": s.batcher.queue_depth, **s.batcher.counters},
                            status_code=200 if ok else 503)

    app.add_middleware(_Guard, config=config)
    return app
