"""The OpenAI-compatible FastAPI app: ``/v1/chat/completions``, ``/v1/completions``,
``/v1/responses`` (:mod:`.responses_api`), ``/v1/models``, the probes ``/health`` (readiness with counters), ``/health/live``,
``/health/ready`` and the Prometheus ``/metrics``. Routes and error handlers only; a request's
work is :func:`.completions.run`, the response bodies are the models of :mod:`.responses`, the
outer layer (request ids, drain, ``Retry-After``) is :mod:`.edge`, readiness is :mod:`.lifecycle`.

Example::

    from dgemma_struct.server import ServerConfig, create_app
    app = create_app(config=ServerConfig(api_key="secret"))     # the embedded model
    # uvicorn.run(app, host="127.0.0.1", port=8000)
"""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from dgemma_struct.errors import DgemmaStructError
from dgemma_struct.runtime import DiffusionRuntime

from .completions import run as run_completion
from .config import ServerConfig, load_runtime
from .edge import Edge, install_log_context
from .http_errors import APIError, api_error_for, error_body
from .lifecycle import Lifecycle, warm_up
from .metrics import Metrics
from .protocol import ChatCompletionRequest, CompletionRequest, prompt_of_messages, spec_of
from .responses import ChatCompletion, Completion, Health, ModelCard, ModelList, error_responses, json_response
from .responses_api import ResponsesRequest, respond
from .state import ServerState
from .verdicts import Verdicts
from .tool_calls import chat_prompt, tool_request_of

__all__ = ["create_app", "ServerConfig", "ServerState", "load_runtime"]

_GENERATION_ERRORS = error_responses(400, 401, 404, 413, 422, 429, 503, 504)
_STREAM = {200: {"content": {"text/event-stream": {}},
                 "description": "the body, or with ``stream: true`` server-sent events of chunks"}}


