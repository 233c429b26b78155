"""Constrained generation: ``generate_json``, ``generate_regex``, ``generate_grammar``,
``generate_choice``, the general ``generate``, ``generate_batch``, and :class:`Generator` (a spec
compiled once, then called on many prompts).

The flow, top to bottom: options (:class:`~dgemma_struct.options.GenerateOptions`) → prompt and
constraint (:func:`~dgemma_struct.repair.preparation.prepare`) → canvas loop with a
:class:`~dgemma_struct.guide.constraint_guide.ConstraintGuide` → validation → repair (renoise from the earliest
offending token) → AR fallback on the same weights (:mod:`dgemma_struct.repair.session`) → a valid value,
or a typed error.

Example::

    >>> from pydantic import BaseModel
    >>> from dgemma_struct import generate_json
    >>> class Person(BaseModel):
    ...     name: str
    ...     age: int
    >>> p = generate_json("Extract the name and age as JSON.\\nAda Lovelace is 36.", schema=Person)  # doctest: +SKIP
    >>> isinstance(p, Person)  # doctest: +SKIP
    True
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Iterator, Sequence

from dgemma_struct.constraints import Choice, Grammar, Regex
from dgemma_struct.scheduling.run import run_sessions
from dgemma_struct.errors import ChoiceError, DgemmaStructError, InvalidRequestError
from dgemma_struct.options import FIELDS, GenerateOptions, offset_seed
from dgemma_struct.prompts import Prompt, check_seed, fresh_seed
from dgemma_struct.repair.session import RepairSession
from dgemma_struct.repair.preparation import constraint_for, prepare, resolve_runtime
from dgemma_struct.choice_scores import score_choices
from dgemma_struct.results import CanvasEvent, ChoiceResult, GenerationResult
from dgemma_struct.runtime import DiffusionRuntime
from dgemma_struct.streaming import partial_json, stream, stream_json  # noqa: F401


# knobs generate_batch takes as keywords (seed, temperature and top_p are its own parameters)
_BATCH_KNOBS = tuple(k for k in FIELDS if k not in ("n", "return_details", "seed", "temperature", "top_p"))

__all__ = ["generate", "generate_json", "generate_regex", "generate_grammar", "generate_choice", "generate_batch",
           "generate_json_batch", "agenerate", "agenerate_json", "stream", "stream_json", "partial_json",
           "constraint_for", "Generator", "GenerateOptions"]


def generate(prompt: Prompt, spec: Any, *, runtime: DiffusionRuntime | None = None,
             options: GenerateOptions | None = None, **knobs: Any) -> Any:
    """Generate an output that satisfies ``spec`` (pydantic model, JSON-Schema dict, ``Regex``,
    ``Grammar``, ``Choice``, ``Literal``/``Enum`` type, or a compiled ``Constraint``).

    Returns the value (a pydantic instance, a JSON value, or the text), or with
    ``return_details=True`` a :class:`GenerationResult` with ``.value``, ``.text``, ``.stats``.
    Raises a :class:`~dgemma_struct.errors.DgemmaStructError` subclass, never an invalid value.

    The knobs are the fields of :class:`~dgemma_struct.options.GenerateOptions`, passed as an
    ``options`` object and/or as keywords (keywords win): ``max_new_tokens=128``, ``seed=0``,
    ``mode="diffusion"``, ``max_repairs=2``, ``strict=False``, ``strict_objects=None`` (``True``: no
    undeclared keys in objects that declare ``properties``; ``None``: so for pydantic models and python
    types, JSON Schema's meaning for raw schema dicts), ``fallback=True``,
    ``timeout_s=None``, ``whitespace="compact"``, ``separators=None``, ``progress=True``,
    ``repair_junk=True``, ``close_on_budget=True``, ``temperature=None``, ``top_p=1.0``, ``n=1``,
    ``thinking=False``, ``max_thinking_tokens=1024``, ``return_details=False``, ``logprobs=None``,
    ``isolate_compile=False`` (compile ``spec`` in a worker process first, so a native crash of the
    constraint engine on a user-supplied spec is a typed error, not the end of this process).

    ``logprobs=k`` (0..20): ``result.logprobs`` holds one
    :class:`~dgemma_struct.results.TokenLogprob` per ``result.token_ids`` entry, with the ``k``
    most likely alternatives (needs ``return_details=True`` to be seen); see
    :mod:`dgemma_struct.engine.token_logprobs` for what a diffusion logprob is.

    Sampling: ``seed=0`` by default, so a call is deterministic (the same arguments give the same
    output); ``seed=None`` draws a fresh seed (``stats.seed`` records it). ``temperature=None``
    keeps each mode's default (diffusion: the checkpoint's temperature schedule, greedy on
    constrained rows where its ``dgemma_struct.json`` sets ``guided_greedy``; AR: greedy);
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
    opts = GenerateOptions.build(options, knobs, verb="generate")
    if opts.n != 1:
        base = fresh_seed() if opts.seed is None else opts.seed
        results = generate_batch([prompt] * opts.n, spec, runtime=runtime, options=opts,
                                 seed=[offset_seed(base, i) for i in range(opts.n)])
        return results if opts.return_details else [r.value for r in results]
    session = prepare(prompt, spec, runtime, opts)
    result = run_sessions(session.rt, [session])[0]   # the one road: a batch of one
    if isinstance(result, DgemmaStructError):
        raise result
    return result if opts.return_details else result.value


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


