"""One completion request, end to end: check it, compile its constraint, queue its rows on the
batcher, and answer (a JSON body of :mod:`.responses`, or a stream of :mod:`.streaming`)."""
from __future__ import annotations

import asyncio
import difflib
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from dgemma_struct.choice_scores import score_choices
from dgemma_struct.constraints import Regex
from dgemma_struct.errors import DgemmaStructError, LengthError
from dgemma_struct.grounding import prompt_with_sources
from dgemma_struct.options import offset_seed

from .http_errors import APIError, api_error_for, compiled
from .logprobs import chat_logprobs, completion_logprobs, cut_to
from .protocol import (apply_stop, check_text, choice_estimator_of, estimated_prompt_tokens, generation_options,
                       logprobs_of, spec_of,
                       stops_of, thinking_of)
from .responses import (ChatChoice, ChatCompletion, AssistantMessage, Completion, CompletionChoice, Usage,
                        json_response)
from .state import ServerState
from .template_render import rendered
from .sse import stream_live, stream_validated
from .tool_calls import check_context, compile_for, completion_body, prepare_tokenizer, row_tokens, sse_events

_log = logging.getLogger("dgemma_struct.server")
_FREE_TEXT = r"[\s\S]*"   # the constraint a thinking request without an output constraint answers under


class _ClientGone(Exception):
    """The client disconnected before its answer was ready."""


#: body fields that name an output constraint or a generation limit: an unknown field close to one of
#: these (or under ``response_format`` / ``structured_outputs``) is a 400, never silently ignored
_CONSTRAINT_FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
                      "guided_grammar", "max_tokens", "max_completion_tokens", "max_thinking_tokens", "stop")
_CONSTRAINT_HINTS = ("guided", "structured", "schema", "regex", "grammar", "response_format", "max_")
#: unknown to the request models but read elsewhere (tool calling) or documented as accepted and ignored
_QUIET = frozenset({"tool_choice", "parallel_tool_calls", "functions", "function_call", "max_tool_calls",
                    "allowed_tools", "presence_penalty",
                    "frequency_penalty", "logit_bias", "guided_decoding_backend"})
_NESTED = {"response_format": ("type", "json_schema", "schema"),
           "response_format.json_schema": ("name", "description", "schema", "strict"),
           "structured_outputs": ("json", "regex", "grammar", "choice", "json_object", "disable_any_whitespace",
                                  "disable_additional_properties", "disable_fallback")}
_warned: set[str] = set()
_MAX_WARNED = 1024  # names remembered (a client cannot grow the set without bound)


def _unknown(name: str, param: str, known: Any) -> APIError:
    hint = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return APIError(400, f"unknown parameter {param!r}" + (f"; did you mean {hint[0]!r}?" if hint else "")
                    + " (a constraint or a limit is never ignored)", param=param, code="unknown_parameter")


def check_fields(req: Any) -> None:
    """An unknown body field that names a constraint or a generation limit (``guided_regx``,
    ``max_token``, an unknown ``response_format`` / ``structured_outputs`` key) is a 400
    ``unknown_parameter`` with a "did you mean" hint; any other unknown field is logged once per name."""
    known = set(type(req).model_fields) | _QUIET
    for name in req.model_extra or {}:
        if name in _QUIET:
            continue
        low = name.lower()
        if any(h in low for h in _CONSTRAINT_HINTS) or difflib.get_close_matches(low, _CONSTRAINT_FIELDS, cutoff=0.8):
            raise _unknown(name, name, known)
        if name not in _warned and len(_warned) < _MAX_WARNED:
            _warned.add(name)
            _log.warning("ignoring unknown request field %r (logged once per name)", name[:100])
    rf, so = getattr(req, "response_format", None), getattr(req, "structured_outputs", None)
    js = getattr(rf, "json_schema", None)
    for where, obj in (("response_format", rf), ("response_format.json_schema", js), ("structured_outputs", so)):
        for name in (getattr(obj, "model_extra", None) or {}) if obj is not None else {}:
            if name not in _NESTED[where] or (where == "response_format" and rf.type != "json_object"):
                raise _unknown(name, f"{where}.{name}", _NESTED[where])


async def _wait_disconnect(request: Request) -> None:
    """Returns when the client of ``request`` (whose body was read) disconnects."""
    while True:
        msg = await request.receive()
        if msg.get("type") == "http.disconnect":
            return


async def _gather(coros: list[Any], request: Request | None, param: str | None) -> list[Any]:
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
            raise api_error_for(r, param=param)
    return results


