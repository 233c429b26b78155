"""Turning a call into a :class:`~dgemma_struct.repair.session.RepairSession`: the runtime, the compiled
constraint (with a thought block when asked), the minimum-length and context checks, the seed
and the deadline. Every error here is raised before any generation.

Example::

    >>> from dgemma_struct.testing import tiny_runtime   # doctest: +SKIP
    >>> session = prepare("Say hi", Regex("hi|hello"), tiny_runtime(), GenerateOptions())  # doctest: +SKIP
"""
from __future__ import annotations

import pickle
import threading
from typing import Any

from dgemma_struct.constraints import Constraint, compile_constraint
from dgemma_struct.constraints.length_bound import min_tokens_for
from dgemma_struct.constraints.thinking import with_thinking
from dgemma_struct.errors import InvalidRequestError, LengthError
from dgemma_struct.options import GenerateOptions, check_format, deadline_after
from dgemma_struct.prompts import ChatPrompt, Prompt, fresh_seed
from dgemma_struct.repair.session import RepairSession, min_length_tokens
from dgemma_struct.results import GenerationStats
from dgemma_struct.runtime import DiffusionRuntime


def resolve_runtime(runtime: DiffusionRuntime | None) -> DiffusionRuntime:
    """``runtime``, or the default runtime for ``None``."""
    if runtime is None:
        return DiffusionRuntime.default()
    if not isinstance(runtime, DiffusionRuntime):
        raise InvalidRequestError(f"runtime must be a DiffusionRuntime or None, got {type(runtime).__name__}")
    return runtime


def constraint_for(spec: Any, runtime: DiffusionRuntime, *, strict: bool = False,
                   whitespace: str = "compact", separators: tuple[str, str] | None = None,
                   strict_objects: bool | None = None, bounded_numbers: bool = False,
                   field_budget: int | None = None) -> Constraint:
    """Compile ``spec`` for ``runtime``'s tokenizer. EOS is every id of the runtime's stop set
    (the generation config's ``eos_token_id``, e.g. ``[1, 106, 50]`` on the real checkpoint):
    whichever of them the model writes after a complete value ends it, and none is ever part of
    the text. A compiled ``Constraint`` is used as it is. ``strict_objects``: as
    :func:`~dgemma_struct.constraints.compile_constraint` (``None``: strict for pydantic models)."""
    if isinstance(spec, Constraint):
        return spec
    check_format(whitespace, separators)
    if not isinstance(strict, bool):
        raise InvalidRequestError(f"strict must be a bool, got {strict!r}")
    return compile_constraint(spec, tokenizer=runtime.tokenizer, strict=strict, whitespace=whitespace,
                              stop_token_ids=runtime.eos_token_ids, separators=separators,
                              vocab_size=runtime.model.config.text_config.vocab_size,
                              strict_objects=strict_objects, bounded_numbers=bounded_numbers,
                              field_budget=field_budget)


_POOL: Any = None
_POOL_LOCK = threading.Lock()
#: seconds a probe compile may take in the worker before it is stopped (ConstraintCompileTimeout)
ISOLATED_COMPILE_TIMEOUT_S = 30.0