def generate_choice(prompt: Prompt, choices: Sequence[str], *, return_probabilities: bool = False,
                    probability_estimator: str = "canvas", **opts: Any) -> Any:
    """One of ``choices``. With ``return_probabilities=True``: a :class:`ChoiceResult` holding
    the generated option and every option's probability (``{option: p}``, summing to 1) from
    :func:`~dgemma_struct.choice_scores.score_choices` (``probability_estimator``: ``"canvas"``, a
    masked pseudo-likelihood on one denoising pass, or ``"ar"``, the exact masked left-to-right
    likelihood on the same weights)."""
    if choices is None or isinstance(choices, (str, bytes, dict)) or not isinstance(choices, (Sequence, set, frozenset)):
        raise ChoiceError(f"choices must be a list of strings, got {type(choices).__name__}")
    if not isinstance(return_probabilities, bool):
        raise InvalidRequestError(f"return_probabilities must be a bool, got {return_probabilities!r}")
    if not return_probabilities:
        return generate(prompt, Choice(list(choices)), **opts)
    if opts.get("thinking") not in (None, False) or opts.get("n", 1) != 1:
        raise InvalidRequestError("return_probabilities works with n=1 and without thinking")
    scores = score_choices(prompt, list(choices), runtime=opts.get("runtime"), estimator=probability_estimator)
    return ChoiceResult(value=generate(prompt, Choice(list(choices)), **opts), probabilities=scores.probabilities)


def _row_seeds(seed: Any, n: int) -> list[Any]:
    if isinstance(seed, (list, tuple)):
        if len(seed) != n:
            raise InvalidRequestError(f"{n} prompts but {len(seed)} seeds")
        return list(seed)
    check_seed(seed)
    return [seed] * n


