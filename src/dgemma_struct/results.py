"""Result and statistics objects returned by the runtime and the constrained API."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class GenerationStats:
    """Counters of one generation (one row of a batch).

    ``tokens_per_forward`` is computed as transformers defines it: generated non-pad tokens divided
    by the decoder forward passes this row took part in (AR mode: tokens per encoder step); the
    constrained API counts the accepted tokens plus the stop token instead. ``other_s`` (:meth:`set_wall`) is
    ``wall_s - model_s`` (at least 0). Both stay stored fields: they are constructor arguments, and
    the two ``tokens_per_forward`` formulas give different numbers.
    """

    mode: str = "diffusion"
    forward_passes: int = 0
    generated_tokens: int = 0
    tokens_per_forward: float = 0.0
    canvases: int = 0
    denoising_steps: int = 0
    wall_s: float = 0.0
    model_s: float = 0.0
    other_s: float = 0.0
    mask_s: float = 0.0
    forced_tokens: int = 0
    repairs: int = 0
    junk_repairs: int = 0
    fallback: bool = False
    budget_closing: bool = False  # the output was steered to close near the end of its token budget
    finish_reason: str = "stop"   # "stop", "length" (free text cut at max_new_tokens) or "error"
    seed: int | None = None       # the seed this row's draws came from (None: torch's global RNG)

    def set_wall(self, wall_s: float) -> None:
        """Record the wall time and what of it was not the model's (``other_s``, at least 0).

            >>> s = GenerationStats(model_s=0.25); s.set_wall(1.0); s.other_s
            0.75
        """
        self.wall_s = wall_s
        self.other_s = max(0.0, wall_s - self.model_s)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TopLogprob:
    """One alternative at an output position: a token id, its log-probability, its text and bytes."""

    token_id: int
    logprob: float
    token: str = ""
    bytes: tuple[int, ...] = ()


@dataclass(frozen=True)
class TokenLogprob:
    """The log-probability of one output token (``logprobs=`` knob; docs/server.md, "Logprobs").

    ``logprob``: the natural log of the token's probability under the distribution it was chosen
    from: the step's temperature-scaled logits at its position, restricted to the tokens the
    constraint allows after the tokens before it (the mask), renormalised. A token the grammar
    forced (one allowed choice, written without sampling) has ``forced=True`` and ``logprob`` 0.0.
    ``top_logprobs``: the ``k`` most likely allowed tokens under that same distribution.
    ``-inf`` is reported as ``-9999.0`` (JSON has no infinity). ``bytes``: the token's UTF-8 bytes
    (a byte-fallback piece such as ``<0xE2>``: that byte, its ``token`` text being ``"\ufffd"``)."""

    token_id: int
    logprob: float
    top_logprobs: tuple[TopLogprob, ...] = ()
    token: str = ""
    forced: bool = False
    bytes: tuple[int, ...] = ()


@dataclass
class GenerationResult:
    """``text`` and ``token_ids`` are the generated continuation (prompt excluded, special
    tokens and padding removed from ``text``); ``value`` is set by the constrained API.
    ``reasoning``: with ``thinking=``, the model's thought (never part of ``text`` or ``value``).
    ``logprobs``: with ``logprobs=k``, one :class:`TokenLogprob` per entry of ``token_ids``.

    ``confidence``: with ``confidence=True``, per-field confidence: the JSON Pointer of each leaf
    value of a JSON output (``"/name"``, ``"/lines/0/sku"``; ``""`` for a scalar root and for the
    whole output of a regex / grammar / choice constraint) -> the probability, in [0, 1], that the
    model gives *that exact value* under the constraint: the product of the probabilities of the
    tokens that wrote it, each renormalised over the tokens the constraint allowed at the step it
    was committed (a grammar-forced token counts as 1). An enum / boolean / choice value is so the
    probability of the chosen option among the allowed ones. ``None`` unless asked for. Definition,
    limits and calibration: docs/confidence.md (:mod:`dgemma_struct.repair.field_confidence`)."""

    text: str
    token_ids: list[int]
    stats: GenerationStats = field(default_factory=GenerationStats)
    value: Any = None
    reasoning: str | None = None
    logprobs: list[TokenLogprob] | None = None
    confidence: dict[str, float] | None = None

    def low_confidence(self, threshold: float = 0.5) -> list[str]:
        """The pointers whose confidence is below ``threshold`` (fields to review), least confident
        first; empty when no confidence was computed.

        >>> r = GenerationResult(text="", token_ids=[], confidence={"/name": 0.98, "/age": 0.31, "/x": 0.2})
        >>> r.low_confidence(), r.low_confidence(0.25)
        (['/x', '/age'], ['/x'])
        """
        if not self.confidence:
            return []
        return [k for k, p in sorted(self.confidence.items(), key=lambda kv: kv[1]) if p < threshold]

    def to_dict(self) -> dict[str, Any]:
        value = self.value.model_dump() if hasattr(self.value, "model_dump") else self.value
        out = {"text": self.text, "token_ids": self.token_ids, "value": value, "reasoning": self.reasoning,
               "stats": self.stats.to_dict()}
        if self.logprobs is not None:
            out["logprobs"] = [asdict(e) for e in self.logprobs]
        if self.confidence is not None:
            out["confidence"] = dict(self.confidence)
        return out


@dataclass
class CanvasEvent:
    """One streamed event: a committed canvas (``draft=False``) or a denoising draft.

    ``value``: for a constrained JSON stream, the partial value parsed so far (a partial pydantic
    instance for a pydantic schema); on the final event the validated value. ``validated`` is True
    only on that final event: every earlier value is a draft, never checked against the schema.
    The final event (``done=True``) carries ``finish_reason``, ``stats`` and, when asked for,
    the result's per-field ``confidence``."""

    row: int
    canvas_index: int
    token_ids: list[int]
    text: str
    draft: bool = False
    done: bool = False
    value: Any = None
    validated: bool = False
    finish_reason: str | None = None
    stats: GenerationStats | None = None
    confidence: dict[str, float] | None = None

    @classmethod
    def final(cls, result: GenerationResult, *, validated: bool, value: Any = None) -> "CanvasEvent":
        """The last event of a stream, from its finished ``result`` (the one place it is built).

        >>> ev = CanvasEvent.final(GenerationResult(text="7", token_ids=[9]), validated=True, value=7)
        >>> ev.done, ev.canvas_index, ev.value
        (True, 0, 7)
        """
        return cls(row=0, canvas_index=max(0, result.stats.canvases - 1), token_ids=result.token_ids,
                   text=result.text, done=True, value=value, validated=validated,
                   finish_reason=result.stats.finish_reason, stats=result.stats, confidence=result.confidence)


@dataclass(frozen=True)
class ChoiceResult:
    """``generate_choice(..., return_probabilities=True)``: the generated option (or its
    :class:`GenerationResult` with ``return_details=True``) and every option's probability
    (``{option: p}`` in the order given, summing to 1; see :mod:`dgemma_struct.choice_scores`)."""

    value: Any
    probabilities: dict[str, float]
