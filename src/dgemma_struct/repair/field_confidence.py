"""Per-field confidence (``confidence=True``): for every leaf value of an output, the probability
the model gave that exact value under the constraint, from the token log-probabilities the guide
already records (:mod:`dgemma_struct.engine.token_logprobs`) — no extra forward pass.

Definition. A token's probability is the one it was committed from: the step's logits at its
position, restricted to the tokens the constraint allowed after the tokens committed before it,
renormalised (a grammar-forced token: 1). The tokens of a value are those whose characters overlap
it (quotes included; for a number also the token that ended it, which decided that no digit
followed). The value's confidence is the **product** of their probabilities: the probability of the
whole value under the sequential factorisation the decoder committed it in (left to right in commit
order, each factor conditioned on what was committed before). An enum / boolean / choice value is
so the probability of the chosen option among the allowed ones: its first non-forced token decides
it and the forced rest counts 1. The product was measured against the minimum and the geometric
mean of the token probabilities (benchmarks/calibration.py, docs/confidence.md).

Pointers are JSON Pointers (RFC 6901) of the leaves of a JSON output (scalars and empty
containers); ``""`` is a scalar root, and the whole output of a constraint without a schema
(regex, grammar, choice, tool calls).

Example::

    >>> from dgemma_struct.results import TokenLogprob
    >>> pieces = ['{"', 'a', '":', '"x', 'y', '",', '"b', '":', 'true', '}']
    >>> lps = [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, 0.0, 0.0, -0.05, 0.0]
    >>> conf = confidence_of(''.join(pieces), pieces, lps, json_output=True)
    >>> {k: round(v, 3) for k, v in conf.items()}
    {'/a': 0.741, '/b': 0.951}
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from dgemma_struct.constraints.json_locate import pointer, value_spans
from dgemma_struct.results import GenerationResult

__all__ = ["pointer", "leaf_spans", "token_spans", "field_token_logprobs", "confidence_of", "COMBINE",
           "attach_confidence"]


def leaf_spans(answer: str) -> dict[str, tuple[int, int]]:
    """``pointer -> (start, end)`` characters of every leaf value of the JSON text ``answer``
    (scalars and empty containers). A number's span takes the character after it too (the one that
    ended it), when there is one.

    >>> leaf_spans('{"a":[1,"b"],"c":{}}')
    {'/a/0': (6, 8), '/a/1': (8, 11), '/c': (17, 19)}
    """
    spans, _ = value_spans(answer)
    parents = {path[:-1] for path in spans if path}
    out: dict[str, tuple[int, int]] = {}
    for path, (start, end) in spans.items():
        if end < 0 or path in parents:   # unfinished, or a container with members
            continue
        if answer[start] in "-0123456789" and end < len(answer):
            end += 1
        out[pointer(path)] = (start, end)
    return out


def token_spans(pieces: Sequence[str]) -> list[tuple[int, int]]:
    """``(start, end)`` characters of each token of the concatenated ``pieces``.

    >>> token_spans(["ab", "", "c"])
    [(0, 2), (2, 2), (2, 3)]
    """
    out, pos = [], 0
    for p in pieces:
        out.append((pos, pos + len(p)))
        pos += len(p)
    return out


def field_token_logprobs(text: str, pieces: Sequence[str], logprobs: Sequence[float], *, json_output: bool,
                         skip: int = 0) -> dict[str, list[float]]:
    """``pointer -> the logprobs of the tokens that wrote the value``. ``text``: the answer (what is
    parsed), ``pieces``: the decoded tokens, whose concatenation is ``skip`` characters of thought
    followed by ``text``; ``logprobs``: one per piece. ``json_output=False``: one field, ``""``, the
    whole answer."""
    spans = leaf_spans(text) if json_output else {"": (0, len(text))}
    toks = token_spans(pieces)
    out: dict[str, list[float]] = {}
    for ptr, (s, e) in spans.items():
        s, e = s + skip, e + skip
        out[ptr] = [lp for (a, b), lp in zip(toks, logprobs) if a < e and b > s]
    return out


def _product(lps: list[float]) -> float:
    return math.exp(sum(lps))


def _minimum(lps: list[float]) -> float:
    return math.exp(min(lps, default=0.0))


def _geometric_mean(lps: list[float]) -> float:
    return math.exp(sum(lps) / len(lps)) if lps else 1.0


#: the ways of combining a value's token probabilities compared in benchmarks/calibration.py;
#: ``"product"`` is the one shipped (docs/confidence.md)
COMBINE: dict[str, Callable[[list[float]], float]] = {"product": _product, "min": _minimum,
                                                      "geomean": _geometric_mean}


def confidence_of(text: str, pieces: Sequence[str], logprobs: Sequence[float], *, json_output: bool,
                  skip: int = 0, combine: str = "product") -> dict[str, float]:
    """``pointer -> confidence in [0, 1]`` (see the module docstring); arguments as
    :func:`field_token_logprobs`."""
    how = COMBINE[combine]
    fields = field_token_logprobs(text, pieces, logprobs, json_output=json_output, skip=skip)
    return {ptr: min(1.0, max(0.0, how(lps))) for ptr, lps in fields.items()}


def _pieces(tokenizer: Any, result: GenerationResult) -> tuple[list[str], int]:
    """Each token's text, cut so that they add up to the decoded output, and the characters of
    thought before the answer. The entries' own texts are used when they add up (a byte-fallback
    token decodes alone to U+FFFD: then each cut is where the decoded prefix ends)."""
    tokens = result.token_ids
    pieces = [e.token for e in result.logprobs]
    joined = "".join(pieces)
    if len(pieces) == len(tokens) and "\ufffd" not in joined and joined.endswith(result.text):
        return pieces, len(joined) - len(result.text)
    full = tokenizer.decode(tokens, skip_special_tokens=False)
    ends = [len(tokenizer.decode(list(tokens[:k + 1]), skip_special_tokens=False)) for k in range(len(tokens))]
    return [full[a:b] for a, b in zip([0] + ends[:-1], ends)], len(full) - len(result.text)


def attach_confidence(result: GenerationResult, tokenizer: Any, *, json_output: bool,
                      drop_logprobs: bool = False) -> GenerationResult:
    """``result`` with its ``confidence`` filled from its recorded token logprobs (``json_output``:
    the answer is a JSON value, one confidence per leaf; else one for the whole text).
    ``drop_logprobs``: the entries were recorded only for this (the caller asked for none), and go.
    :meth:`~dgemma_struct.repair.session.RepairSession.finish` calls it for a session that asked."""
    if result.logprobs is None:
        return result
    pieces, skip = _pieces(tokenizer, result)
    result.confidence = confidence_of(result.text, pieces, [e.logprob for e in result.logprobs],
                                      json_output=json_output, skip=skip)
    if drop_logprobs:
        result.logprobs = None
    return result
