"""Token logprobs on the wire: OpenAI's chat ``choices[i].logprobs = {"content": [...]}`` and the
legacy completions ``{tokens, token_logprobs, top_logprobs, text_offset}``, built from the SDK's
:class:`~dgemma_struct.results.TokenLogprob` entries (what a logprob means: :mod:`dgemma_struct.engine.token_logprobs`).

Example::

    >>> from dgemma_struct.results import TokenLogprob, TopLogprob
    >>> e = TokenLogprob(5, -0.5, (TopLogprob(5, -0.5, "hi"),), token="hi")
    >>> chat_logprobs([e])["content"][0]["bytes"]
    [104, 105]
    >>> completion_logprobs([e, e], base=3)["text_offset"]
    [3, 5]
"""
from __future__ import annotations

from typing import Any, Sequence

from dgemma_struct.results import TokenLogprob

__all__ = ["chat_logprobs", "completion_logprobs", "cut_to", "delta_groups"]


def _bytes(e: Any) -> list[int]:
    return list(e.bytes) if e.bytes else list(e.token.encode("utf-8", errors="surrogatepass"))


def chat_logprobs(entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    """``{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}], "refusal": None}``."""
    return {"content": [{"token": e.token, "logprob": e.logprob, "bytes": _bytes(e),
                         "top_logprobs": [{"token": a.token, "logprob": a.logprob, "bytes": _bytes(a)}
                                          for a in e.top_logprobs]} for e in entries],
            "refusal": None}


def completion_logprobs(entries: Sequence[TokenLogprob], *, base: int = 0) -> dict[str, Any]:
    """The legacy completions object; ``text_offset`` counts characters from ``base``. With
    ``logprobs=0`` each ``top_logprobs`` dict holds the chosen token (as vLLM answers)."""
    offsets, at = [], base
    for e in entries:
        offsets.append(at)
        at += len(e.token)
    return {"tokens": [e.token for e in entries], "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{a.token: a.logprob for a in e.top_logprobs} or {e.token: e.logprob} for e in entries],
            "text_offset": offsets}


def cut_to(entries: Sequence[TokenLogprob], text: str) -> list[TokenLogprob]:
    """The entries of the tokens that start inside ``text`` (the output cut at a stop sequence)."""
    out, at = [], 0
    for e in entries:
        if at >= len(text):
            break
        out.append(e)
        at += len(e.token)
    return out


def delta_groups(entries: Sequence[TokenLogprob], text: str, size: int) -> list[tuple[str, list[TokenLogprob], int]]:
    """``text`` split at token boundaries into deltas of about ``size`` characters: ``(delta text,
    its entries, its character offset)``. The deltas concatenate to ``text`` exactly (a token's
    text is taken from ``text`` by its offset; the last delta takes the rest)."""
    groups: list[tuple[str, list[TokenLogprob], int]] = []
    start = end = 0
    pending: list[TokenLogprob] = []
    for e in entries:
        pending.append(e)
        end += len(e.token)
        if end - start >= size:
            groups.append((text[start:min(end, len(text))], pending, start))
            start, pending = min(end, len(text)), []
    if pending or start < len(text):
        groups.append((text[start:], pending, start))
    return groups