def row_of(state: ServerState, r: Any, stops: list[str]) -> tuple[str, str, int, Any]:
    """(text, finish_reason, completion tokens, stats dict) of one generated row (a result, or the
    :class:`LengthError` of a row that ran out of budget)."""
    if isinstance(r, LengthError):
        # as OpenAI: a constrained answer that cannot complete within max_tokens is a 200 with
        # finish_reason "length" and the text so far (never a value claimed to be complete)
        text = r.partial_text or ""
        stats = r.stats.to_dict() if hasattr(r.stats, "to_dict") else None
        return text, "length", state.count_tokens(text), stats
    text, finish, n = r.text, r.stats.finish_reason or "stop", len(r.token_ids)
    if stops:
        cut = apply_stop(text, stops)
        if cut is not None:
            text, finish, n = cut, "stop", state.count_tokens(cut)
    if finish not in ("stop", "length"):
        finish = "stop"
    return text, finish, n, r.stats.to_dict()


def spans_of(constraint: Any, text: str) -> dict | None:
    """The grounding extension of one choice: ``{"spans": [...], "sources": [...]}``: its grounded values and
    the documents their ``doc`` / ``start`` / ``end`` index into (by default the prompt's document part,
    the instruction line left out)."""
    try:
        spans, _ = constraint.locate(json.loads(text))
    except ValueError:
        return None
    return {"spans": [s.to_dict() for s in spans], "sources": list(constraint.sources)}


@dataclass
class _Plan:
    """A request after its checks: what :func:`run` needs to compile, run and answer it."""
    chat: bool
    top: int | None          # logprobs: alternatives per token (None: off)
    max_tokens: int
    n: int
    spec: Any                # the output constraint's spec (None: free text)
    param: str | None        # the body field that named it (for errors)
    stops: list[str]
    thinking: Any
    estimator: str | None    # choice probabilities: the estimator asked for
    use_tools: bool
    confidence: bool = False  # ``field_confidence``: per-field confidence of a JSON answer


def _plan(state: ServerState, req: Any, prompts: list[Any], *, chat: bool, tool_req: Any) -> _Plan:
    """Every check that needs no compile and no template, so a bad request is a 400 before any work."""
    check_fields(req)
    top = logprobs_of(req, chat=chat)
    max_tokens = state.check(req)
    where = "messages" if chat else "prompt"
    for p in prompts:
        check_text(p, where)
    ctx = state.runtime.max_context
    for p in prompts:  # a lower bound on the prompt's tokens, before any template or tokenizer runs
        est = estimated_prompt_tokens(p)
        if est + max_tokens > ctx:
            raise APIError(400, f"this prompt needs at least {est} tokens (its messages alone), and with "
                                f"max_tokens={max_tokens} it cannot fit the model's context of {ctx} tokens",
                           param=where, code="context_length_exceeded")
    spec, param = spec_of(req)
    stops = stops_of(req)                    # validated either way ...
    if spec is not None:
        stops = []                           # ... but a constraint decides where its output ends
    thinking, think_param = thinking_of(req)
    estimator = choice_estimator_of(req, spec, streaming_or_thinking=bool(req.stream) or thinking is not False)
    use_tools = tool_req is not None and (tool_req.calls_possible or spec is None)
    if use_tools and thinking is not False:
        raise APIError(400, "thinking together with tool calls is not supported yet", param=think_param,
                       code="unsupported_parameter")
    if estimator is not None and use_tools:
        raise APIError(400, "choice_probabilities together with tool calls is not supported",
                       param="choice_probabilities", code="unsupported_parameter")
    if top is not None and (use_tools or thinking is not False):
        raise APIError(400, "logprobs together with " + ("tool calls" if use_tools else "thinking") +
                       " are not supported yet", param="logprobs", code="unsupported_parameter")
    if thinking is not False:
        state.check_thinking(think_param)
        if spec is None:                     # free text after the thought (stop sequences still apply)
            spec = Regex(_FREE_TEXT)
    confidence = bool(getattr(req, "field_confidence", None))
    if confidence and (use_tools or spec is None or thinking is not False):
        raise APIError(400, "field_confidence needs an output constraint (response_format, guided_*), without tools or "
                            "thinking", param="field_confidence", code="unsupported_parameter")
    return _Plan(chat=chat, top=top, max_tokens=max_tokens, n=req.n or 1, spec=spec, param=param,
                 stops=[] if use_tools else stops, thinking=thinking, estimator=estimator,
                 use_tools=use_tools, confidence=confidence)


