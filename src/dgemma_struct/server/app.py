"""The OpenAI-compatible FastAPI app: ``/v1/chat/completions``, ``/v1/completions``,
``/v1/models``, ``/health``.

Example::

    from dgemma_struct.server import ServerConfig, create_app
    app = create_app(config=ServerConfig(api_key="secret"))     # the embedded model
    # uvicorn.run(app, host="127.0.0.1", port=8000)
"""
from __future__ import annotations

import asyncio
import functools
import hmac
import json
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dgemma_struct.api import constraint_for
from dgemma_struct.errors import (ConstraintCompileTimeout, DgemmaStructError, GenerationTimeout, LengthError,
                                  ModelLoadError)
from dgemma_struct.constraints import Regex
from dgemma_struct.constraints.thinking import THOUGHT_CLOSE, THOUGHT_OPEN
from dgemma_struct.errors import GroundingError
from dgemma_struct.grounding import (compile_grounded, grounded_sources, grounding_options, has_grounding,
                                     prompt_with_sources)
from dgemma_struct.runtime import DiffusionRuntime

from .batcher import Batcher, QueueFull, ShuttingDown
from .compile_pool import CompilePool
from .errors import APIError, api_error_for, error_body, safe_json_bytes
from .tool_calls import (chat_prompt, check_context, compile_for, completion_body, prepare_tokenizer, row_tokens,
                         sse_events, tool_request_of)
from .protocol import (ChatCompletionRequest, CompletionRequest, apply_stop, check_text, prompt_of_messages,
                       spec_of, stops_of, thinking_of)