def create_app(runtime: DiffusionRuntime | None = None, config: ServerConfig | None = None, *,
               verdicts: Verdicts | None = None) -> FastAPI:
    """The server app. ``runtime`` = any :class:`DiffusionRuntime` (default: ``config.model`` or the
    embedded model, loaded at start-up). The generation worker starts with the app's lifespan, then
    a warm-up generation runs (``/health/ready`` answers 200 after it). ``verdicts``: a store of
    refused constraints (default: this process's own; the Ray example shares one across replicas).
    ``app.state.lifecycle`` and ``app.state.metrics`` are the probes' and ``/metrics``' sources."""
    config = config or ServerConfig()
    holder: dict[str, ServerState] = {}
    lifecycle, metrics = Lifecycle(), Metrics()
    install_log_context()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        rt = runtime if runtime is not None else await asyncio.to_thread(load_runtime, config.model, config.device, config.dtype)
        state = ServerState(rt, config, metrics=metrics, verdicts=verdicts)
        state.start()
        metrics.bind(lambda: state.batcher.queue_depth, lambda: state.batcher.running_rows, config.max_batch_size)
        holder["state"] = state
        app.state.dgemma = state
        lifecycle.loaded = True
        warm = asyncio.ensure_future(warm_up(state, lifecycle)) if config.warmup else None
        lifecycle.warmed = not config.warmup
        try:
            yield
        finally:
            lifecycle.begin_drain()
            if warm is not None:
                warm.cancel()
            state.stop()

    app = FastAPI(title="dgemma-struct", version="0.1.0", lifespan=lifespan,
                  description="OpenAI-compatible structured generation with DiffusionGemma models")
    app.state.lifecycle, app.state.metrics = lifecycle, metrics

    def state() -> ServerState:
        if "state" not in holder:
            raise APIError(503, "the model is still loading", type="server_error", code="unavailable")
        return holder["state"]

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return json_response(exc.body(), exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        errs = exc.errors()
        first = errs[0] if errs else {}
        # a body that is not JSON at all: pydantic's location is a character offset, not a field
        loc = [] if first.get("type") == "json_invalid" else [str(x) for x in first.get("loc", ()) if x != "body"]
        where = ".".join(loc) if loc else ("body" if first.get("type") == "json_invalid" else "")
        msg = first.get("msg", "invalid request body")
        more = f" (and {len(errs) - 1} more problem(s))" if len(errs) > 1 else ""
        return json_response(error_body(400, f"invalid request: {where + ': ' if where else ''}{msg}{more}",
                                        param=where or None, code="invalid_request_body"), 400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        typ = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return json_response(error_body(exc.status_code, str(exc.detail), type=typ), exc.status_code,
                             headers=getattr(exc, "headers", None))

    @app.exception_handler(DgemmaStructError)
    async def _typed(request: Request, exc: DgemmaStructError):
        e = api_error_for(exc)
        return json_response(e.body(), e.status)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        return json_response(error_body(500, f"internal error: {type(exc).__name__}", type="server_error",
                                        code="internal_error"), 500)

    @app.post("/v1/chat/completions", summary="Chat completion with an optional output constraint",
              response_model=ChatCompletion, responses={**_STREAM, **_GENERATION_ERRORS})
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        _, param = spec_of(body)
        tool_req = tool_request_of(body, output_constraint=param)
        toolish = any(m.role in ("tool", "function") or (m.model_extra or {}).get("tool_calls")
                      or (m.model_extra or {}).get("function_call") for m in body.messages)
        prompt = chat_prompt(body.messages, tool_req) if (tool_req or toolish) else prompt_of_messages(body.messages)
        return await run_completion(state(), body, [prompt], chat=True, request=request, tool_req=tool_req)

    @app.post("/v1/completions", summary="Text completion (the prompt is sent as one user message)",
              response_model=Completion, responses={**_STREAM, **_GENERATION_ERRORS})
    async def completions(body: CompletionRequest, request: Request):
        prompts = [body.prompt] if isinstance(body.prompt, str) else list(body.prompt)
        if not prompts:
            raise APIError(400, "prompt must not be empty", param="prompt", code="invalid_request")
        if len(prompts) > config.max_prompts_per_request:
            raise APIError(400, f"at most {config.max_prompts_per_request} prompts per request", param="prompt",
                           code="too_many_prompts")
        return await run_completion(state(), body, prompts, chat=False, request=request)

    @app.post("/v1/responses", summary="OpenAI's Responses API (text, json_schema, function and custom tools)",
              responses={200: {"content": {"application/json": {}, "text/event-stream": {}},
                               "description": "a response object, or with ``stream: true`` its events"},
                         **_GENERATION_ERRORS})
    async def responses(body: ResponsesRequest, request: Request):
        return await respond(state(), body, request)

    @app.get("/v1/models", response_model=ModelList, responses=error_responses(401, 503))
    async def models():
        s = state()
        return json_response(ModelList(data=[ModelCard(id=s.model_id, created=s.created)]))

    @app.get("/v1/models/{model_id}", response_model=ModelCard, responses=error_responses(401, 404, 503))
    async def model(model_id: str):
        s = state()
        if model_id != s.model_id:
            raise APIError(404, f"the model {model_id!r} does not exist", param="model", code="model_not_found")
        return json_response(ModelCard(id=s.model_id, created=s.created))

    def readiness() -> tuple[str, int]:
        if "state" not in holder:
            return "loading", 503
        if not holder["state"].batcher.alive:
            return "worker_down", 503
        if lifecycle.draining:
            return "draining", 503
        return ("ok", 200) if lifecycle.warmed else ("warming_up", 503)

    @app.get("/health", response_model=Health, responses={503: {"model": Health, "description": "not ready"}})
    async def health():
        """Readiness with the counters: 200 ``ok`` once a request can be answered (loaded, warmed up,
        not draining); 503 ``loading`` / ``warming_up`` / ``draining`` / ``worker_down`` otherwise."""
        status, code = readiness()
        if "state" not in holder:
            return json_response(Health(status=status), code)
        s = holder["state"]
        counters = dict(s.batcher.counters, worker_errors=s.batcher.counters["errors"], errors=lifecycle.errors)
        return json_response(Health(status=status, model=s.model_id, queue_depth=s.batcher.queue_depth,
                                    running_rows=s.batcher.running_rows, **lifecycle.summary(), **counters,
                                    verdicts=dict(s.verdicts.counters, size=len(s.verdicts)),
                                    compile_workers=dict(s.pool.counters) if s.pool is not None else None), code)

    @app.get("/health/live", summary="Liveness: 200 while the process and its generation worker run")
    async def live():
        down = "state" in holder and not holder["state"].batcher.worker_alive
        return json_response({"status": "worker_down" if down else "alive"}, 503 if down else 200)

    @app.get("/health/ready", summary="Readiness: 200 when a new request can be answered now")
    async def ready():
        status, code = readiness()
        return json_response({"status": status, **lifecycle.summary()}, code)

    @app.get("/metrics", summary="Prometheus metrics (text exposition format)")
    async def prometheus():
        metrics.ready.set(1 if readiness()[1] == 200 else 0)
        metrics.draining.set(1 if lifecycle.draining else 0)
        body, ctype = metrics.render()
        return Response(body, media_type=ctype)

    app.add_middleware(Edge, config=config, lifecycle=lifecycle, metrics=metrics)
    return app