async def _constraints(state: ServerState, req: Any, plan: _Plan, prompts: list[Any],
                       tool_req: Any) -> tuple[list[Any], list[Any], Any]:
    """``(constraint per prompt, prompts, grounding)``: the tool-call constraint, one grounded
    constraint per prompt (its source defaults to that prompt, which then carries the sources), or
    one compiled constraint for all."""
    grounded = None if plan.use_tools else state.grounding_of(req, plan.spec, plan.param)
    if plan.use_tools:
        loop = asyncio.get_running_loop()
        # the tokenizer set-up (once per process, seconds for 262k pieces) is not timed as a compile
        await loop.run_in_executor(state.compile_executor, prepare_tokenizer, state.runtime)
        constraint = await compiled(loop.run_in_executor(state.compile_executor, compile_for, tool_req, state.runtime),
                                    state.config.compile_timeout_s, what="the tool declarations", param="tools",
                                    param_of=lambda err: None)
        return [constraint] * len(prompts), prompts, None
    if grounded is not None:
        specs = [await state.compile_grounded(plan.spec, p, grounded, plan.param) for p in prompts]
        return specs, [prompt_with_sources(p, c.sources) for p, c in zip(prompts, specs)], grounded
    return [await state.compile(plan.spec, plan.param, plan.max_tokens)] * len(prompts), prompts, None


@dataclass
class Ran:
    """A request's finished rows, ready to answer (:func:`run`'s JSON / stream, or the Responses API's)."""
    plan: _Plan
    prompts: list[Any]
    results: list[Any]       # per row (n per prompt): a result, or the LengthError of a row out of budget
    row_specs: list[Any]     # per row: its constraint
    grounded: bool
    thinks: bool
    prompt_total: int        # prompt tokens over all rows


async def run(state: ServerState, req: Any, prompts: list[Any], *, chat: bool, request: Request | None = None,
              tool_req: Any = None) -> Any:
    """Answer a chat (``chat=True``) or text completion request for ``prompts``: a JSON response,
    an SSE stream, or 499 when the client went away. Bad requests raise :class:`APIError`."""
    ran = await execute(state, req, prompts, chat=chat, request=request, tool_req=tool_req)
    if not isinstance(ran, Ran):
        return ran
    if ran.plan.use_tools:                                                            # 6. answer
        return _tool_answer(state, req, ran.results, tool_req, prompt_total=ran.prompt_total)
    return await _answer(state, req, ran.plan, ran.prompts, ran.results, ran.row_specs, ran.grounded, ran.thinks,
                         ran.prompt_total)


async def execute(state: ServerState, req: Any, prompts: list[Any], *, chat: bool, request: Request | None = None,
                  tool_req: Any = None) -> Ran | Response:
    """Check, compile and run a request's rows on the batcher: its :class:`Ran`, or the response
    itself (a live stream; 499 when the client went away). Bad requests raise :class:`APIError`."""
    plan = _plan(state, req, prompts, chat=chat, tool_req=tool_req)                  # 1. check
    specs, prompts, grounded = await _constraints(state, req, plan, prompts, tool_req)  # 2. compile
    n_prompt = await rendered(lambda: [state.prompt_tokens(p) for p in prompts])     # 3. template, count
    if tool_req is not None:
        try:
            check_context(n_prompt[0], plan.max_tokens, state.runtime.max_context, tool_req)
        except DgemmaStructError as err:
            raise api_error_for(err) from None
    opts = generation_options(req, max_tokens=plan.max_tokens, thinking=plan.thinking, logprobs=plan.top,  # 4.
                              confidence=plan.confidence)
    if (req.stream and state.config.stream_live and not plan.use_tools and not opts.thinks and grounded is None
            and opts.logprobs is None):
        if len(prompts) != 1 or plan.n != 1:
            raise APIError(400, "live streaming takes one prompt and n=1", param="n", code="unsupported_parameter")
        return await stream_live(state, req, prompts[0], specs[0], opts, n_prompt[0], plan.stops, chat=chat)
    coros = [state.batcher.submit(p, c, opts if opts.seed is None else opts.with_overrides(seed=offset_seed(opts.seed, j)),
                                  timeout_s=state.config.request_timeout_s)
             for p, c in zip(prompts, specs) for j in range(plan.n)]
    try:                                                                              # 5. run the rows
        results = await _gather(coros, request, plan.param)
    except _ClientGone:
        return Response(status_code=499)
    return Ran(plan, prompts, results, [c for c in specs for _ in range(plan.n)], grounded is not None, opts.thinks,
               sum(n_prompt) * plan.n)