_FREE_TEXT = r"[\s\S]*"   # the constraint a thinking request without an output constraint answers under


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
    max_n: int = 8                        # the largest ``n`` (choices per prompt)
    queue_timeout_s: float | None = None  # longest wait in the queue (default: request_timeout_s)
    isolate_compiles: bool = True         # probe-compile user constraints in worker processes first
    compile_memory_mb: int = 4096         # address space a compile worker may add (0 = no cap)
    stream_live: bool = False             # stream canvases as they commit (may end in stream_diverged)
    max_error_chars: int = 1000           # error messages are cut to this length
    # connections (uvicorn)
    header_timeout_s: float = 10.0        # a request's headers and body must arrive within this
    timeout_keep_alive_s: float = 5.0     # idle keep-alive connections are closed after this
    max_connections: int = 1000           # beyond this, the oldest idle connections are closed
    limit_concurrency: int | None = None  # uvicorn: 503 beyond this many connections + tasks
    h11_max_incomplete_event_size: int = 64 * 1024   # largest request line + headers

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
                               max_queue=config.max_queue, max_repairs=config.max_repairs,
                               queue_timeout_s=config.queue_timeout_s)
        self.compile_sem = asyncio.Semaphore(config.max_concurrent_compiles)
        # compiles never share an executor with anything else (prompts, generation)
        self.compile_executor = ThreadPoolExecutor(max_workers=config.max_concurrent_compiles,
                                                   thread_name_prefix="dgemma-struct-compile")
        # specs whose probe succeeded before: compiled (usually a cache hit) without waiting for a slot
        self.known_executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="dgemma-struct-compile-known")
        self.pool = (CompilePool(config.max_concurrent_compiles, memory_mb=config.compile_memory_mb or None)
                     if config.isolate_compiles else None)

    def start(self) -> None:
        self.batcher.start()
        if self.pool is not None:   # start one compile worker in the background
            threading.Thread(target=self._warm, daemon=True, name="dgemma-struct-compile-warm").start()

    def _warm(self) -> None:
        try:
            self.pool.warm()
        except Exception:  # noqa: BLE001 - the first compile starts one instead
            pass

    def stop(self) -> None:
        self.batcher.stop()
        if self.pool is not None:
            self.pool.close()
        self.compile_executor.shutdown(wait=False, cancel_futures=True)
        self.known_executor.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ request handling
    def _compile_blocking(self, spec: Any) -> Any:
        if self.pool is not None:
            rt = self.runtime
            self.pool.probe(spec, rt.tokenizer, stop_token_ids=list(rt.eos_token_ids),
                            vocab_size=rt.model.config.text_config.vocab_size,
                            timeout_s=self.config.compile_timeout_s)
        return constraint_for(spec, self.runtime)

    async def compile(self, spec: Any, param: str | None) -> Any:
        """Compile a request's constraint: first in a worker process (a crash or runaway compile
        there is a typed 400), then in-process for generation (cached)."""
        if spec is None:
            return None
        loop = asyncio.get_running_loop()
        limit = self.config.compile_timeout_s
        if self.pool is not None and await loop.run_in_executor(self.known_executor, self.pool.known_ok, spec):
            try:   # a big compile in progress never holds up a spec that compiled before
                return await loop.run_in_executor(self.known_executor, constraint_for, spec, self.runtime)
            except DgemmaStructError as err:
                raise api_error_for(err, param=param) from None
        async with self.compile_sem:
            try:
                # the probe enforces the compile timeout itself (it kills the worker); the margin
                # here covers starting a worker and the in-process compile after the probe
                margin = (self.pool.start_timeout_s + limit) if self.pool is not None else 0.0
                return await asyncio.wait_for(loop.run_in_executor(self.compile_executor,
                                                                   functools.partial(self._compile_blocking, spec)),
                                              limit + margin)
            except asyncio.TimeoutError:
                raise APIError(400, f"compiling the constraint took longer than {limit:g} s", param=param,
                               code="constraint_too_complex") from None
            except DgemmaStructError as err:
                raise api_error_for(err, param=param) from None
            except RecursionError:
                raise APIError(400, "the constraint is nested too deeply", param=param,
                               code="constraint_too_complex") from None
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as err:  # noqa: BLE001 - a malformed spec the compiler did not anticipate
                raise APIError(400, f"cannot compile the constraint: {type(err).__name__}: {err}", param=param,
                               code="invalid_constraint") from None

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
        async with self.compile_sem:
            try:
                return await asyncio.wait_for(loop.run_in_executor(
                    self.compile_executor, functools.partial(self._compile_grounded_blocking, spec, prompt, opts)),
                    limit)
            except asyncio.TimeoutError:
                raise APIError(400, f"compiling the grounded constraint took longer than {limit:g} s",
                               param=param, code="constraint_too_complex") from None
            except DgemmaStructError as err:
                raise api_error_for(err, param="grounding" if isinstance(err, GroundingError) else param) from None
            except RecursionError:
                raise APIError(400, "the constraint is nested too deeply", param=param,
                               code="constraint_too_complex") from None
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as err:  # noqa: BLE001 - a malformed spec the compiler did not anticipate
                raise APIError(400, f"cannot compile the grounded constraint: {type(err).__name__}: {err}",
                               param=param, code="invalid_grounding") from None

    def check(self, req: Any) -> int:
        if req.model not in (None, "", self.model_id):
            raise APIError(404, f"the model {req.model!r} does not exist; this server serves {self.model_id!r}",
                           param="model", code="model_not_found")
        if (req.n or 1) > self.config.max_n:
            raise APIError(400, f"n={req.n} exceeds this server's limit of {self.config.max_n}", param="n",
                           code="n_too_large")
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

    def _choice(self, r: Any, stops: list[str]) -> tuple[str, str, int, Any]:
        """(text, finish_reason, completion tokens, stats dict) of one generated row."""
        if isinstance(r, LengthError):
            # as OpenAI: a constrained answer that cannot complete within max_tokens is a 200 with
            # finish_reason "length" and the text so far (never a value claimed to be complete)
            text = r.partial_text or ""
            stats = r.stats.to_dict() if hasattr(r.stats, "to_dict") else None
            return text, "length", self.count_tokens(text), stats
        text, finish, n = r.text, r.stats.finish_reason or "stop", len(r.token_ids)
        if stops:
            cut = apply_stop(text, stops)
            if cut is not None:
                text, finish, n = cut, "stop", self.count_tokens(cut)
        if finish not in ("stop", "length"):
            finish = "stop"
        return text, finish, n, r.stats.to_dict()

    async def _gather(self, coros: list[Any], request: Request | None, param: str | None) -> list[Any]:
        """Runs the rows; a client that disconnects cancels them (their rows leave the batch)."""
        work = asyncio.ensure_future(asyncio.gather(*coros, return_exceptions=True))
        work.add_done_callback(lambda f: f.cancelled() or f.exception())   # retrieved, even when abandoned
        watcher = asyncio.ensure_future(_wait_disconnect(request)) if request is not None else None
        try:
            if watcher is not None:
                await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if not work.done():
                    raise _ClientGone
            results = await work
        except BaseException:
            work.cancel()
            raise
        finally:
            if watcher is not None:
                watcher.cancel()
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, LengthError):
                if isinstance(r, asyncio.CancelledError):
                    raise r
                raise _http_error(r, param)
        return results

    async def run(self, req: Any, prompts: list[Any], *, chat: bool, request: Request | None = None,
                  tool_req: Any = None) -> Any:
        max_tokens = self.check(req)
        n = req.n or 1
        for p in prompts:
            check_text(p, "messages" if chat else "prompt")
        spec, param = spec_of(req)
        stops = stops_of(req)                    # validated either way ...
        if spec is not None:
            stops = []                           # ... but a constraint decides where its output ends
        thinking, think_param = thinking_of(req)
        use_tools = tool_req is not None and (tool_req.calls_possible or spec is None)
        if use_tools and thinking is not False:
            raise APIError(400, "thinking together with tool calls is not supported yet", param=think_param,
                           code="unsupported_parameter")
        if thinking is not False:
            self.check_thinking(think_param)
            if spec is None:                     # free text after the thought (stop sequences still apply)
                spec = Regex(_FREE_TEXT)
        grounded = None if use_tools else self.grounding_of(req, spec, param)
        if use_tools:
            stops = []
            loop = asyncio.get_running_loop()
            # the tokenizer set-up (once per process, seconds for 262k pieces) is not timed as a compile
            await loop.run_in_executor(self.compile_executor, prepare_tokenizer, self.runtime)
            try:
                constraint = await asyncio.wait_for(loop.run_in_executor(
                    self.compile_executor, compile_for, tool_req, self.runtime), self.config.compile_timeout_s)
            except asyncio.TimeoutError:
                raise APIError(400, "compiling the tool declarations took too long", param="tools",
                               code="constraint_too_complex") from None
            specs = [constraint] * len(prompts)
        elif grounded is not None:
            # one grounded constraint per prompt: the source defaults to that prompt's text
            specs = [await self.compile_grounded(spec, p, grounded, param) for p in prompts]
            prompts = [prompt_with_sources(p, c.sources) for p, c in zip(prompts, specs)]
        else:
            constraint = await self.compile(spec, param)
            specs = [constraint] * len(prompts)
        n_prompt = await asyncio.to_thread(lambda: [self.prompt_tokens(p) for p in prompts])
        if tool_req is not None:
            try:
                check_context(n_prompt[0], max_tokens, self.runtime.max_context, tool_req)
            except DgemmaStructError as err:
                raise api_error_for(err) from None
        seed = None if req.seed is None else int(req.seed) % (2 ** 63)
        sampling = {"temperature": req.temperature, "top_p": req.top_p}
        timeout = self.config.request_timeout_s
        think = {"thinking": thinking, "max_thinking_tokens": req.max_thinking_tokens} if thinking is not False else {}
        if req.stream and self.config.stream_live and not use_tools and not think and grounded is None:
            constraint = specs[0]
            if len(prompts) != 1 or n != 1:
                raise APIError(400, "live streaming takes one prompt and n=1", param="n",
                               code="unsupported_parameter")
            return await self.stream_live(req, prompts[0], constraint, max_tokens, seed, n_prompt[0], stops,
                                          sampling, chat=chat)
        coros = [self.batcher.submit(p, c, max_new_tokens=max_tokens,
                                     seed=None if seed is None else (seed + j) % (2 ** 63), timeout_s=timeout,
                                     **sampling, **think)
                 for p, c in zip(prompts, specs) for j in range(n)]
        try:
            results = await self._gather(coros, request, param)
        except _ClientGone:
            return Response(status_code=499)
        if use_tools:
            rid = "chatcmpl-" + uuid.uuid4().hex[:24]
            prompt_total = sum(n_prompt) * n
            completion = sum(row_tokens(r, self.count_tokens) for r in results)
            created = int(time.time())
            if req.stream:
                include_usage = bool((req.stream_options or {}).get("include_usage"))
                usage = ({"prompt_tokens": prompt_total, "completion_tokens": completion,
                          "total_tokens": prompt_total + completion} if include_usage else None)
                return StreamingResponse(sse_events(results, tool_req, rid=rid, model=self.model_id, created=created,
                                                    usage=usage), media_type="text/event-stream")
            return _json(completion_body(results, tool_req, rid=rid, model=self.model_id, created=created,
                                         prompt_tokens=prompt_total, completion_tokens=completion))
        rows = [self._choice(r, stops) for r in results]
        # extensions on each choice: the thought (vLLM's reasoning_content) and the grounded spans
        row_specs = [c for c in specs for _ in range(n)]
        extras: list[dict[str, Any]] = []
        for r, c, row in zip(results, row_specs, rows):
            extra: dict[str, Any] = {}
            if think:
                extra["reasoning_content"] = getattr(r, "reasoning", None)
            if grounded is not None:
                extra["grounding"] = _spans_of(c, row[0]) if row[1] != "length" else None
            extras.append(extra)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        prompt_total = sum(n_prompt) * n
        completion = sum(r[2] for r in rows)
        if req.stream:
            return self.stream_validated(req, rid, rows, prompt_total, chat=chat, extras=extras)
        choices = []
        for i, ((text, finish, _, _), extra) in enumerate(zip(rows, extras)):
            reasoning = {"reasoning_content": extra["reasoning_content"]} if "reasoning_content" in extra else {}
            more = {k: v for k, v in extra.items() if k != "reasoning_content"}
            if chat:
                choices.append({"index": i, "message": {"role": "assistant", "content": text, "refusal": None,
                                                        **reasoning},
                                "logprobs": None, "finish_reason": finish, **more})
            else:
                choices.append({"index": i, "text": text, "logprobs": None, "finish_reason": finish, **reasoning,
                                **more})
        stats = [r[3] for r in rows]
        body = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": self.model_id, "choices": choices, "system_fingerprint": None,
                "usage": {"prompt_tokens": prompt_total, "completion_tokens": completion,
                          "total_tokens": prompt_total + completion},
                "dgemma_stats": stats if len(stats) > 1 else stats[0]}
        return _json(body)

    def _chunker(self, rid: str, chat: bool):
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(text: str | None, finish: str | None, *, index: int = 0, role: bool = False,
                  extra: dict | None = None, reasoning: str | None = None, choice_extra: dict | None = None) -> str:
            if chat:
                delta: dict[str, Any] = {}
                if role:
                    delta["role"] = "assistant"
                if reasoning is not None:
                    delta["reasoning_content"] = reasoning
                if text is not None:
                    delta["content"] = text
                choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}
                if reasoning is not None:
                    choice["reasoning_content"] = reasoning
            if choice_extra:
                choice.update(choice_extra)
            body = {"id": rid, "object": obj, "created": created, "model": self.model_id, "choices": [choice]}
            if extra:
                body.update(extra)
            return "data: " + _dumps(body) + "\n\n"

        def usage(prompt: int, completion: int) -> str:
            return "data: " + _dumps({"id": rid, "object": obj, "created": created, "model": self.model_id,
                                      "choices": [], "usage": {"prompt_tokens": prompt,
                                                               "completion_tokens": completion,
                                                               "total_tokens": prompt + completion}}) + "\n\n"
        return chunk, usage

    def stream_validated(self, req: Any, rid: str, rows: list[tuple], n_prompt: int, *,
                         chat: bool, extras: list[dict] | None = None) -> StreamingResponse:
        """The default stream: the rows ran (and were validated and repaired) exactly as without
        streaming, then their text goes out as deltas. A stream therefore never diverges from
        what was sent, and every failure is a plain HTTP error before the stream starts."""
        chunk, usage = self._chunker(rid, chat)
        include_usage = bool((req.stream_options or {}).get("include_usage"))

        async def sse() -> AsyncIterator[str]:
            for i, (text, finish, _, _) in enumerate(rows):
                extra = dict(extras[i]) if extras else {}
                thought = extra.pop("reasoning_content", None) or ""
                if chat:
                    yield chunk("", None, index=i, role=True)
                for k in range(0, len(thought), _DELTA_CHARS):   # the thought first, as vLLM streams it
                    yield chunk(None if chat else "", None, index=i, reasoning=thought[k:k + _DELTA_CHARS])
                for k in range(0, len(text), _DELTA_CHARS):
                    yield chunk(text[k:k + _DELTA_CHARS], None, index=i)
                yield chunk(None if chat else "", finish, index=i, choice_extra=extra or None)
            if include_usage:
                yield usage(n_prompt, sum(r[2] for r in rows))
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def stream_live(self, req: Any, prompt: Any, constraint: Any, max_tokens: int, seed: int | None,
                          n_prompt: int, stops: list[str], sampling: dict, *, chat: bool) -> StreamingResponse:
        """``stream_live``: committed canvases go out as they are produced. A repair may rewrite
        text already sent; the stream then ends with a 422 ``stream_diverged`` error event."""
        events = self.batcher.stream(prompt, constraint, max_new_tokens=max_tokens, seed=seed,
                                     timeout_s=self.config.request_timeout_s, **sampling)
        try:
            first = await events.__anext__()   # errors before the first canvas are plain HTTP errors
        except StopAsyncIteration:
            first = None
        except asyncio.CancelledError:
            await events.aclose()
            raise
        except LengthError as err:
            await events.aclose()
            first = err
        except Exception as err:  # noqa: BLE001
            await events.aclose()
            raise _http_error(err, None) from None
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        chunk, usage = self._chunker(rid, chat)
        include_usage = bool((req.stream_options or {}).get("include_usage"))
        hold = max((len(s) for s in stops), default=1) - 1   # a stop may straddle two canvases

        async def sse() -> AsyncIterator[str]:
            sent = ""
            canvases = 0
            try:
                if chat:
                    yield chunk("", None, role=True)
                ev = first
                while ev is not None:
                    if isinstance(ev, LengthError):
                        text = ev.partial_text or ""
                        if text.startswith(sent) and len(text) > len(sent):
                            yield chunk(text[len(sent):], None)
                        yield chunk(None if chat else "", "length")
                        if include_usage:
                            yield usage(n_prompt, self.count_tokens(text))
                        yield "data: [DONE]\n\n"
                        return
                    cut = apply_stop(ev.text, stops) if stops else None
                    if not ev.done and cut is None:
                        canvases += 1
                        safe = ev.text[:len(ev.text) - hold] if stops and hold else ev.text
                        if safe.startswith(sent) and len(safe) > len(sent):
                            yield chunk(safe[len(sent):], None)
                            sent = safe
                    else:
                        text = cut if cut is not None else ev.text
                        if not text.startswith(sent):
                            raise APIError(422, "a repair rewrote text already streamed; retry without "
                                                "stream_live (the default stream never diverges)",
                                           type="generation_error", code="stream_diverged")
                        if len(text) > len(sent):
                            yield chunk(text[len(sent):], None)
                        finish = "stop" if cut is not None else (getattr(ev, "finish_reason", None) or "stop")
                        completion = self.count_tokens(text) if cut is not None else len(ev.token_ids)
                        yield chunk(None if chat else "", finish if finish in ("stop", "length") else "stop",
                                    extra={"dgemma_stats": {"canvases": canvases}})
                        if include_usage:
                            yield usage(n_prompt, completion)
                        yield "data: [DONE]\n\n"
                        return
                    try:
                        ev = await events.__anext__()
                    except StopAsyncIteration:
                        ev = None
                    except LengthError as err:
                        ev = err
                raise APIError(500, "the stream ended without a validated output", type="server_error",
                               code="stream_incomplete")
            except (asyncio.CancelledError, GeneratorExit):
                raise
            except BaseException as err:  # noqa: BLE001 - ends the stream with an error event, never "stop"
                e = _http_error(err, None)
                body = e.body()
                body["error"]["status"] = e.status
                yield "data: " + _dumps(body) + "\n\n"
            finally:
                await events.aclose()

        return StreamingResponse(sse(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


_DELTA_CHARS = 16


def _spans_of(constraint: Any, text: str) -> dict | None:
    """The grounding extension of one choice: ``{"spans": [...]}`` of its grounded values."""
    try:
        spans, _ = constraint.locate(json.loads(text))
    except ValueError:
        return None
    return {"spans": [s.to_dict() for s in spans]}


class _ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def _wait_disconnect(request: Request) -> None:
    """Returns when the client of ``request`` (whose body was read) disconnects."""
    while True:
        msg = await request.receive()
        if msg.get("type") == "http.disconnect":
            return


def _dumps(body: Any) -> str:
    return json.dumps(body)   # ASCII escapes: a lone surrogate in a message cannot break the encoding


def _json(body: Any, status: int = 200, headers: dict | None = None) -> Response:
    return Response(safe_json_bytes(body), status_code=status, media_type="application/json", headers=headers)


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
        data = safe_json_bytes(body)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(data)).encode())] + (headers or [])})
        await send({"type": "http.response.body", "body": data})

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
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


