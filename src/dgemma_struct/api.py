"""Constrained generation: ``generate_json``, ``generate_regex``, ``generate_grammar``,
``generate_choice`` and the general ``generate``.

The flow, top to bottom: prompt → :func:`compile_constraint` → canvas loop with a
:class:`~dgemma_struct.guide.ConstraintGuide` → validation → repair (renoise from the earliest
offending token) → AR fallback on the same weights → a valid value, or a typed error.

Example::

    >>> from pydantic import BaseModel
    >>> from dgemma_struct import generate_json
    >>> class Person(BaseModel):
    ...     name: str
    ...     age: int
    >>> p = generate_json("Extract the name and age as JSON.\\nAda Lovelace is 36.", schema=Person)
    >>> isinstance(p, Person)
    True
"""
from __future__ import annotations

import asyncio
import json
import math
import numbers
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from dgemma_struct.constraints import Choice, Constraint, Grammar, Regex, compile_constraint
from dgemma_struct.constraints.thinking import with_thinking
from dgemma_struct.errors import (ChoiceError, DgemmaStructError, GenerationFailed, GenerationTimeout,
                                  InvalidRequestError, LengthError)
from dgemma_struct.guide import ConstraintGuide
from dgemma_struct.repair import char_to_token_index, error_char_offset
from dgemma_struct.results import CanvasEvent, GenerationResult, GenerationStats
from dgemma_struct.runtime import (MAX_SEED, MODES, ChatPrompt, DiffusionRuntime, Prompt, check_max_new_tokens,
                                   check_sampling, check_seed, fresh_seed)

MAX_N = 64          # samples per request (``n``)
WHITESPACE = ("compact", "model", "flexible")


@dataclass
class _Attempt:
    tokens: list[int]        # generated tokens (EOS excluded)
    complete: bool           # the grammar accepted and EOS was reached
    dead_end: bool
    stats: GenerationStats


# braces/brackets, a quote glued to ':' or ',', control characters, or a value that starts with
# ':' / ',' (a separator the grammar did not let the model write where it wanted to)
_JUNK = re.compile(r'[{}\[\]]|":|",|[\x00-\x1f]|^\s*[:,]')


@dataclass
class _Issue:
    path: tuple
    message: str


def _value_keys(value: Any) -> set[str]:
    """Object keys at any depth of a JSON value (string keys only)."""
    if isinstance(value, dict):
        return {k for k in value if isinstance(k, str)}.union(*(_value_keys(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_value_keys(v) for v in value))
    return set()


def _schema_property_names(schema: Any) -> set[str]:
    """Names under ``properties`` anywhere in a JSON Schema (not the schema's own keywords)."""
    out: set[str] = set()
    if isinstance(schema, dict):
        props = schema.get("properties")
        if isinstance(props, dict):
            out |= {k for k in props if isinstance(k, str)}
        for v in schema.values():
            out |= _schema_property_names(v)
    elif isinstance(schema, list):
        for v in schema:
            out |= _schema_property_names(v)
    return out


def junk_paths(value: Any, path: tuple = (), _leak: re.Pattern | None = None, *,
               schema: Any = None) -> list[tuple]:
    """Paths of string values that hold JSON punctuation or control characters, or two key names
    of 4+ characters back to back (``"addresscity"``; keys of the value and, given ``schema``, its
    property names; case-sensitive): the signature of a model whose structural tokens were masked
    out and absorbed into a string.

    >>> junk_paths({"a": "ok", "b": ["x}", "y"], "city": "addresscity", "address": "Main St"})
    [('b', 0), ('city',)]
    """
    if _leak is None:
        names = _value_keys(value) | _schema_property_names(schema)
        keys = sorted((k for k in names if len(k) >= 4), key=len, reverse=True)
        alt = "|".join(map(re.escape, keys))
        _leak = re.compile(f"(?:{alt})(?:{alt})") if keys else re.compile(r"(?!)")
    if isinstance(value, str):
        return [path] if _JUNK.search(value) or _leak.search(value) else []
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in junk_paths(v, path + (k,), _leak)]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in junk_paths(v, path + (i,), _leak)]
    return []


def _runtime(runtime: DiffusionRuntime | None) -> DiffusionRuntime:
    if runtime is None:
        return DiffusionRuntime.default()
    if not isinstance(runtime, DiffusionRuntime):
        raise InvalidRequestError(f"runtime must be a DiffusionRuntime or None, got {type(runtime).__name__}")
    return runtime