def _shared_pool() -> Any:
    """The process's compile-worker pool (the server's :class:`~dgemma_struct.constraints.compile_pool.CompilePool`),
    started on first use and closed at exit."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            import atexit

            from dgemma_struct.constraints.compile_pool import CompilePool
            _POOL = CompilePool(size=1, small_lane=1)
            atexit.register(_POOL.close)
        return _POOL


def _probe_form(spec: Any) -> Any:
    """``spec`` in a form that pickles into a worker (a pydantic class by its JSON Schema), or None."""
    if isinstance(spec, type) and hasattr(spec, "model_json_schema"):
        try:
            return spec.model_json_schema()
        except Exception:  # noqa: BLE001 - the in-process compile words the error
            return None
    try:
        pickle.dumps(spec)
        return spec
    except Exception:  # noqa: BLE001 - not picklable: compiled in-process only
        return None


def isolated_constraint_for(spec: Any, runtime: DiffusionRuntime, *, strict: bool = False,
                            whitespace: str = "compact", separators: tuple[str, str] | None = None,
                            strict_objects: bool | None = None, bounded_numbers: bool = False,
                            field_budget: int | None = None) -> Constraint:
    """:func:`constraint_for`, with the compile first run in a worker process (``isolate_compile=True``):
    a native crash or a runaway compile there is a typed error
    (:class:`~dgemma_struct.errors.ConstraintEngineError` / ``ConstraintCompileTimeout``) instead of
    the end of this process. Specs that compiled before are not probed again."""
    if isinstance(spec, Constraint):
        return spec
    check_format(whitespace, separators)
    form = _probe_form(spec)
    if form is not None:
        _shared_pool().probe(form, runtime.tokenizer, stop_token_ids=list(runtime.eos_token_ids),
                             vocab_size=runtime.model.config.text_config.vocab_size, strict=bool(strict),
                             whitespace=whitespace, timeout_s=ISOLATED_COMPILE_TIMEOUT_S)
    return constraint_for(spec, runtime, strict=strict, whitespace=whitespace, separators=separators,
                          strict_objects=strict_objects, bounded_numbers=bounded_numbers, field_budget=field_budget)


def apply_thinking(constraint: Constraint, prompt: Prompt, rt: DiffusionRuntime, thinking: Any,
                   max_thinking_tokens: int) -> tuple[Constraint, Prompt]:
    """``thinking=True``: the chat template's thinking switch on and a thought block required before
    the answer; ``"optional"``: switched on, the block allowed; ``False``: no thought block can start
    (the plain constraint never allows a control token)."""
    if thinking is False or thinking is None:
        return constraint, prompt
    if thinking not in (True, "optional"):
        raise InvalidRequestError(f"thinking must be True, False or 'optional', got {thinking!r}")
    wrapped = with_thinking(constraint, rt.tokenizer, required=thinking is True,
                            max_thinking_tokens=max_thinking_tokens)
    if isinstance(prompt, ChatPrompt):
        prompt = ChatPrompt(prompt.messages, prompt.tools, {**prompt.template_kwargs, "enable_thinking": True})
    else:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        prompt = ChatPrompt(messages, None, {"enable_thinking": True})
    return wrapped, prompt


def prepare(prompt: Prompt, spec: Any, runtime: DiffusionRuntime | None, opts: GenerateOptions) -> RepairSession:
    """The session of one request (``opts`` already checked)."""
    rt = resolve_runtime(runtime)
    if spec is None:
        raise InvalidRequestError("spec is None: pass a pydantic model, a JSON Schema, Regex, Grammar or Choice")
    compile_fn = isolated_constraint_for if opts.isolate_compile else constraint_for
    constraint = compile_fn(spec, rt, strict=opts.strict, whitespace=opts.whitespace, separators=opts.separators,
                            strict_objects=opts.strict_objects, bounded_numbers=opts.bounded_numbers,
                            field_budget=opts.max_new_tokens if opts.field_budget else None)
    constraint, prompt = apply_thinking(constraint, prompt, rt, opts.thinking, opts.max_thinking_tokens)
    need = max(min_tokens_for(constraint), 0)  # from the schema's bounds: milliseconds, before any walking
    if need <= opts.max_new_tokens:
        need = min_length_tokens(constraint)
    if need > opts.max_new_tokens:
        raise LengthError(f"every output of this constraint needs at least {need} tokens, "
                          f"but max_new_tokens={opts.max_new_tokens}", partial_text="",
                          stats=GenerationStats(mode=opts.mode, finish_reason="length", seed=opts.seed))
    prompt_ids = rt.encode_prompt(prompt)
    rt.check_fits([prompt_ids], opts.max_new_tokens)  # PromptTooLongError before any generation
    seed = fresh_seed() if opts.seed is None else int(opts.seed)  # None: fresh randomness, recorded in stats
    return RepairSession(rt, prompt_ids, constraint, opts, seed=seed, deadline=deadline_after(opts.timeout_s))
