"""FastAPI integration: typed outputs as a dependency, or a whole route from a pydantic model.

Dependency::

    from fastapi import Depends, FastAPI
    from pydantic import BaseModel
    from dgemma_struct.fastapi import StructuredGenerator, structured_generator

    class Person(BaseModel):
        name: str
        age: int

    app = FastAPI()
    gen = structured_generator()                  # the embedded model; or runtime=DiffusionRuntime(...)

    @app.post("/people", response_model=Person)
    async def extract(text: str, g: StructuredGenerator = Depends(gen)):
        return await g.json(f"Extract the person as JSON.\\n{text}", Person)

Route helper::

    from dgemma_struct.fastapi import typed_route
    typed_route(app, "/extract/person", schema=Person,
                prompt_template="Extract the name and age as JSON.\\n{text}")
    # POST /extract/person {"text": "..."}  ->  a Person; OpenAPI's response schema is Person's
    typed_route(app, "/extract/person/scored", schema=Person, confidence=True, prompt_template=...)
    # -> {"value": {...}, "confidence": {"/name": 0.98, "/age": 0.41}}  (docs/confidence.md)

Requests from concurrent handlers are batched into shared canvas loops by one worker thread per
runtime (see :class:`dgemma_struct.server.Batcher`); the event loop never runs the model.

Errors: typed errors become ``HTTPException`` with an OpenAI-style ``detail`` (``message``,
``type``, ``param``, ``code``): 400 bad spec or option, 429 queue full, 503 unavailable, 504
timeout. A **generation failure** (the request was valid, but the model produced no valid value
within the repairs and token budget: ``GenerationFailed``, ``LengthError``) is
:data:`GENERATION_ERROR_STATUS` (502) with the :class:`GenerationErrorResponse` body
(``detail.type == "generation_error"``, ``detail.code`` ``"generation_failed"`` or
``"length_exceeded"``, ``detail.partial_text``) — never 422, which stays FastAPI's own
request-validation error (a ``detail`` *list*). ``typed_route`` declares both in the OpenAPI
schema; for your own routes pass ``responses=generation_error_responses()``.
"""
from __future__ import annotations

import asyncio
import inspect
import threading
from typing import Any, Callable, Optional, Sequence

from fastapi import HTTPException
from pydantic import BaseModel, Field, create_model

from dgemma_struct.constraints import Choice, Constraint, Grammar, Regex
from dgemma_struct.errors import DgemmaStructError, GenerationFailed, LengthError
from dgemma_struct.repair.preparation import isolated_constraint_for
from dgemma_struct.runtime import DiffusionRuntime
from dgemma_struct.server.batcher import Batcher
from dgemma_struct.server.http_errors import QueueFull, ShuttingDown, api_error_for

__all__ = ["StructuredGenerator", "structured_generator", "typed_route", "to_http_exception",
           "GenerationErrorResponse", "GenerationErrorDetail", "generation_error_responses",
           "GENERATION_ERROR_STATUS"]

#: HTTP status of a generation failure (distinct from FastAPI's request-validation 422): the
#: request was valid; the model behind the route did not produce a valid value.
GENERATION_ERROR_STATUS = 502


class GenerationErrorDetail(BaseModel):
    """Why generation failed, OpenAI-style."""

    message: str
    type: str = Field("generation_error", description="always 'generation_error'")
    param: Optional[str] = None
    code: str = Field(..., description="'generation_failed' (no valid value after the repairs and AR "
                                       "fallback) or 'length_exceeded' (no valid value fits the token budget)")
    partial_text: str = Field("", description="what the model had written (never a valid value)")


class GenerationErrorResponse(BaseModel):
    """The body of a :data:`GENERATION_ERROR_STATUS` response."""

    detail: GenerationErrorDetail