async def _answer(state: ServerState, req: Any, plan: _Plan, prompts: list[Any], results: list[Any],
                  row_specs: list[Any], grounded: bool, thinks: bool, prompt_total: int) -> Any:
    """The JSON body or the validated stream of finished rows, with each choice's extensions: the
    thought (vLLM's ``reasoning_content``), grounded spans, choice probabilities and logprobs."""
    rows = [row_of(state, r, plan.stops) for r in results]
    entries = [_entries(r, row[0]) for r, row in zip(results, rows)] if plan.top is not None else None
    extras: list[dict[str, Any]] = []
    for r, c, row in zip(results, row_specs, rows):
        extra: dict[str, Any] = {}
        if thinks:
            extra["reasoning_content"] = getattr(r, "reasoning", None)
        if grounded:
            extra["grounding"] = spans_of(c, row[0]) if row[1] != "length" else None
        if plan.confidence:
            extra["field_confidence"] = getattr(r, "confidence", None)
        extras.append(extra)
    if plan.estimator is not None:   # the same for every sample of a prompt: scored once per prompt
        probs = [await _choice_probabilities(state, p, plan.spec.choices, plan.estimator) for p in prompts]
        for extra, pr in zip(extras, [pr for pr in probs for _ in range(plan.n)]):
            extra["choice_probabilities"] = pr
    rid = ("chatcmpl-" if plan.chat else "cmpl-") + uuid.uuid4().hex[:24]
    if req.stream:
        return stream_validated(state, req, rid, rows, prompt_total, chat=plan.chat, extras=extras, entries=entries)
    if entries is not None:
        for extra, ents in zip(extras, entries):
            extra["logprobs"] = (None if ents is None else chat_logprobs(ents) if plan.chat
                                 else completion_logprobs(ents))
    return json_response(_body(state, rid, rows, extras, prompt_total, chat=plan.chat))


async def _choice_probabilities(state: ServerState, prompt: Any, choices: Any, estimator: str) -> dict[str, float]:
    """Every option's probability for ``prompt`` (:func:`~dgemma_struct.choice_scores.score_choices`
    takes the runtime's lock itself, so it runs after the batch worker's rows, never inside them)."""
    try:
        return (await asyncio.to_thread(score_choices, prompt, list(choices), runtime=state.runtime,
                                        estimator=estimator)).probabilities
    except DgemmaStructError as err:
        raise api_error_for(err) from None


def _entries(r: Any, text: str) -> list | None:
    """A row's logprob entries, cut like its text at a stop sequence (``None`` for a length error:
    its partial text has none)."""
    ents = getattr(r, "logprobs", None)
    if ents is None or isinstance(r, BaseException):
        return None
    return ents if text == r.text else cut_to(ents, text)


def _body(state: ServerState, rid: str, rows: list[tuple], extras: list[dict[str, Any]], prompt_total: int, *,
          chat: bool) -> ChatCompletion | Completion:
    """The ``chat.completion`` / ``text_completion`` body of the rows (``extras``: fields of each
    choice; the thought goes on the message)."""
    usage = Usage.of(prompt_total, sum(r[2] for r in rows))
    stats = [r[3] for r in rows]
    head = dict(id=rid, created=int(time.time()), model=state.model_id, usage=usage,
                dgemma_stats=stats if len(stats) > 1 else stats[0])
    if chat:
        choices = []
        for i, ((text, finish, _, _), extra) in enumerate(zip(rows, extras)):
            thought = {k: v for k, v in extra.items() if k == "reasoning_content"}   # on the message
            more = {k: v for k, v in extra.items() if k != "reasoning_content"}      # on the choice
            choices.append(ChatChoice(index=i, message=AssistantMessage(content=text, **thought), finish_reason=finish,
                                      **more))
        return ChatCompletion(**head, choices=choices)
    return Completion(**head, choices=[CompletionChoice(index=i, text=text, finish_reason=finish, **extra)
                                       for i, ((text, finish, _, _), extra) in enumerate(zip(rows, extras))])


def _tool_answer(state: ServerState, req: Any, results: list[Any], tool_req: Any, *, prompt_total: int) -> Any:
    """The answer of a tool request: ``message.tool_calls`` (or the text), as JSON or a stream."""
    rid = "chatcmpl-" + uuid.uuid4().hex[:24]
    completion = sum(row_tokens(r, state.count_tokens) for r in results)
    created = int(time.time())
    if req.stream:
        include_usage = bool((req.stream_options or {}).get("include_usage"))
        usage = Usage.of(prompt_total, completion).wire() if include_usage else None
        return StreamingResponse(sse_events(results, tool_req, rid=rid, model=state.model_id, created=created,
                                            usage=usage), media_type="text/event-stream")
    return json_response(completion_body(results, tool_req, rid=rid, model=state.model_id, created=created,
                                         prompt_tokens=prompt_total, completion_tokens=completion))