def create_app(runtime: DiffusionRuntime | None = None, config: ServerConfig | None = None) -> FastAPI:
    """The server app. ``runtime`` = any :class:`DiffusionRuntime` (default: ``config.model`` or the
    embedded model, loaded at start-up). The generation worker starts with the app's lifespan."""
    config = config or ServerConfig()
    holder: dict[str, ServerState] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        rt = runtime if runtime is not None else await asyncio.to_thread(load_runtime, config.model)
        state = ServerState(rt, config)
        state.start()
        holder["state"] = state
        app.state.dgemma = state
        try:
            yield
        finally:
            state.stop()

    app = FastAPI(title="dgemma-struct", version="0.1.0", lifespan=lifespan,
                  description="OpenAI-compatible structured generation with DiffusionGemma models")

    def state() -> ServerState:
        if "state" not in holder:
            raise APIError(503, "the model is still loading", type="server_error", code="unavailable")
        return holder["state"]

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return _json(exc.body(), exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        errs = exc.errors()
        first = errs[0] if errs else {}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        where = ".".join(loc)
        msg = first.get("msg", "invalid request body")
        more = f" (and {len(errs) - 1} more problem(s))" if len(errs) > 1 else ""
        return _json(error_body(400, f"invalid request: {where + ': ' if where else ''}{msg}{more}",
                                param=where or None, code="invalid_request_body"), 400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        typ = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return _json(error_body(exc.status_code, str(exc.detail), type=typ), exc.status_code,
                     headers=getattr(exc, "headers", None))

    @app.exception_handler(DgemmaStructError)
    async def _typed(request: Request, exc: DgemmaStructError):
        e = _http_error(exc, None)
        return _json(e.body(), e.status)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        return _json(error_body(500, f"internal error: {type(exc).__name__}", type="server_error",
                                code="internal_error"), 500)

    @app.post("/v1/chat/completions", summary="Chat completion with an optional output constraint")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        _, param = spec_of(body)
        tool_req = tool_request_of(body, output_constraint=param)
        toolish = any(m.role in ("tool", "function") or (m.model_extra or {}).get("tool_calls")
                      or (m.model_extra or {}).get("function_call") for m in body.messages)
        prompt = chat_prompt(body.messages, tool_req) if (tool_req or toolish) else prompt_of_messages(body.messages)
        return await state().run(body, [prompt], chat=True, request=request, tool_req=tool_req)

    @app.post("/v1/completions", summary="Text completion (the prompt is sent as one user message)")
    async def completions(body: CompletionRequest, request: Request):
        prompts = [body.prompt] if isinstance(body.prompt, str) else list(body.prompt)
        if not prompts:
            raise APIError(400, "prompt must not be empty", param="prompt", code="invalid_request")
        if len(prompts) > config.max_prompts_per_request:
            raise APIError(400, f"at most {config.max_prompts_per_request} prompts per request", param="prompt",
                           code="too_many_prompts")
        return await state().run(body, prompts, chat=False, request=request)

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
                             "queue_depth": s.batcher.queue_depth, **s.batcher.counters,
                             "compile_workers": dict(s.pool.counters) if s.pool is not None else None},
                            status_code=200 if ok else 503)

    app.add_middleware(_Guard, config=config)
    return app