def generation_error_responses() -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a FastAPI route that generates: documents the generation-failure status
    and body in the OpenAPI schema."""
    return {GENERATION_ERROR_STATUS: {"model": GenerationErrorResponse,
                                      "description": "Generation failed: the model produced no valid value "
                                                     "(repairs and fallback exhausted, or the token budget)"}}


_batchers: dict[int, Batcher] = {}
_lock = threading.Lock()


def _batcher_for(runtime: DiffusionRuntime, **opts: Any) -> Batcher:
    with _lock:
        b = _batchers.get(id(runtime))
        if b is None or b.runtime is not runtime or not b.alive:
            b = Batcher(runtime, **opts).start()
            _batchers[id(runtime)] = b
        return b


def to_http_exception(err: BaseException) -> HTTPException:
    """The ``HTTPException`` for a dgemma-struct error (400 bad spec/request, 429 queue full,
    502 generation failed or too long (:class:`GenerationErrorResponse`), 503 unavailable, 504
    timeout)."""
    if isinstance(err, (GenerationFailed, LengthError)):
        code = "length_exceeded" if isinstance(err, LengthError) else "generation_failed"
        detail = GenerationErrorDetail(message=str(err)[:2000], code=code,
                                       partial_text=(getattr(err, "partial_text", "") or "")[:10_000])
        return HTTPException(status_code=GENERATION_ERROR_STATUS, detail=detail.model_dump())
    e = api_error_for(err)
    return HTTPException(status_code=e.status, detail=e.body()["error"])


class StructuredGenerator:
    """Async, typed generation for request handlers. ``max_new_tokens``/``seed``/``timeout_s`` are
    defaults every call may override.

    ``isolate_compile`` (default True: specs in a web app come from users): each new spec is first
    compiled in a worker process (:func:`dgemma_struct.repair.preparation.isolated_constraint_for`), so a native
    crash of the constraint engine is a 400, never the end of the app's process.

    ``confidence`` (default False; every call may override it): :meth:`details` results carry
    ``.confidence``, the per-field confidence (JSON Pointer of each leaf -> probability; see
    :attr:`dgemma_struct.results.GenerationResult.confidence`)."""

    def __init__(self, runtime: DiffusionRuntime | None = None, *, max_new_tokens: int = 128, seed: int | None = 0,
                 timeout_s: float = 60.0, max_batch_size: int = 8, max_wait_ms: float = 10.0, max_queue: int = 64,
                 max_repairs: int = 2, raise_http: bool = True, isolate_compile: bool = True, confidence: bool = False):
        self._runtime = runtime
        self.isolate_compile = bool(isolate_compile)
        self.confidence = bool(confidence)
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.timeout_s = timeout_s
        self.raise_http = raise_http
        self._batcher_opts = dict(max_batch_size=max_batch_size, max_wait_ms=max_wait_ms, max_queue=max_queue,
                                  max_repairs=max_repairs)

    @property
    def runtime(self) -> DiffusionRuntime:
        if self._runtime is None:
            self._runtime = DiffusionRuntime.default()
        return self._runtime

    async def details(self, prompt: Any, spec: Any, *, max_new_tokens: int | None = None, seed: int | None = -1,
                      timeout_s: float | None = None, temperature: float | None = None,
                      top_p: float | None = None, confidence: bool | None = None):
        """The :class:`~dgemma_struct.results.GenerationResult` (``.value``, ``.text``, ``.stats``,
        with ``confidence`` (``None``: the generator's default) ``.confidence``).
        ``temperature`` / ``top_p`` as in :func:`dgemma_struct.generate` (``None``: the defaults)."""
        try:
            if self._runtime is None:
                await asyncio.to_thread(lambda: self.runtime)
            if self.isolate_compile and not isinstance(spec, Constraint):
                spec = await asyncio.to_thread(isolated_constraint_for, spec, self.runtime)
            batcher = _batcher_for(self.runtime, **self._batcher_opts)
            sampling = {k: v for k, v in (("temperature", temperature), ("top_p", top_p)) if v is not None}
            return await batcher.submit(prompt, spec, max_new_tokens=max_new_tokens or self.max_new_tokens,
                                        seed=self.seed if seed == -1 else seed,
                                        timeout_s=timeout_s or self.timeout_s,
                                        confidence=self.confidence if confidence is None else confidence, **sampling)
        except (DgemmaStructError, QueueFull, ShuttingDown) as err:
            if self.raise_http:
                raise to_http_exception(err) from err
            raise

    async def generate(self, prompt: Any, spec: Any, **opts: Any) -> Any:
        """The value for any spec :func:`dgemma_struct.generate` accepts."""
        return (await self.details(prompt, spec, **opts)).value

    async def json(self, prompt: Any, schema: Any, **opts: Any) -> Any:
        """A pydantic instance for a pydantic class, else a JSON value valid against ``schema``."""
        return await self.generate(prompt, schema, **opts)

    async def regex(self, prompt: Any, pattern: str, **opts: Any) -> str:
        return await self.generate(prompt, Regex(pattern), **opts)

    async def grammar(self, prompt: Any, lark_grammar: str, **opts: Any) -> str:
        return await self.generate(prompt, Grammar(lark_grammar), **opts)

    async def choice(self, prompt: Any, choices: Sequence[str], **opts: Any) -> str:
        return await self.generate(prompt, Choice(list(choices)), **opts)


def structured_generator(runtime: DiffusionRuntime | None = None, **defaults: Any
                         ) -> Callable[[], StructuredGenerator]:
    """A FastAPI dependency: ``Depends(structured_generator(runtime=rt))`` gives every handler the
    same :class:`StructuredGenerator` (one batching worker per runtime)."""
    gen = StructuredGenerator(runtime, **defaults)

    def dependency() -> StructuredGenerator:
        return gen
    dependency.generator = gen  # type: ignore[attr-defined]
    return dependency


def typed_route(app: Any, path: str, *, schema: type[BaseModel] | Any, prompt_template: str,
                input_model: type[BaseModel] | None = None, runtime: DiffusionRuntime | None = None,
                generator: StructuredGenerator | None = None, methods: Sequence[str] = ("POST",),
                max_new_tokens: int = 128, confidence: bool = False, **route_kwargs: Any) -> Callable:
    """Add a route to ``app`` (a FastAPI app or ``APIRouter``) that formats ``prompt_template``
    with the request body's fields, generates under ``schema`` and returns it; the route's
    ``response_model`` is ``schema``. ``input_model`` defaults to ``{"text": str}``.
    ``confidence=True``: the route returns ``{"value": <schema>, "confidence": {pointer: p}}``
    (the per-field confidence, docs/confidence.md) and declares that shape instead."""
    if input_model is None:
        input_model = create_model(f"{getattr(schema, '__name__', 'Typed')}Input", text=(str, ...))
    gen = generator or StructuredGenerator(runtime, max_new_tokens=max_new_tokens)
    name = getattr(schema, "__name__", "Typed")
    scored = create_model(f"{name}WithConfidence", value=(schema if isinstance(schema, type) else Any, ...),
                          confidence=(dict[str, float], ...)) if confidence else None

    async def endpoint(body: Any) -> Any:
        fields = body.model_dump() if hasattr(body, "model_dump") else dict(body)
        try:
            prompt = prompt_template.format(**fields)
        except (KeyError, IndexError) as err:
            raise HTTPException(500, detail={"message": f"prompt_template needs the field {err}",
                                             "type": "server_error", "param": None, "code": "bad_template"}) from err
        if scored is None:
            return await gen.json(prompt, schema)
        res = await gen.details(prompt, schema, confidence=True)
        return scored(value=res.value, confidence=res.confidence or {})

    endpoint.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("body", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=input_model)])
    endpoint.__annotations__ = {"body": input_model}
    endpoint.__name__ = "typed_" + path.strip("/").replace("/", "_").replace("-", "_")
    route_kwargs.setdefault("response_model", scored or (schema if isinstance(schema, type) else None))
    route_kwargs["responses"] = {**generation_error_responses(), **(route_kwargs.get("responses") or {})}
    app.add_api_route(path, endpoint, methods=list(methods), **route_kwargs)
    return endpoint
