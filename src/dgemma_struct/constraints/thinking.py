"""Thinking before a constrained answer: Gemma 4's thought channel in front of any constraint.

With thinking on, DiffusionGemma may (or, when required, must) write
``<|channel>thought\\n…<channel|>`` before its answer. :func:`with_thinking` wraps a compiled
constraint so that the grammar allows that block — the markers only as their single control-token
ids, the thought capped at about ``max_thinking_tokens`` (enforced as ``4 * max_thinking_tokens``
characters) — followed by the constrained answer; validation
strips the thought and checks only the answer. With thinking off the plain constraint is used: it
never allows a control token, so no thought block can start.

Example::

    wrapped = with_thinking(compile_constraint(schema, tokenizer), required=False, max_thinking_tokens=128)
    reasoning, answer = wrapped.split_reasoning(decoded_text)
"""
from __future__ import annotations

import json
from typing import Any

from .constraint import Constraint, ValidationIssue, ValidationOutcome

THOUGHT_OPEN, THOUGHT_CLOSE = "<|channel>", "<channel|>"
THOUGHT_HEADER = "thought\n"
MAX_THINKING_TOKENS = 8192
# The cap is enforced in characters: llguidance cannot roll back a token-capped (``max_tokens``)
# lexeme, and the canvas walker rolls back on every step. 4 characters per token is the usual
# average of SentencePiece text; the request's token budget bounds the total in any case.
CHARS_PER_TOKEN = 4


def _channel_ids(constraint: Constraint, tokenizer: Any) -> tuple[int, int]:
    from dgemma_struct.errors import ConstraintError

    ids = []
    for tok in (THOUGHT_OPEN, THOUGHT_CLOSE):
        try:
            tid = tokenizer.convert_tokens_to_ids(tok)
            ok = isinstance(tid, int) and tid >= 0 and tokenizer.convert_ids_to_tokens(tid) == tok
        except Exception:  # noqa: BLE001 - tokenizers without the methods
            ok = False
        ids.append(tid if ok else None)
    if None in ids:
        raise ConstraintError("thinking needs Gemma 4's thought-channel tokens <|channel> / <channel|>, "
                              "which this tokenizer does not have")
    return int(ids[0]), int(ids[1])


def _grammar_list(grammar: str) -> list[dict[str, Any]]:
    """The sub-grammars of a compiled constraint's llguidance grammar (JSON TopLevelGrammar or Lark)."""
    text = grammar.lstrip()
    if text.startswith("{"):
        top = json.loads(grammar)
        return list(top["grammars"])
    return [{"name": "answer", "lark_grammar": grammar}]


class ThinkingConstraint(Constraint):
    """``inner`` preceded by an optional or required thought block."""

    def __init__(self, inner: Constraint, *, required: bool, max_thinking_tokens: int, open_id: int, close_id: int):
        subs = _grammar_list(inner.grammar)
        name = subs[0].get("name") or "answer"
        subs[0] = {**subs[0], "name": name}
        q = "" if required else "?"
        outer = {"name": "thinking", "lark_grammar": (
            f"start: thought{q} @{name}\n"
            f'thought: <[{open_id}]> {json.dumps(THOUGHT_HEADER)} body <[{close_id}]>\n'
            f"body: /(?s:.{{0,{CHARS_PER_TOKEN * max_thinking_tokens}}})/\n")}
        grammar = json.dumps({"grammars": [outer, *subs]})
        super().__init__(inner.kind, grammar, inner.tokenizer_info, schema=inner.schema,
                         semantic_keywords=inner.semantic_keywords, validator=inner.validator,
                         may_allow_specials=False,
                         description=f"thinking ({'required' if required else 'optional'}) + {inner.description}")
        self.inner = inner
        self.required = required
        self.max_thinking_tokens = max_thinking_tokens
        self._open_id, self._close_id = open_id, close_id
        self.closing_token_ids = (close_id, *getattr(inner, "closing_token_ids", ()))
        self.choices = inner.choices

    def split_reasoning(self, text: str) -> tuple[str | None, str]:
        """``(reasoning, answer)`` of decoded text (special tokens kept); reasoning is None when the
        model wrote no thought block."""
        if text.startswith(THOUGHT_OPEN):
            end = text.find(THOUGHT_CLOSE)
            if end >= 0:
                body = text[len(THOUGHT_OPEN):end]
                if body.startswith(THOUGHT_HEADER):
                    body = body[len(THOUGHT_HEADER):]
                return body, text[end + len(THOUGHT_CLOSE):]
        return None, text

    def tokenize(self, text: str) -> list[int]:
        reasoning, answer = self.split_reasoning(text)
        if reasoning is None:
            return self.inner.tokenize(answer)
        return ([self._open_id] + self.inner.tokenize(THOUGHT_HEADER + reasoning) + [self._close_id]
                + self.inner.tokenize(answer))

    def validate_text(self, text: str) -> ValidationOutcome:
        reasoning, answer = self.split_reasoning(text)
        if reasoning is None and self.required:
            return ValidationOutcome(False, None, [ValidationIssue((), "a thought block is required first")])
        return self.inner.validate_text(answer)

    def matches(self, text: str) -> bool:
        return self.grammar_accepts(text) and self.validate_text(text).ok


def with_thinking(constraint: Constraint, tokenizer: Any, *, required: bool = False,
                  max_thinking_tokens: int = 1024) -> ThinkingConstraint:
    """``constraint`` behind an optional (``required=False``) or required thought block of at most
    ``max_thinking_tokens`` tokens."""
    from dgemma_struct.errors import InvalidRequestError

    if isinstance(max_thinking_tokens, bool) or not isinstance(max_thinking_tokens, int) or \
            not 1 <= max_thinking_tokens <= MAX_THINKING_TOKENS:
        raise InvalidRequestError(f"max_thinking_tokens must be an integer in [1, {MAX_THINKING_TOKENS}], "
                                  f"got {max_thinking_tokens!r}")
    if isinstance(constraint, ThinkingConstraint):
        constraint = constraint.inner
    open_id, close_id = _channel_ids(constraint, tokenizer)
    return ThinkingConstraint(constraint, required=required, max_thinking_tokens=max_thinking_tokens,
                              open_id=open_id, close_id=close_id)