def _check_format(whitespace: Any, separators: Any) -> None:
    if not isinstance(whitespace, str) or whitespace not in WHITESPACE:
        raise InvalidRequestError(f"whitespace must be one of {WHITESPACE}, got {whitespace!r}")
    if separators is not None and not (isinstance(separators, (tuple, list)) and len(separators) == 2
                                       and all(isinstance(x, str) and x.strip() in (",", ":") for x in separators)
                                       and separators[0].strip() == "," and separators[1].strip() == ":"):
        raise InvalidRequestError("separators must be None or an (item, key) pair of strings like "
                                  f"(', ', ': '): ',' and ':' with optional whitespace; got {separators!r}")
    if separators is not None and any(set(x) - set(" \t\n\r,:") for x in separators):
        raise InvalidRequestError(f"separators may only add JSON whitespace, got {separators!r}")


def constraint_for(spec: Any, runtime: DiffusionRuntime, *, strict: bool = False,
                   whitespace: str = "compact", separators: tuple[str, str] | None = None) -> Constraint:
    """Compile ``spec`` for ``runtime``'s tokenizer. EOS is every id of the runtime's stop set
    (the generation config's ``eos_token_id``, e.g. ``[1, 106, 50]`` on the real checkpoint):
    whichever of them the model writes after a complete value ends it, and none is ever part of
    the text. A compiled ``Constraint`` is used as it is."""
    if isinstance(spec, Constraint):
        return spec
    _check_format(whitespace, separators)
    if not isinstance(strict, bool):
        raise InvalidRequestError(f"strict must be a bool, got {strict!r}")
    return compile_constraint(spec, tokenizer=runtime.tokenizer, strict=strict, whitespace=whitespace,
                              stop_token_ids=runtime.eos_token_ids, separators=separators,
                              vocab_size=runtime.model.config.text_config.vocab_size)


def _check_options(max_new_tokens: Any, mode: str, max_repairs: Any, *, seed: Any = None, timeout_s: Any = None,
                   temperature: Any = None, top_p: Any = 1.0, n: Any = 1, **flags: Any) -> None:
    """Every argument of a constrained call, checked before any work: a typed
    :class:`InvalidRequestError` names the first bad one."""
    if not isinstance(mode, str) or mode not in MODES:
        raise InvalidRequestError(f"unknown mode {mode!r}; expected one of {MODES}")
    check_max_new_tokens(max_new_tokens)
    if isinstance(max_repairs, bool) or not isinstance(max_repairs, numbers.Integral) or not 0 <= max_repairs <= 100:
        raise InvalidRequestError(f"max_repairs must be an integer in [0, 100], got {max_repairs!r}")
    check_seed(seed)
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real)
                                  or math.isnan(timeout_s) or timeout_s <= 0):
        raise InvalidRequestError(f"timeout_s must be None or a positive number of seconds, got {timeout_s!r}")
    check_sampling(temperature, top_p)
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or not 1 <= n <= MAX_N:
        raise InvalidRequestError(f"n must be an integer in [1, {MAX_N}], got {n!r}")
    for name, v in flags.items():
        if not isinstance(v, bool):
            raise InvalidRequestError(f"{name} must be a bool, got {v!r}")


def _offset_seed(seed: int, k: int) -> int:
    return (seed + k) % (MAX_SEED + 1)


def _min_length_tokens(constraint: Constraint) -> int:
    """A lower bound on the tokens any accepted output needs: the forced prefix plus EOS."""
    w = constraint.canvas_walker()
    forced = w.forced_tokens(4096)
    return len(forced) + (0 if forced and forced[-1] in constraint.stop_token_ids else 1)


