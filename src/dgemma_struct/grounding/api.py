"""Grounded extraction, the verbs: :func:`generate_grounded`, :func:`generate_grounded_batch` and
their :class:`GroundedResult`, and the ``dgemma-struct demo`` text."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from dgemma_struct.api import generate, generate_batch
from dgemma_struct.errors import DgemmaStructError, GenerationFailed, InvalidRequestError, PromptTooLongError
from dgemma_struct.grounding.constraint import GroundedConstraint, compile_grounded
from dgemma_struct.grounding.render import render_html
from dgemma_struct.grounding.sources import GroundedSpan, grounded_sources, prompt_with_sources
from dgemma_struct.options import GenerateOptions
from dgemma_struct.prompts import chat_messages
from dgemma_struct.repair.preparation import resolve_runtime


@dataclass
class GroundedResult:
    """A grounded extraction: ``value`` (pydantic instance or JSON value), ``spans`` (one
    :class:`GroundedSpan` per grounded value), ``sources`` (the documents), ``text``, ``stats``;
    with ``confidence=True``, ``confidence`` (JSON Pointer of each leaf -> probability, as
    :attr:`GenerationResult.confidence <dgemma_struct.results.GenerationResult>`)."""

    value: Any
    spans: list[GroundedSpan]
    sources: tuple[str, ...]
    text: str = ""
    stats: Any = None
    json_value: Any = None
    confidence: dict[str, float] | None = None

    def to_dict(self) -> dict:
        """JSON-ready ``{"value", "spans", "sources"}`` (what a server returns in its extension field),
        with ``"confidence"`` when it was computed."""
        v = self.value.model_dump(mode="json") if hasattr(self.value, "model_dump") else self.value
        out = {"value": v, "spans": [s.to_dict() for s in self.spans], "n_sources": len(self.sources)}
        if self.confidence is not None:
            out["confidence"] = dict(self.confidence)
        return out

    def to_html(self, *, title: str | None = None, full_page: bool = True) -> str:
        """The source documents with every grounded span highlighted and labelled by its field."""
        return render_html(self.sources, self.spans, value=self.json_value, title=title, full_page=full_page)


def _prepare(prompt: Any, schema: Any, runtime: Any, *, source: Any, ground: str | None, granularity: str,
             max_new_tokens: int, strict: bool) -> tuple[Any, GroundedConstraint]:
    GenerateOptions(max_new_tokens=max_new_tokens, strict=strict)   # bad knobs: typed errors, before any work
    chat_messages(prompt, max_context=runtime.max_context)          # neither text nor chat messages: the same
    docs = grounded_sources(prompt, source)
    full = prompt_with_sources(prompt, docs) if source is not None else prompt
    ids = runtime.encode_prompt(full)
    if len(ids) + max_new_tokens > runtime.max_context:
        raise PromptTooLongError(f"the prompt with its grounding source is {len(ids)} tokens; with max_new_tokens="
                                 f"{max_new_tokens} it exceeds the model's context of {runtime.max_context} tokens")
    c = compile_grounded(schema, runtime.tokenizer, source=docs, ground=ground, granularity=granularity,
                         stop_token_ids=runtime.eos_token_ids,
                         vocab_size=runtime.model.config.text_config.vocab_size, strict=strict)
    return full, c


def _result(res: Any, c: GroundedConstraint) -> GroundedResult:
    raw = json.loads(res.text)
    spans, issues = c.locate(raw)
    if issues:  # validate_text already refused such outputs; never hand one back as success
        raise GenerationFailed("a grounded value is not in the source: " + "; ".join(map(str, issues)),
                               errors=[str(i) for i in issues], partial_text=res.text, stats=res.stats)
    return GroundedResult(value=res.value, spans=spans, sources=c.sources, text=res.text, stats=res.stats,
                          json_value=raw, confidence=res.confidence)


def generate_grounded(prompt: Any, schema: Any, *, source: str | Sequence[str] | None = None,
                      ground: str | None = None, granularity: str = "words", runtime: Any = None,
                      max_new_tokens: int = 128, strict: bool = False, **opts: Any) -> GroundedResult:
    """Grounded extraction: like :func:`dgemma_struct.generate_json`, but grounded fields (see the
    package docstring) only take spans / numbers of ``source`` (default: the prompt's text; a source
    not already in the prompt is appended to it). Other options (``mode``, ``seed``,
    ``max_repairs``, ``fallback``, ``timeout_s`` ...) are :func:`dgemma_struct.generate`'s.
    Returns a :class:`GroundedResult` with ``.value``, ``.spans`` and ``.to_html()``."""
    rt = resolve_runtime(runtime)
    full, c = _prepare(prompt, schema, rt, source=source, ground=ground, granularity=granularity,
                       max_new_tokens=max_new_tokens, strict=strict)
    opts.pop("return_details", None)
    res = generate(full, c, runtime=rt, max_new_tokens=max_new_tokens, return_details=True, **opts)
    return _result(res, c)


def generate_grounded_batch(prompts: Sequence[Any], schema: Any, *, sources: Sequence[Any] | None = None,
                            ground: str | None = None, granularity: str = "words", runtime: Any = None,
                            max_new_tokens: int = 128, strict: bool = False, return_exceptions: bool = False,
                            **opts: Any) -> list[Any]:
    """:func:`generate_grounded` for many prompts in one batched canvas loop (``schema``: one for all
    or one per prompt; ``sources``: one per prompt, None entries meaning the prompt's text). With
    ``return_exceptions=True`` a failed row holds its typed error."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise InvalidRequestError(f"prompts must be a list, got {type(prompts).__name__}")
    rt = resolve_runtime(runtime)
    n = len(prompts)
    schemas = list(schema) if isinstance(schema, (list, tuple)) else [schema] * n
    srcs = list(sources) if sources is not None else [None] * n
    if len(schemas) != n or len(srcs) != n:
        raise InvalidRequestError(f"{n} prompts but {len(schemas)} schemas and {len(srcs)} sources")
    prepared: list[Any] = []
    for p, s, src in zip(prompts, schemas, srcs):
        try:
            prepared.append(_prepare(p, s, rt, source=src, ground=ground, granularity=granularity,
                                     max_new_tokens=max_new_tokens, strict=strict))
        except DgemmaStructError as err:
            if not return_exceptions:
                raise
            prepared.append(err)
    live = [i for i, x in enumerate(prepared) if not isinstance(x, DgemmaStructError)]
    out: list[Any] = list(prepared)
    if live:
        # per-row options (a seed list, row_stop) follow the rows that are still running
        for key in ("seed", "row_stop"):
            if isinstance(opts.get(key), (list, tuple)) and len(opts[key]) == n:
                opts[key] = [opts[key][i] for i in live]
        res = generate_batch([prepared[i][0] for i in live], [prepared[i][1] for i in live], runtime=rt,
                             max_new_tokens=max_new_tokens, return_exceptions=return_exceptions, **opts)
        for i, r in zip(live, res):
            if isinstance(r, DgemmaStructError):
                out[i] = r
                continue
            try:
                out[i] = _result(r, prepared[i][1])
            except DgemmaStructError as err:
                if not return_exceptions:
                    raise
                out[i] = err
    return out


DEMO_PROMPT = ("Extract the name, age and email as JSON.\nTara Zhang is 42 years old and can be reached at "
               "tzhang@post.io.")
DEMO_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                                "email": {"type": "string", "format": "email"}},
               "required": ["name", "age", "email"], "additionalProperties": False}