def generate_batch(prompts: Sequence[Prompt], specs: Any | Sequence[Any], *, runtime: DiffusionRuntime | None = None,
                   seed: int | Sequence[int] | None = 0, temperature: float | None = None, top_p: float | None = None,
                   return_exceptions: bool = False, row_stop: Sequence[Callable[[], bool] | None] | None = None,
                   options: GenerateOptions | None = None, **knobs: Any) -> list[Any]:
    """Constrained generation for many prompts in one batched canvas loop; each row has its own
    constraint (``specs`` is one spec for all rows or one per row). The batch is continuous in every
    mode (:func:`dgemma_struct.scheduling.run.run_sessions`): a row leaves it as soon as it finishes,
    and a row that fails validation is repaired by a new row joining the running batch (the AR
    fallback too, in an AR batch); ``logprobs`` are recorded per row. Returns :class:`GenerationResult` objects (or, with
    ``return_exceptions=True``, the typed error in a failed row's place).

    ``seed``: one seed for every row, one per row, or ``None`` (a fresh seed per row). Every row
    draws from its own generator, so a row's output is what :func:`generate` gives for its prompt
    and seed alone, whichever rows share its batch. (``options.seed`` is not used here.)
    ``temperature`` / ``top_p``: ``None`` takes ``options``' value.

    ``row_stop``: per prompt, an optional callable polled every denoising step; when it returns
    True that row is dropped at once (a server's caller timed out or disconnected) and its place
    holds a :class:`~dgemma_struct.errors.GenerationTimeout`, without holding up the batch.

    Other knobs (keywords or ``options``): as in :func:`generate`, for every row (not ``n`` or
    ``return_details``)."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise InvalidRequestError(f"prompts must be a list, got {type(prompts).__name__}")
    if not isinstance(specs, (list, tuple)):
        specs = [specs] * len(prompts)
    if len(specs) != len(prompts):
        raise InvalidRequestError(f"{len(prompts)} prompts but {len(specs)} specs")
    seeds = _row_seeds(seed, len(prompts))
    if not isinstance(return_exceptions, bool):
        raise InvalidRequestError(f"return_exceptions must be a bool, got {return_exceptions!r}")
    if row_stop is not None and (not isinstance(row_stop, Sequence) or isinstance(row_stop, (str, bytes))):
        raise InvalidRequestError(f"row_stop must be a list of callables (or None), not {type(row_stop).__name__}")
    if row_stop is not None and len(row_stop) != len(prompts):
        raise InvalidRequestError(f"{len(prompts)} prompts but {len(row_stop)} row_stop entries")
    if row_stop is not None and not all(f is None or callable(f) for f in row_stop):
        raise InvalidRequestError("row_stop entries must be callables returning a bool, or None")
    if not prompts:
        return []
    sampling = {k: v for k, v in (("temperature", temperature), ("top_p", top_p)) if v is not None}
    opts = GenerateOptions.build(options, {**knobs, **sampling}, verb="generate_batch",
                                 allowed=_BATCH_KNOBS + ("temperature", "top_p"))
    rt = resolve_runtime(runtime)
    out: list[Any] = []
    for p, s, sd in zip(prompts, specs, seeds):
        try:
            out.append(prepare(p, s, rt, opts.with_overrides(seed=sd)))
        except DgemmaStructError as err:
            if not return_exceptions:
                raise
            out.append(err)
    live = [i for i, s in enumerate(out) if isinstance(s, RepairSession)]
    if not live:
        return out
    sessions: list[RepairSession] = [out[i] for i in live]
    stops = [row_stop[i] for i in live] if row_stop is not None else None
    for i, res in zip(live, run_sessions(rt, sessions, stops)):
        if isinstance(res, DgemmaStructError) and not return_exceptions:
            raise res
        out[i] = res
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


class Generator:
    """A spec compiled once for a runtime, with its options; call it on prompts.

    ``Generator(runtime, spec, options=None, **knobs)``: ``runtime`` ``None`` is the default
    runtime; the knobs are :class:`~dgemma_struct.options.GenerateOptions` fields. Each call may
    override knobs again (``strict``, ``whitespace`` and ``separators`` are fixed at compile time).

    Example::

        >>> from dgemma_struct import Generator, Regex
        >>> from dgemma_struct.testing import tiny_runtime
        >>> digits = Generator(tiny_runtime(), Regex(r"[0-9]{3}"), max_new_tokens=16)
        >>> len(digits("Three digits?"))
        3
    """

    def __init__(self, runtime: DiffusionRuntime | None, spec: Any, options: GenerateOptions | None = None,
                 **knobs: Any):
        self.runtime = resolve_runtime(runtime)
        self.options = GenerateOptions.build(options, knobs, verb="Generator")
        if spec is None:
            raise InvalidRequestError("spec is None: pass a pydantic model, a JSON Schema, Regex, Grammar or Choice")
        o = self.options
        self.constraint = constraint_for(spec, self.runtime, strict=o.strict, whitespace=o.whitespace,
                                         separators=o.separators, strict_objects=o.strict_objects,
                                         bounded_numbers=o.bounded_numbers,
                                         field_budget=o.max_new_tokens if o.field_budget else None)

    def __call__(self, prompt: Prompt, **knobs: Any) -> Any:
        """The value for ``prompt`` (a list of ``n`` values, or results, as :func:`generate`)."""
        return generate(prompt, self.constraint, runtime=self.runtime, options=self.options, **knobs)

    def batch(self, prompts: Sequence[Prompt], *, return_exceptions: bool = False, **knobs: Any) -> list[Any]:
        """Values for many prompts in one batched loop (results with ``return_details``; the typed
        error in a failed row's place with ``return_exceptions``)."""
        details = knobs.pop("return_details", self.options.return_details)
        results = generate_batch(prompts, self.constraint, runtime=self.runtime, seed=knobs.pop("seed", self.options.seed),
                                 return_exceptions=return_exceptions, options=self.options, **knobs)
        return results if details else [r.value if isinstance(r, GenerationResult) else r for r in results]

    def stream(self, prompt: Prompt, **knobs: Any) -> Iterator[CanvasEvent]:
        """Events of one streamed run (see :func:`~dgemma_struct.streaming.stream`)."""
        return stream(prompt, self.constraint, runtime=self.runtime, options=self.options, **knobs)

    async def acall(self, prompt: Prompt, **knobs: Any) -> Any:
        """``self(prompt)`` in a worker thread, for event loops."""
        return await asyncio.to_thread(self, prompt, **knobs)
