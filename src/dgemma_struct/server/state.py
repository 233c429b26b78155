"""What a running server holds (:class:`ServerState`: the runtime, the batcher, the compile
executors and worker pool) and the per-request steps that use it: checks, constraint compiles,
token counts. The request pipeline itself is :mod:`.completions`."""
from __future__ import annotations

import asyncio
import functools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dgemma_struct.api import constraint_for
from dgemma_struct.constraints import cache_info
from dgemma_struct.constraints.thinking import THOUGHT_CLOSE, THOUGHT_OPEN
from dgemma_struct.errors import DgemmaStructError, GroundingError
from dgemma_struct.grounding import compile_grounded, grounded_sources, grounding_options, has_grounding
from dgemma_struct.runtime import DiffusionRuntime

from .batcher import Batcher
from dgemma_struct.constraints.compile_pool import SMALL_SPEC_BYTES, CompilePool, PoolBusy, spec_key, spec_size
from .config import ServerConfig
from .http_errors import APIError, api_error_for, compiled
from .metrics import Metrics
from .verdicts import REMEMBERED_CODES, Verdicts
from .tool_calls.request import prepare_tokenizer


class ServerState:
    """The runtime and everything the server runs it with; :meth:`start` / :meth:`stop` follow the
    app's lifespan."""

    def __init__(self, runtime: DiffusionRuntime, config: ServerConfig, *, metrics: Metrics | None = None,
                 verdicts: Verdicts | None = None):
        self.runtime = runtime
        self.metrics = metrics
        self.verdicts = verdicts if verdicts is not None else Verdicts(ttl_s=config.verdict_ttl_s)
        self.config = config
        self.model_id = config.served_model_name or runtime.name
        self.created = int(time.time())
        self.batcher = Batcher(runtime, max_batch_size=config.max_batch_size, max_wait_ms=config.max_wait_ms,
                               max_queue=config.max_queue, max_repairs=config.max_repairs,
                               queue_timeout_s=config.queue_timeout_s, batching=config.batching,
                               mode_choice=config.mode_choice, metrics=metrics)
        self.compile_sem = asyncio.Semaphore(config.max_concurrent_compiles)
        # compiles never share an executor with anything else (prompts, generation)
        self.compile_executor = ThreadPoolExecutor(max_workers=config.max_concurrent_compiles,
                                                   thread_name_prefix="dgemma-struct-compile")
        # a lane of its own for small specs (a choice, a flat object): a flood of big compiles
        # holding every slot above never holds them up (the pool has a matching worker lane)
        self.small_sem = asyncio.Semaphore(1)
        self._inflight: dict[str, asyncio.Future] = {}   # spec key -> its compile in progress
        self.small_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dgemma-struct-compile-small")
        # specs whose probe succeeded before: compiled (usually a cache hit) without waiting for a slot
        self.known_executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="dgemma-struct-compile-known")
        self.pool = (CompilePool(config.max_concurrent_compiles, memory_mb=config.compile_memory_mb or None)
                     if config.isolate_compiles else None)

    def start(self) -> None:
        self.batcher.start()
        if self.pool is not None:   # start the compile workers in the background
            threading.Thread(target=self._warm, daemon=True, name="dgemma-struct-compile-warm").start()

    def _warm(self) -> None:
        # every lane's workers, the small lane's included: with only one started, the first flood of
        # big specs took it and a small spec paid a worker's start-up (4 s measured) behind them
        try:
            self.pool.warm(self.pool.max_workers)
        except Exception:  # noqa: BLE001 - the first compile starts one instead
            pass

    def stop(self) -> None:
        # compiles nobody will wait for (the warm-up's, a request cut by the shutdown): cancelled here,
        # else the workers killed below fail them and asyncio.run reports each as an unhandled error
        for task in list(self._inflight.values()):
            task.cancel()
        self.batcher.stop()
        if self.pool is not None:
            self.pool.close()
        self.compile_executor.shutdown(wait=False, cancel_futures=True)
        self.small_executor.shutdown(wait=False, cancel_futures=True)
        self.known_executor.shutdown(wait=False, cancel_futures=True)

    async def _slot(self, spec: Any, param: str | None) -> tuple[asyncio.Semaphore, ThreadPoolExecutor]:
        """A compile slot for ``spec`` (taken; release the semaphore returned): a free shared slot,
        else the small lane when ``spec`` is small; waited for at most the compile timeout, then
        503 ``overloaded`` with ``Retry-After`` instead of a client time-out."""
        loop = asyncio.get_running_loop()
        small = spec_size(spec) <= SMALL_SPEC_BYTES
        wait = self.config.compile_timeout_s
        deadline = loop.time() + wait
        while True:
            # no await between the check and the take: nothing else runs in between
            if not self.compile_sem.locked():
                await self.compile_sem.acquire()
                return self.compile_sem, self.compile_executor
            if small and not self.small_sem.locked():
                await self.small_sem.acquire()
                return self.small_sem, self.small_executor
            if loop.time() >= deadline:
                raise api_error_for(PoolBusy(f"every compile slot stayed busy for {wait:g} s; retry shortly",
                                             retry_after_s=max(1.0, round(wait / 2))), param=param)
            await asyncio.sleep(0.01)

    # ------------------------------------------------------------------ request handling
    def _constraint(self, spec: Any, max_tokens: int | None) -> Any:
        # the Python API's defaults (GenerateOptions: bounded_numbers, field_budget): numbers no longer
        # than their type, strings without maxLength bounded by the request's token budget
        return constraint_for(spec, self.runtime, bounded_numbers=True, field_budget=max_tokens)

    def _compile_blocking(self, spec: Any, max_tokens: int | None = None) -> Any:
        if self.pool is not None:
            rt = self.runtime
            self.pool.probe(spec, rt.tokenizer, stop_token_ids=list(rt.eos_token_ids),
                            vocab_size=rt.model.config.text_config.vocab_size,
                            timeout_s=self.config.compile_timeout_s)
        return self._constraint(spec, max_tokens)

    async def compile(self, spec: Any, param: str | None, max_tokens: int | None = None) -> Any:
        """Compile a request's constraint: first in a worker process (a crash or runaway compile
        there is a typed 400), then in-process for generation (cached). A spec refused before (here,
        or by another replica sharing the verdicts) is refused at once (:mod:`.verdicts`).
        ``max_tokens``: the request's budget, from which strings without ``maxLength`` get theirs."""
        if spec is None:
            return None
        key = spec_key(spec)
        verdict = await self.verdicts.lookup(key)
        if verdict is not None:
            if self.metrics is not None:
                self.metrics.verdict_hits.inc()
            raise APIError(verdict.get("status", 400), verdict.get("message", "this constraint was refused before"),
                           param=param, code=verdict.get("code"))
        # one compile per spec at a time: identical requests arriving together (a client's burst)
        # wait for the first one's compile instead of taking every slot with the same work
        flight = (key, max_tokens)
        running = self._inflight.get(flight)
        if running is not None:
            return await asyncio.shield(running)
        task = asyncio.ensure_future(self._compile_once(key, spec, param, max_tokens))
        self._inflight[flight] = task
        try:
            return await asyncio.shield(task)
        finally:
            if task.done():
                self._inflight.pop(flight, None)
            else:   # this caller went away: the compile goes on for the others, then leaves the map
                task.add_done_callback(functools.partial(self._compiled, flight))

    def _compiled(self, key: tuple, task: asyncio.Future) -> None:
        self._inflight.pop(key, None)
        if not task.cancelled():
            task.exception()   # retrieved: an error nobody waits for any more is not logged as lost

    async def _compile_once(self, key: str, spec: Any, param: str | None, max_tokens: int | None) -> Any:
        t0 = time.perf_counter()
        hits = cache_info().hits
        try:
            out = await self._compile(spec, param, max_tokens)
        except APIError as err:
            if err.status == 400 and err.code in REMEMBERED_CODES:
                self.verdicts.remember(key, {"status": err.status, "message": err.message, "code": err.code})
            raise
        self.verdicts.accept(key)
        if self.metrics is not None:
            self.metrics.compile_seconds.observe(time.perf_counter() - t0)
            self.metrics.compile_cache.labels(outcome="hit" if cache_info().hits > hits else "miss").inc()
        return out

    async def _compile(self, spec: Any, param: str | None, max_tokens: int | None) -> Any:
        loop = asyncio.get_running_loop()
        limit = self.config.compile_timeout_s
        if self.pool is not None and await loop.run_in_executor(self.known_executor, self.pool.known_ok, spec):
            try:   # a big compile in progress never holds up a spec that compiled before
                return await loop.run_in_executor(self.known_executor, self._constraint, spec, max_tokens)
            except DgemmaStructError as err:
                raise api_error_for(err, param=param) from None
        sem, executor = await self._slot(spec, param)
        try:
            # the tokenizer set-up (once per process; seconds for a 262k vocabulary) is not timed
            await loop.run_in_executor(executor, prepare_tokenizer, self.runtime)
            # the probe enforces the compile timeout itself (it kills the worker); the margin here
            # covers starting a worker and the in-process compile after the probe
            margin = (self.pool.start_timeout_s + limit) if self.pool is not None else 0.0
            return await compiled(loop.run_in_executor(executor, functools.partial(self._compile_blocking, spec,
                                                                                   max_tokens)),
                                  limit, grace=margin, param=param)
        finally:
            sem.release()

    def check_thinking(self, param: str | None) -> None:
        """A 400 unless the tokenizer has Gemma 4's thought-channel control tokens."""
        tok = self.runtime.tokenizer
        for t in THOUGHT_OPEN, THOUGHT_CLOSE:
            try:
                tid = tok.convert_tokens_to_ids(t)
                ok = isinstance(tid, int) and tid >= 0 and tok.convert_ids_to_tokens(tid) == t
            except Exception:  # noqa: BLE001 - tokenizers without the methods
                ok = False
            if not ok:
                raise APIError(400, f"this model's tokenizer has no thought-channel token {t} (Gemma 4's "
                                    "<|channel>/<channel|>): thinking is not supported by this model",
                               param=param, code="thinking_unsupported")

    def grounding_of(self, req: Any, spec: Any, param: str | None) -> dict | None:
        """The request's grounding options (``grounding_options``), ``{}`` when only the schema marks
        fields (``x-grounded``), ``None`` when the request is not grounded."""
        given = req.grounding
        try:
            opts = grounding_options(given) if given not in (None, False) else None
            marked = isinstance(spec, dict) and has_grounding(spec)
        except DgemmaStructError as err:
            raise api_error_for(err, param="grounding") from None
        if opts is None and not marked:
            return None
        if not isinstance(spec, dict):
            raise APIError(400, "grounding needs a JSON Schema output constraint (response_format json_schema, "
                                "structured_outputs.json or guided_json)", param="grounding",
                           code="invalid_grounding")
        return opts or {}

    def _compile_grounded_blocking(self, spec: Any, prompt: Any, opts: dict) -> Any:
        rt = self.runtime
        return compile_grounded(spec, rt.tokenizer, source=grounded_sources(prompt, opts.get("source")),
                                ground=opts.get("ground"), granularity=opts.get("granularity", "words"),
                                stop_token_ids=rt.eos_token_ids, vocab_size=rt.model.config.text_config.vocab_size)

    async def compile_grounded(self, spec: Any, prompt: Any, opts: dict, param: str | None) -> Any:
        """A grounded constraint for one prompt, built on the compile executor (bounded slots and
        the compile timeout; the grammar is built in-process, not in a probe worker)."""
        loop = asyncio.get_running_loop()
        limit = self.config.compile_timeout_s
        sem, executor = await self._slot(spec, param)
        try:
            return await compiled(
                loop.run_in_executor(executor, functools.partial(self._compile_grounded_blocking, spec, prompt, opts)),
                limit, what="the grounded constraint", param=param, code="invalid_grounding",
                param_of=lambda err: "grounding" if isinstance(err, GroundingError) else param)
        finally:
            sem.release()

    def check(self, req: Any) -> int:
        if req.model not in (None, "", self.model_id):
            raise APIError(404, f"the model {req.model!r} does not exist; this server serves {self.model_id!r}",
                           param="model", code="model_not_found")
        if (req.n or 1) > self.config.max_n:
            raise APIError(400, f"n={req.n} exceeds this server's limit of {self.config.max_n}", param="n",
                           code="n_too_large")
        if getattr(req, "echo", None):
            raise APIError(400, "echo is not supported", param="echo", code="unsupported_parameter")
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
        except Exception as err:  # noqa: BLE001 - the chat template or tokenizer refused this prompt
            raise APIError(400, f"the prompt cannot be encoded: {type(err).__name__}: {err}", param="messages",
                           code="invalid_prompt") from None

    def count_tokens(self, text: str) -> int:
        if not text:
            return 0
        try:
            return len(self.runtime.tokenizer(text, add_special_tokens=False)["input_ids"])
        except Exception:  # noqa: BLE001 - a count is not worth failing a request for
            return 0