def demo(runtime: Any = None, *, seed: int = 0, html_path: str | None = None) -> str:
    """Text for ``dgemma-struct demo``: the same extraction schema-constrained only and grounded
    (``ground="all"``), diffusion and AR, with the grounded offsets; optionally writes the HTML
    rendering of the last grounded result to ``html_path``."""
    rt = resolve_runtime(runtime)
    lines = ["grounded extraction: every string is a span of the prompt, every number is written in it",
             f"prompt: {DEMO_PROMPT!r}"]
    res = None
    for mode in ("diffusion", "ar"):
        plain = generate(DEMO_PROMPT, DEMO_SCHEMA, runtime=rt, seed=seed, mode=mode)
        res = generate_grounded(DEMO_PROMPT, DEMO_SCHEMA, ground="all", runtime=rt, seed=seed, mode=mode)
        lines.append(f"  {mode:9s} constrained: {json.dumps(plain)}")
        lines.append(f"  {'':9s} grounded:    {json.dumps(res.json_value)}")
        lines.append(f"  {'':9s} spans:       " + ", ".join(f"{s.pointer}@{s.start}-{s.end}" for s in res.spans))
    if html_path and res is not None:
        with open(html_path, "w", encoding="utf-8") as f:
            f.write(res.to_html(title="dgemma-struct grounded extraction"))
        lines.append(f"  highlighted source: {html_path}")
    return "\n".join(lines)
