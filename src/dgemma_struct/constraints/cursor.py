"""A matcher moved between states by rollback and consume instead of copies.

An ``llguidance.LLMatcher``'s ``deep_copy`` copies its whole history: O(output length). Its
``rollback`` and ``consume_tokens`` cost O(tokens moved). A :class:`MatcherCursor` keeps one matcher
at a base state plus a plan and moves it from plan to plan through their common prefix, so a search
from a long output's frozen state costs what its plans cost, not a copy of the output per node.
"""
from __future__ import annotations

from typing import Any, Sequence

from dgemma_struct.errors import ConstraintEngineError

__all__ = ["MatcherCursor", "StaleMaskError", "common_prefix", "move_matcher"]


class StaleMaskError(ConstraintEngineError):
    """A matcher refused a token its own mask allowed. llguidance 1.9.1 does this after a rollback:
    a mask computed in a state, the matcher rolled back past it and moved to another, the new
    state's mask can still allow a token of the first (``{"b":"`` then ``{"a":"`` with only ``b``
    required: ``"}`` stays allowed after ``a``, and ``try_consume_tokens`` refuses it; a fresh
    matcher's mask is exact). Callers rebuild the matcher from its tokens and try once more.
    Consuming is exact, so a value is never wrong for it, only the search for one is misled."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token lists.

    >>> common_prefix([1, 2, 3], [1, 2, 4, 5])
    2
    """
    p, lim = 0, min(len(a), len(b))
    while p < lim and a[p] == b[p]:
        p += 1
    return p


def move_matcher(m: Any, old: Sequence[int], new: Sequence[int]) -> bool:
    """Move matcher ``m`` from ``base + old`` to ``base + new`` (rollback to the common prefix, then
    consume the rest). False when it could not (``m`` is then in an unknown state: rebuild it)."""
    p = common_prefix(old, new)
    if m.is_error() or (p < len(old) and not m.rollback(len(old) - p)):
        return False
    rest = [int(t) for t in new[p:]]
    return not rest or (m.try_consume_tokens(rest) == len(rest) and not m.is_error())


class MatcherCursor:
    """A matcher at a base state plus ``plan`` (the tokens it consumed since), moved between plans by
    rollback to the common prefix and consumption of the rest: O(tokens moved), where a
    ``deep_copy`` per state costs O(length of the whole output). ``m``: the matcher (call its
    read-only methods; move it only through :meth:`goto` / :meth:`advance`). A refused token leaves it
    where it was. ``dirty``: a stop token was consumed or the engine failed (a stop token's rollback
    is not exact), so the base state cannot be restored by rollback."""

    __slots__ = ("m", "plan", "dirty", "_stops")

    def __init__(self, matcher: Any, stops: frozenset = frozenset()):
        self.m = matcher
        self.plan: list[int] = []
        self.dirty = False
        self._stops = stops

    def goto(self, plan: Sequence[int]) -> bool:
        """Move to ``base + plan``; False (the cursor at the common prefix, or dirty) when the
        grammar refuses a token of ``plan``."""
        cur = self.plan
        p = common_prefix(cur, plan)
        if p < len(cur):
            if self.dirty or not self.m.rollback(len(cur) - p):
                self.dirty = True
                return False
            del cur[p:]
        return self.advance(list(plan[p:]))

    def advance(self, tokens: Sequence[int]) -> bool:
        """Consume ``tokens``; False (nothing consumed) when the grammar refuses one of them."""
        tokens = [int(t) for t in tokens]
        if not tokens:
            return True
        if self.dirty:
            return False
        n = self.m.try_consume_tokens(tokens)
        if n < len(tokens):
            if self.m.is_error() or (n and not self.m.rollback(n)):
                self.dirty = True
            return False
        self.plan.extend(tokens)
        if self._stops and any(t in self._stops for t in tokens):
            self.dirty = True
        return True

    def restore(self) -> bool:
        """Back to the base state; False when it cannot be restored (the matcher must be rebuilt)."""
        if self.plan:
            self.goto([])
        return not self.dirty and not self.plan and not self.m.is_error()