class _Session:
    """One request: a prompt, its constraint, the budget, and the attempts made so far."""

    def __init__(self, runtime: DiffusionRuntime, prompt_ids: list[int], constraint: Constraint, *,
                 max_new_tokens: int, seed: int | None, mode: str, max_repairs: int, fallback: bool,
                 deadline: float | None, progress: bool = True, repair_junk: bool = True,
                 close_on_budget: bool = True, temperature: float | None = None, top_p: float = 1.0):
        self.rt = runtime
        self.temperature = temperature
        self.top_p = top_p
        self.prompt_ids = prompt_ids
        self.c = constraint
        self.max_new = max_new_tokens
        self.seed = fresh_seed() if seed is None else int(seed)  # None: fresh randomness, recorded in stats
        self.mode = mode
        self.max_repairs = max_repairs
        self.fallback = fallback
        self.deadline = deadline
        self.progress = progress
        self.repair_junk = repair_junk
        self.close_on_budget = close_on_budget
        self.stats = GenerationStats(mode=mode, seed=self.seed)
        self.errors: list[str] = []
        self._last_issues: list | None = None   # what the last attempt got wrong (repair target)
        self._least_junk: tuple | None = None   # (junk count, attempt, outcome) of the best valid attempt

    # -- one pass of the loop from a kept prefix ------------------------------------------------
    def guide_for(self, prefix: list[int]) -> ConstraintGuide:
        w = self.c.canvas_walker()
        if prefix:
            w.commit(prefix)
        return ConstraintGuide([w], pad_token_id=self.rt.pad_token_id or 0, progress=self.progress,
                               deadline=self.deadline, budgets=[self.max_new - len(prefix)],
                               close_on_budget=self.close_on_budget)

    def absorb(self, res: GenerationResult, guide: ConstraintGuide, prefix: list[int], row: int = 0) -> _Attempt:
        """This session's attempt from ``row`` of ``guide`` (a batched guide shares its mask time)."""
        guide.drain()
        s = res.stats
        agg = self.stats
        agg.forward_passes += s.forward_passes
        agg.canvases += s.canvases
        agg.denoising_steps += s.denoising_steps
        agg.model_s += s.model_s
        agg.mask_s += guide.mask_s / len(guide.walkers)
        agg.forced_tokens += guide.forced[row]
        agg.budget_closing = agg.budget_closing or guide.closing[row]
        w = guide.walkers[row]
        gen = list(w.frozen_tokens)
        complete = bool(gen) and gen[-1] in self.c.stop_token_ids
        tokens = [t for t in gen if t not in self.c.stop_token_ids]
        return _Attempt(tokens=tokens, complete=complete, dead_end=guide.dead_end[row], stats=s)

    def run(self, prefix: list[int], mode: str, attempt: int) -> _Attempt:
        self._check_deadline()
        guide = self.guide_for(prefix)
        budget = self.max_new - len(prefix)
        if budget <= 0:
            return _Attempt(prefix, False, False, GenerationStats())
        seed = _offset_seed(self.seed, 1000 * attempt)
        res = self.rt.generate_ids([self.prompt_ids + prefix], max_new_tokens=budget, seed=[seed], mode=mode,
                                   hook=guide, temperature=self.temperature, top_p=self.top_p)[0]
        return self.absorb(res, guide, prefix)

    def _check_deadline(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise GenerationTimeout("generation exceeded its timeout")

    def text_of(self, tokens: list[int]) -> str:
        return self.rt.tokenizer.decode(tokens, skip_special_tokens=False)

    # -- validate, repair, fall back -------------------------------------------------------------
    def offending_prefix(self, tokens: list[int], issues) -> list[int]:
        """Tokens before the earliest offending value (where renoising restarts)."""
        text = self.text_of(tokens)
        reasoning, answer = split_reasoning(self.c, text)
        skip = len(text) - len(answer)  # a thought block before the answer is kept as it is
        offset = skip + (error_char_offset(answer, [i.path for i in issues]) if self.c.kind == "json" else 0)
        pieces = [self.rt.tokenizer.decode([t], skip_special_tokens=False) for t in tokens]
        return tokens[:char_to_token_index(pieces, offset)]

    def solve(self, first: _Attempt | None = None, t0: float | None = None) -> GenerationResult:
        """Attempt 0, then up to ``max_repairs`` repairs, then the AR fallback. ``first`` is an
        attempt 0 already run (by a batched loop)."""
        t0 = time.perf_counter() if t0 is None else t0
        prefix: list[int] = []
        last: _Attempt | None = None
        for attempt in range(self.max_repairs + 1):
            self.stats.repairs = attempt
            last = first if (attempt == 0 and first is not None) else self.run(prefix, self.mode, attempt)
            chosen = self.check(last, attempt)
            if chosen is not None:
                return self.finish(*chosen, t0)
            prefix = self.next_prefix(last)
        if self.fallback and self.mode == "diffusion":
            self.stats.fallback = True
            last = self.run(prefix, "ar", self.max_repairs + 1)
            chosen = self.check(last, self.max_repairs)
            if chosen is not None:
                return self.finish(*chosen, t0)
        best = self._least_junk
        if best is not None:  # a valid value (with junk) beat every later attempt
            return self.finish(best[1], best[2], t0)
        self.stats.wall_s = time.perf_counter() - t0
        partial = self.text_of(last.tokens) if last else ""
        if last is not None and not last.complete and not last.dead_end:
            self.stats.finish_reason = "length"
            self.stats.generated_tokens = len(last.tokens)
            raise LengthError(f"the output could not be completed within max_new_tokens={self.max_new}; "
                              f"nothing truncated was returned", partial_text=partial, stats=self.stats)
        self.stats.finish_reason = "error"
        raise GenerationFailed("no valid output after {} repairs{}: {}".format(
            self.max_repairs, " and the AR fallback" if self.stats.fallback else "", "; ".join(self.errors[-3:])),
            errors=self.errors, partial_text=partial, stats=self.stats)

    def check(self, a: _Attempt, attempt: int = 0):
        """``(attempt, validated outcome)`` to return, or ``None`` (and the reasons recorded) when
        ``a`` must be redone. The attempt returned is the valid one with the least junk so far.
        A schema-valid value whose strings hold structural junk (the model's braces absorbed into a
        string) is redone too while repairs remain; after that it is returned, being valid. (A
        greedy AR fallback from the same prefix was measured to rewrite the same junk, so junk
        alone never triggers it.)"""
        if a.dead_end:
            self.errors.append("the grammar walk made no progress (dead end)")
            return None
        if not a.complete:
            self.errors.append("the output did not finish within the token budget")
            return None
        outcome = self.c.validate_text(self.text_of(a.tokens))
        if outcome.ok:
            value = outcome.value.model_dump(mode="json") if hasattr(outcome.value, "model_dump") else outcome.value
            junk = junk_paths(value, schema=self.c.schema) if self.repair_junk and self.c.kind == "json" else []
            best = self._least_junk
            if best is None or len(junk) < best[0]:  # a repair must not trade a cleaner value for a worse one
                self._least_junk = best = (len(junk), a, outcome)
            if junk and attempt < self.max_repairs:
                self.stats.junk_repairs += 1
                self._last_issues = [_Issue(p, "structural junk inside a string") for p in junk]
                return None
            return best[1], best[2]
        self._last_issues = outcome.errors
        self.errors.extend(str(e) for e in outcome.errors)
        return None

    def next_prefix(self, a: _Attempt) -> list[int]:
        if a.complete and not a.dead_end and self._last_issues:
            prefix = self.offending_prefix(a.tokens, self._last_issues)
            self._last_issues = None
            return prefix
        # dead end or out of budget: keep half of what was generated, renoise the rest
        return a.tokens[: len(a.tokens) // 2]

    def finish(self, a: _Attempt, outcome, t0: float) -> GenerationResult:
        s = self.stats
        s.wall_s = time.perf_counter() - t0
        s.generated_tokens = len(a.tokens)
        s.tokens_per_forward = (len(a.tokens) + 1) / s.forward_passes if s.forward_passes else 0.0
        s.other_s = max(0.0, s.wall_s - s.model_s)
        s.finish_reason = "stop"
        reasoning, text = split_reasoning(self.c, self.text_of(a.tokens))
        return GenerationResult(text=text, token_ids=a.tokens, stats=s, value=outcome.value, reasoning=reasoning)


def _session(prompt: Prompt, spec: Any, runtime: DiffusionRuntime | None, *, max_new_tokens: int, seed: int | None,
             mode: str, max_repairs: int, strict: bool, fallback: bool, timeout_s: float | None,
             whitespace: str, progress: bool = True, repair_junk: bool = True,
             close_on_budget: bool = True, temperature: float | None = None, top_p: float = 1.0,
             separators: tuple[str, str] | None = None, thinking: bool | str = False,
             max_thinking_tokens: int = 1024) -> _Session:
    _check_options(max_new_tokens, mode, max_repairs, seed=seed, timeout_s=timeout_s, temperature=temperature,
                   top_p=top_p, strict=strict, fallback=fallback, progress=progress, repair_junk=repair_junk,
                   close_on_budget=close_on_budget)
    rt = _runtime(runtime)
    if spec is None:
        raise InvalidRequestError("spec is None: pass a pydantic model, a JSON Schema, Regex, Grammar or Choice")
    constraint = constraint_for(spec, rt, strict=strict, whitespace=whitespace, separators=separators)
    constraint, prompt = _apply_thinking(constraint, prompt, rt, thinking, max_thinking_tokens)
    need = _min_length_tokens(constraint)
    if need > max_new_tokens:
        raise LengthError(f"every output of this constraint needs at least {need} tokens, "
                          f"but max_new_tokens={max_new_tokens}", partial_text="",
                          stats=GenerationStats(mode=mode, finish_reason="length", seed=seed))
    prompt_ids = rt.encode_prompt(prompt)
    rt._batch([prompt_ids], max_new_tokens)  # raises PromptTooLongError before any generation
    deadline = time.monotonic() + timeout_s if timeout_s else None
    return _Session(rt, prompt_ids, constraint, max_new_tokens=max_new_tokens, seed=seed, mode=mode,
                    max_repairs=max_repairs, fallback=fallback, deadline=deadline, progress=progress,
                    repair_junk=repair_junk, close_on_budget=close_on_budget, temperature=temperature,
                    top_p=top_p)


def split_reasoning(constraint: Constraint, text: str) -> tuple[str | None, str]:
    """``(thought, answer)`` of decoded text under ``constraint`` (no thought: ``(None, text)``)."""
    split = getattr(constraint, "split_reasoning", None)
    return split(text) if split is not None else (None, text)


def _apply_thinking(constraint: Constraint, prompt: Prompt, rt: DiffusionRuntime, thinking: Any,
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


def generate(prompt: Prompt, spec: Any, *, runtime: DiffusionRuntime | None = None, max_new_tokens: int = 128,
             seed: int | None = 0, mode: str = "diffusion", max_repairs: int = 2, strict: bool = False,
             fallback: bool = True, timeout_s: float | None = None, whitespace: str = "compact",
             progress: bool = True, repair_junk: bool = True, close_on_budget: bool = True,
             return_details: bool = False, temperature: float | None = None, top_p: float = 1.0, n: int = 1,
             separators: tuple[str, str] | None = None, thinking: bool | str = False,
             max_thinking_tokens: int = 1024) -> Any:
    """Generate an output that satisfies ``spec`` (pydantic model, JSON-Schema dict, ``Regex``,
    ``Grammar``, ``Choice``, ``Literal``/``Enum`` type, or a compiled ``Constraint``).

    Returns the value (a pydantic instance, a JSON value, or the text), or with
    ``return_details=True`` a :class:`GenerationResult` with ``.value``, ``.text``, ``.stats``.
    Raises a :class:`~dgemma_struct.errors.DgemmaStructError` subclass, never an invalid value.

    Sampling: ``seed=0`` by default, so a call is deterministic (the same arguments give the same
    output); ``seed=None`` draws a fresh seed (``stats.seed`` records it). ``temperature=None``
    keeps each mode's default (diffusion: the checkpoint's temperature schedule; AR: greedy);
    ``0`` is greedy; ``t > 0`` scales the diffusion schedule (``t_min``/``t_max``) by ``t`` and
    is the softmax temperature in AR. ``top_p`` in (0, 1]: nucleus sampling.

    ``n`` > 1: ``n`` independent samples, batched rows with seeds ``seed, seed+1, ...`` (sample
    ``i`` is what ``n=1, seed=seed+i`` returns), each valid; the result is then a **list** of
    ``n`` values (or results). The first failed sample's typed error is raised.

    ``close_on_budget``: near the end of ``max_new_tokens`` the allowed tokens that close the output
    (``"``, ``}``, ``]``, EOS) are preferred, so a long string is cut short instead of the request
    failing with :class:`~dgemma_struct.errors.LengthError` (``stats.budget_closing`` tells).
    Set it to False to get the error instead.

    ``thinking``: ``True`` lets the model think first (Gemma 4's thought channel, switched on in the
    chat template; a thought block of at most ``max_thinking_tokens`` is required before the
    answer), ``"optional"`` allows one, ``False`` (default) masks it out. The thought is returned
    as ``result.reasoning`` and never validated; it needs a tokenizer with the channel tokens."""
    _check_options(max_new_tokens, mode, max_repairs, seed=seed, n=n, return_details=return_details)
    if n != 1 and thinking not in (False, None):
        raise InvalidRequestError("thinking is not supported with n > 1 yet")
    if n != 1:
        base = fresh_seed() if seed is None else seed
        results = generate_batch([prompt] * n, spec, runtime=runtime, max_new_tokens=max_new_tokens,
                                 seed=[_offset_seed(base, i) for i in range(n)], mode=mode, max_repairs=max_repairs,
                                 strict=strict, fallback=fallback, timeout_s=timeout_s, whitespace=whitespace,
                                 progress=progress, repair_junk=repair_junk, close_on_budget=close_on_budget,
                                 temperature=temperature, top_p=top_p, separators=separators)
        return results if return_details else [r.value for r in results]
    session = _session(prompt, spec, runtime, max_new_tokens=max_new_tokens, seed=seed, mode=mode,
                       max_repairs=max_repairs, strict=strict, fallback=fallback, timeout_s=timeout_s,
                       whitespace=whitespace, progress=progress, repair_junk=repair_junk,
                       close_on_budget=close_on_budget, temperature=temperature, top_p=top_p,
                       separators=separators, thinking=thinking, max_thinking_tokens=max_thinking_tokens)
    result = session.solve()
    return result if return_details else result.value


def generate_json(prompt: Prompt, schema: Any, **opts: Any) -> Any:
    """A pydantic instance for a pydantic class, else a JSON value valid against ``schema``."""
    return generate(prompt, schema, **opts)


def generate_regex(prompt: Prompt, pattern: str, **opts: Any) -> Any:
    """Text that fully matches ``pattern``."""
    if not isinstance(pattern, str):
        raise InvalidRequestError(f"pattern must be a string, got {type(pattern).__name__}")
    return generate(prompt, Regex(pattern), **opts)


def generate_grammar(prompt: Prompt, lark_grammar: str, **opts: Any) -> Any:
    """Text in the language of a Lark grammar (text, ``.lark`` path, or built-in name)."""
    if not isinstance(lark_grammar, str):
        raise InvalidRequestError(f"the grammar must be a string, got {type(lark_grammar).__name__}")
    return generate(prompt, Grammar(lark_grammar), **opts)


def generate_choice(prompt: Prompt, choices: Sequence[str], **opts: Any) -> Any:
    """One of ``choices``."""
    if choices is None or isinstance(choices, (str, bytes, dict)) or not isinstance(choices, (Sequence, set, frozenset)):
        raise ChoiceError(f"choices must be a list of strings, got {type(choices).__name__}")
    return generate(prompt, Choice(list(choices)), **opts)


def generate_batch(prompts: Sequence[Prompt], specs: Any | Sequence[Any], *, runtime: DiffusionRuntime | None = None,
                   max_new_tokens: int = 128, seed: int | Sequence[int] | None = 0, mode: str = "diffusion",
                   max_repairs: int = 2, strict: bool = False, fallback: bool = True, timeout_s: float | None = None,
                   whitespace: str = "compact", progress: bool = True, repair_junk: bool = True,
                   close_on_budget: bool = True, return_exceptions: bool = False,
                   row_stop: Sequence[Callable[[], bool] | None] | None = None, temperature: float | None = None,
                   top_p: float = 1.0, separators: tuple[str, str] | None = None, thinking: bool | str = False,
                   max_thinking_tokens: int = 1024) -> list[Any]:
    """Constrained generation for many prompts in one batched canvas loop; each row has its own
    constraint (``specs`` is one spec for all rows or one per row). Rows that fail validation are
    repaired one by one. Returns :class:`GenerationResult` objects (or, with
    ``return_exceptions=True``, the typed error in a failed row's place).

    ``seed``: one seed for every row, one per row, or ``None`` (a fresh seed per row). Every row
    draws from its own generator, so a row's output is what :func:`generate` gives for its prompt
    and seed alone, whichever rows share its batch.

    ``row_stop``: per prompt, an optional callable polled every denoising step; when it returns
    True that row is dropped at once (a server's caller timed out or disconnected) and its place
    holds a :class:`~dgemma_struct.errors.GenerationTimeout`, without holding up the batch.

    ``thinking`` / ``max_thinking_tokens``: as in :func:`generate`, for every row."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise InvalidRequestError(f"prompts must be a list, got {type(prompts).__name__}")
    if not isinstance(specs, (list, tuple)):
        specs = [specs] * len(prompts)
    if len(specs) != len(prompts):
        raise InvalidRequestError(f"{len(prompts)} prompts but {len(specs)} specs")
    if isinstance(seed, (list, tuple)):
        if len(seed) != len(prompts):
            raise InvalidRequestError(f"{len(prompts)} prompts but {len(seed)} seeds")
        seeds = list(seed)
    else:
        check_seed(seed)
        seeds = [seed] * len(prompts)
    if not isinstance(return_exceptions, bool):
        raise InvalidRequestError(f"return_exceptions must be a bool, got {return_exceptions!r}")
    if row_stop is not None and len(row_stop) != len(prompts):
        raise InvalidRequestError(f"{len(prompts)} prompts but {len(row_stop)} row_stop entries")
    if not prompts:
        return []
    opts = dict(max_new_tokens=max_new_tokens, mode=mode, max_repairs=max_repairs, strict=strict,
                fallback=fallback, timeout_s=timeout_s, whitespace=whitespace, progress=progress,
                repair_junk=repair_junk, close_on_budget=close_on_budget, temperature=temperature, top_p=top_p,
                separators=separators, thinking=thinking, max_thinking_tokens=max_thinking_tokens)
    _check_options(max_new_tokens, mode, max_repairs, timeout_s=timeout_s, temperature=temperature, top_p=top_p)
    rt = _runtime(runtime)
    sessions: list[_Session | DgemmaStructError] = []
    for p, s, sd in zip(prompts, specs, seeds):
        try:
            sessions.append(_session(p, s, rt, seed=sd, **opts))
        except DgemmaStructError as err:
            if not return_exceptions:
                raise
            sessions.append(err)
    live = [i for i, s in enumerate(sessions) if isinstance(s, _Session)]
    out: list[Any] = list(sessions)
    if live:
        t0 = time.perf_counter()
        guides = [sessions[i].guide_for([]) for i in live]
        guide = ConstraintGuide([g.walkers[0] for g in guides], pad_token_id=rt.pad_token_id or 0,
                                progress=progress, deadline=sessions[live[0]].deadline,
                                budgets=[max_new_tokens] * len(live), close_on_budget=close_on_budget,
                                row_stop=[row_stop[i] for i in live] if row_stop is not None else None)
        results = rt.generate_ids([sessions[i].prompt_ids for i in live], max_new_tokens=max_new_tokens,
                                  seed=[sessions[i].seed for i in live], mode=mode, hook=guide,
                                  temperature=temperature, top_p=top_p)
        guide.drain()  # before any row raises: no worker left on the walkers
        for j, i in enumerate(live):
            sess: _Session = sessions[i]
            if guide.cut[j]:
                err = GenerationTimeout("the request was dropped from its batch (timed out or cancelled)")
                if not return_exceptions:
                    raise err
                out[i] = err
                continue
            attempt = sess.absorb(results[j], guide, [], row=j)
            try:
                out[i] = sess.solve(first=attempt, t0=t0)
            except DgemmaStructError as err:
                if not return_exceptions:
                    raise
                out[i] = err
    return out


def generate_json_batch(prompts: Sequence[Prompt], schema: Any, **opts: Any) -> list[Any]:
    """Values for many prompts (one schema, or one per prompt); see :func:`generate_batch`."""
    results = generate_batch(prompts, schema, **opts)
    return [r.value if isinstance(r, GenerationResult) else r for r in results]


async def agenerate(prompt: Prompt, spec: Any, **opts: Any) -> Any:
    """``generate`` in a worker thread, for event loops (servers)."""
    return await asyncio.to_thread(generate, prompt, spec, **opts)


async def agenerate_json(prompt: Prompt, schema: Any, **opts: Any) -> Any:
    return await asyncio.to_thread(generate_json, prompt, schema, **opts)


def partial_json(text: str) -> Any:
    """The value of an unfinished JSON text, by pydantic-core's partial JSON parser
    (``from_json(..., allow_partial="trailing-strings")``): open strings, arrays and objects are
    closed, an incomplete trailing key or literal is dropped. Returns ``None`` when nothing parses.

    >>> partial_json('{"a":[1,2')
    {'a': [1, 2]}
    """
    from pydantic_core import from_json

    if not isinstance(text, str) or not text.strip():
        return None
    try:
        return from_json(text, allow_partial="trailing-strings")
    except ValueError:
        return None


def _partial_instance(model: type, data: Any) -> Any:
    """A pydantic instance built from a partial value without validation (``model_construct``,
    nested models too): what a streaming UI shows while the answer grows."""
    import typing

    from pydantic import BaseModel

    if not (isinstance(model, type) and issubclass(model, BaseModel)) or not isinstance(data, dict):
        return data
    values = {}
    for name, field in model.model_fields.items():
        key = field.alias or name
        if key not in data:
            continue
        v, ann = data[key], field.annotation
        sub = [a for a in (typing.get_args(ann) or (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if isinstance(v, dict) and sub:
            v = _partial_instance(sub[0], v)
        elif isinstance(v, list):
            inner = [a for a in typing.get_args(ann) for a in (typing.get_args(a) or (a,))
                     if isinstance(a, type) and issubclass(a, BaseModel)]
            if inner:
                v = [_partial_instance(inner[0], x) if isinstance(x, dict) else x for x in v]
        values[name] = v
    return model.model_construct(**values)


def stream(prompt: Prompt, spec: Any, *, runtime: DiffusionRuntime | None = None, max_new_tokens: int = 128,
           seed: int | None = 0, strict: bool = False, whitespace: str = "compact",
           timeout_s: float | None = None, temperature: float | None = None, top_p: float = 1.0,
           separators: tuple[str, str] | None = None) -> Iterator[CanvasEvent]:
    """Streams committed canvases of a constrained diffusion run as partial text (and, for JSON,
    ``event.value`` = the partial value, :func:`partial_json`). Every event before the last has
    ``validated=False``. The final event (``done=True``, ``validated=True``) carries the validated
    value; if validation fails the stream raises a typed error instead of ending with bad data."""
    session = _session(prompt, spec, runtime, max_new_tokens=max_new_tokens, seed=seed, mode="diffusion",
                       max_repairs=0, strict=strict, fallback=False, timeout_s=timeout_s, whitespace=whitespace,
                       temperature=temperature, top_p=top_p, separators=separators)
    guide = session.guide_for([])
    rt = session.rt
    final: GenerationResult | None = None
    for ev in rt.stream(prompt_ids=session.prompt_ids, max_new_tokens=max_new_tokens, seed=[session.seed],
                        hook=guide, temperature=temperature, top_p=top_p):
        if not ev.done:
            ev.value = partial_json(ev.text) if session.c.kind == "json" else ev.text
            ev.validated = False
            yield ev
        else:
            final = GenerationResult(text=ev.text, token_ids=ev.token_ids, stats=ev.stats or GenerationStats())
    if final is None:  # pragma: no cover - the runtime always ends a stream with a done event
        raise GenerationFailed("the stream ended without a result")
    attempt = session.absorb(final, guide, [])
    session.max_repairs = 1  # finish the request as a non-streaming call would: repair, then fall back
    result = session.solve(first=attempt)
    yield CanvasEvent(row=0, canvas_index=result.stats.canvases - 1, token_ids=result.token_ids, text=result.text,
                      done=True, value=result.value, validated=True, finish_reason=result.stats.finish_reason,
                      stats=result.stats)


def stream_json(prompt: Prompt, schema: Any, **opts: Any) -> Iterator[Any]:
    """Yields the value as it grows: for a pydantic model, partial instances built without
    validation (missing fields absent, strings possibly cut short) after each committed canvas,
    then, last, the validated instance; for a JSON Schema, partial JSON values then the valid one.
    Use :func:`stream` for the events themselves (``validated`` tells a draft from the final
    value). Options as :func:`stream`.

    >>> for person in stream_json("Extract as JSON.\\nAda is 36.", Person):   # doctest: +SKIP
    ...     print(person)
    """
    from pydantic import BaseModel

    model = schema if isinstance(schema, type) and issubclass(schema, BaseModel) else None
    last = None
    for ev in stream(prompt, schema, **opts):
        if ev.done:
            yield ev.value
            return
        if ev.value is None:
            continue
        value = _partial_instance(model, ev.value) if model is not None else ev.value
        key = json.dumps(ev.value, sort_keys=True, default=str)
        if key != last:  # only when the value grew
            last = key
            yield value
