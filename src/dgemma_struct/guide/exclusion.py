"""The exclusion rule of a repair row: values that validation rejected cannot be written again.

A repair renoises from the rejected value; if nothing stopped it, the model would often write the
same value again (measured: ``issued: 0000-…`` three times, then :class:`GenerationFailed`). So
each rejected value becomes a :class:`~dgemma_struct.constraints.json_locate.Ban` (a JSON path and
the value's bytes), and every row of the request's later attempts (repairs and the AR fallback)
carries an :class:`Exclusion` of all its bans. The rule is checked on bytes, not sampled around:

* **masks** -- at a position where the value at a banned path is open (or about to start) and its
  bytes so far are a prefix of the banned text, the tokens whose bytes complete that text are
  removed from the mask (for a string, object or array the text ends at its own closing byte, so
  that is every token starting with the rest of it; for a number or literal only once a byte that
  cannot continue it follows, so ``12`` stays allowed on the way to ``123``, and after exactly
  ``12`` the tokens that would end it -- and EOS -- are removed). Tokens come from a
  sorted index of the vocabulary's bytes: one binary search per rule and position.
* **commits** -- every token a row commits (sampled, forced, greedy fill, closing plan) is
  scanned byte by byte (:class:`~dgemma_struct.constraints.json_scan.JsonScan`); the commit stops
  before the first token that would complete a banned value. This is exact where the masks are
  not (a token that both opens and completes a value, e.g. ``:"x"``), so nothing banned is ever
  committed; a position where the rule leaves no token is a dead end, repaired as one.

The rule compares the text as written (the constraint writes JSON compactly: one spelling per
value); the path, not the position, keys it, so it holds from any kept prefix, in every attempt.

Example::

    >>> from dgemma_struct.constraints.json_locate import Ban
    >>> ex = Exclusion([Ban(("d",), b'"x"')], TokenBytes.of_texts([b'{"d":', b'"x"', b'"y"', b'"', b'x', b'}']))
    >>> ex.admissible([0], [1, 5])            # '"x"' would write the banned value
    0
    >>> ex.admissible([0], [3, 4, 3])         # '"', 'x', '"': the closing quote is refused
    2
    >>> ex.admissible([0], [3, 4, 4, 3, 5])   # "xx" is another value
    5
"""
from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from typing import Any, Callable, Sequence

import numpy as np

from dgemma_struct.constraints.json_locate import Ban, char_to_token_index
from dgemma_struct.constraints.json_scan import SCALAR_BYTES, JsonScan

__all__ = ["ExcludedAR", "Exclusion", "TokenBytes", "dead_end_ban", "sharpen"]

_CACHE: "OrderedDict[tuple, TokenBytes]" = OrderedDict()
_LOCK = threading.Lock()


class TokenBytes:
    """Every token's bytes, and the non-special tokens sorted by their bytes (the tokens starting
    with some bytes are one range of that order). Built once per tokenizer (:meth:`of`)."""

    def __init__(self, token_bytes: Sequence[bytes], specials: frozenset[int] = frozenset(),
                 stops: Sequence[int] = (), width: int | None = None):
        self.bytes = list(token_bytes)
        self.stops = frozenset(stops)
        self.n_words = ((width or len(self.bytes)) + 31) // 32
        order = sorted((t for t, b in enumerate(self.bytes) if b and t not in specials), key=self.bytes.__getitem__)
        self.single: dict[int, int] = {}   # byte value -> a token of exactly that byte
        for t in order:
            if len(self.bytes[t]) == 1:
                self.single.setdefault(self.bytes[t][0], t)
        self._keys = [self.bytes[t] for t in order]
        self._ids = order
        # tokens whose first byte continues a number or literal (what stays allowed right after one)
        self.continues = _mask_of([t for t in order if self.bytes[t][0] in SCALAR_BYTES], self.n_words)
        self._rows: "OrderedDict[tuple, np.ndarray]" = OrderedDict()

    @classmethod
    def of(cls, info: Any) -> "TokenBytes":
        """The index of a :class:`~dgemma_struct.constraints.tokenizer.TokenizerInfo` (cached)."""
        key = (id(info.lltok), info.vocab_size, tuple(info.stop_token_ids))
        with _LOCK:
            hit = _CACHE.get(key)
            if hit is not None:
                _CACHE.move_to_end(key)
                return hit
        lltok = info.lltok
        n = int(lltok.vocab_size)
        tb = cls([lltok.decode_bytes([t]) for t in range(n)], frozenset(info.special_token_ids),
                 info.stop_token_ids, info.vocab_size)
        with _LOCK:
            _CACHE[key] = tb
            while len(_CACHE) > 4:
                _CACHE.popitem(last=False)
        return tb

    @classmethod
    def of_texts(cls, texts: Sequence[bytes]) -> "TokenBytes":
        """An index over a toy vocabulary (tests and examples)."""
        return cls(texts)

    def starting_with(self, rest: bytes, delimited: bool) -> np.ndarray:
        """The bitmask of the tokens that would complete a banned text whose ``rest`` is unwritten
        (``delimited``: a byte that cannot continue a number must follow it in the same token).
        ``rest == b""`` (a number written in full): every token that ends it, stop tokens included."""
        key = (rest, delimited)
        with _LOCK:   # AR masks of several sessions are computed on worker threads
            row = self._rows.get(key)
        if row is not None:
            return row
        if not rest:
            row = ~self.continues
        else:
            lo = bisect.bisect_left(self._keys, rest)
            hi = lo
            while hi < len(self._keys) and self._keys[hi].startswith(rest):
                hi += 1
            ids = self._ids[lo:hi]
            if delimited:
                n = len(rest)
                ids = [t for t in ids if len(self.bytes[t]) > n and self.bytes[t][n] not in SCALAR_BYTES]
            row = _mask_of(ids, self.n_words)
        with _LOCK:
            self._rows[key] = row
            while len(self._rows) > 256:
                self._rows.popitem(last=False)
        return row


def _mask_of(ids: Sequence[int], n_words: int) -> np.ndarray:
    """The int32 bitmask row allowing exactly ``ids`` (vectorised: the index sets up to 262k ids)."""
    row = np.zeros(n_words, dtype=np.uint32)
    a = np.asarray(ids, dtype=np.int64)
    np.bitwise_or.at(row, a >> 5, (np.uint32(1) << (a & 31).astype(np.uint32)))
    return row.view(np.int32)


class Exclusion:
    """The bans of one request's row (see the module text): :meth:`masks` removes the tokens that
    would write a banned value, :meth:`admissible` says how many tokens of a commit may go in."""

    def __init__(self, bans: Sequence[Ban], index: TokenBytes):
        self.bans = list(bans)
        self.index = index
        self._by_path: dict[tuple, list[Ban]] = {}
        for b in self.bans:
            self._by_path.setdefault(b.path, []).append(b)
        self._prefixes = any(b.prefix for b in self.bans)
        self._seen: list[int] = []        # the committed tokens scanned so far
        self._scan = JsonScan()
        self._text = bytearray()

    def __bool__(self) -> bool:
        return bool(self.bans)

    # -- the scan of the committed tokens --------------------------------------------------------
    def _after(self, frozen: Sequence[int]) -> tuple[JsonScan, bytearray, bool]:
        """A copy of the scan after ``frozen`` (and its bytes; False when a banned value is in them)."""
        n = len(self._seen)
        if len(frozen) < n or list(frozen[:n]) != self._seen:
            self._seen, self._scan, self._text = [], JsonScan(), bytearray()
            n = 0
        ok = True
        for t in frozen[n:]:
            ok = self._step(self._scan, self._text, int(t)) and ok
            self._seen.append(int(t))
        return self._scan.copy(), bytearray(self._text), ok

    def _step(self, scan: JsonScan, text: bytearray, t: int) -> bool:
        """Scan token ``t``; False when it writes a banned value."""
        ix = self.index
        if t in ix.stops:
            ended = scan.end()
        else:
            b = ix.bytes[t] if t < len(ix.bytes) else b""
            text.extend(b)
            ended = scan.feed(b)
        for e in ended:
            for ban in self._by_path.get(e.path, ()):
                if _writes(ban, text, e.start, e.end, True):
                    return False
        if self._prefixes:
            for path, start in scan.open_values():
                for ban in self._by_path.get(path, ()):
                    if ban.prefix and _writes(ban, text, start, len(text), False):
                        return False
        return True

    # -- what the guide asks ---------------------------------------------------------------------
    def admissible(self, frozen: Sequence[int], tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` may be committed after ``frozen`` (all, unless one of them
        would write a banned value: then the ones before it)."""
        scan, text, _ = self._after(frozen)
        for i, t in enumerate(tokens):
            if not self._step(scan, text, int(t)):
                return i
        return len(tokens)

    def banned_row(self, scan: JsonScan, text: bytes) -> np.ndarray | None:
        """The bitmask of the tokens that would write a banned value next (None: no rule applies).
        A prefix ban is checked like a whole one: its text ends where a member ends."""
        row = None
        for path, start in scan.open_values():
            for ban in self._by_path.get(path, ()):
                rest = self._rest_row(ban, text[start:])
                if rest is not None:
                    row = rest if row is None else row | rest
        return row

    def _rest_row(self, ban: Ban, written: bytes) -> np.ndarray | None:
        if len(written) > len(ban.text) or not ban.text.startswith(written):
            return None
        if len(written) == len(ban.text) and not ban.delimited:
            return None   # already written in full (never: it would have been refused)
        return self.index.starting_with(ban.text[len(written):], ban.delimited)

    def masks(self, frozen: Sequence[int], draft: Sequence[int], bitmasks: np.ndarray) -> tuple[np.ndarray, int]:
        """``(bitmasks, n)``: the walker's mask rows along ``draft`` (row ``i`` after ``draft[:i]``)
        without the tokens that would write a banned value, cut after the first draft token that
        would (``n`` rows kept). A copy when anything was removed, else ``bitmasks`` itself."""
        scan, text, _ = self._after(frozen)
        out = bitmasks
        n = len(bitmasks)
        for i in range(len(bitmasks)):
            row = self.banned_row(scan, bytes(text))
            if row is not None:
                if out is bitmasks:
                    out = bitmasks.copy()
                out[i] &= ~row
            if i >= len(draft):
                break
            if not self._step(scan, text, int(draft[i])):
                n = i + 1
                break
        return out[:n], n


def _writes(ban: Ban, text: bytearray, start: int, end: int, ended: bool) -> bool:
    """Whether the value written at ``text[start:end]`` (``ended``: it is over) is what ``ban``
    forbids: exactly its text, or with ``prefix`` a value starting with it; a ``delimited`` text
    counts once a byte that cannot continue it follows, or the value is over."""
    n = len(ban.text)
    if not ban.prefix:
        return ended and end - start == n and text[start:end] == ban.text
    if end - start < n or text[start:start + n] != ban.text:
        return False
    if not ban.delimited:
        return True
    return text[start + n] not in SCALAR_BYTES if end - start > n else ended


def sharpen(ban: Ban, span: tuple[int, int] | None, walker: Any, tokens: Sequence[int], pieces: Sequence[str],
            index: TokenBytes) -> Ban:
    """``ban`` cut back to where the grammar forces the rest of its text, as a prefix ban: an enum
    value, a literal (``f`` forces ``alse``) or a ``const`` tail is decided before its last byte, and a
    ban checked only at the last byte would leave the row where the grammar allows nothing else (a
    dead end). ``span``: the banned text's characters in the output whose ``tokens`` (decoded one by
    one: ``pieces``) it came from; ``walker``: a fresh walker of the constraint at its start state.
    The text is walked byte by byte (single-byte tokens, the engine's forced bytes after each), so
    the cut may fall inside a token. Unchanged when nothing is forced before the end."""
    if span is None:
        return ban
    start, end = span
    ti = char_to_token_index(pieces, start)
    if ti >= len(tokens):
        return ban
    head = sum(len(p) for p in pieces[:ti])
    full = "".join(pieces)
    data = full[head:end].encode()
    at = len(full[head:start].encode())   # the banned text's first byte in ``data``
    try:
        walker.commit(tokens[:ti])
        m = walker.frozen_matcher()
        for k, byte in enumerate(data):
            if k > at and bytes(m.compute_ff_bytes()).startswith(data[k:]):
                return Ban(ban.path, data[at:k], prefix=True, delimited=False)
            t = index.single.get(byte)
            if t is None or not m.consume_token(t):
                break
    except Exception:  # noqa: BLE001 - the walk is only advice: the ban as it was
        pass
    return ban


def dead_end_ban(bans: Sequence[Ban], answer: bytes) -> Ban | None:
    """The ban that keeps later attempts out of the dead end an output stopped in: where the row was
    writing a value whose every continuation the grammar allows is banned (a boolean with both
    values rejected), that value's start as written is banned as a prefix; when nothing of it is
    written yet, its parent's. None when the output did not stop inside a banned value.

    >>> dead_end_ban([Ban(("b",), b"true"), Ban(("b",), b"false")], b'{"a":1,"b":')
    Ban(path=(), text=b'{"a":1,"b":', prefix=True, delimited=False)
    """
    scan = JsonScan()
    scan.feed(answer)
    opened = scan.open_values()
    for depth in range(len(opened) - 1, -1, -1):
        path, start = opened[depth]
        written = answer[start:]
        if not any(b.path == path and b.text.startswith(written) and len(written) < len(b.text) + b.delimited
                   for b in bans):
            continue
        while not written and depth > 0:
            depth -= 1
            path, start = opened[depth]
            written = answer[start:]
        return Ban(path, bytes(written), prefix=True, delimited=False) if written else None
    return None


class ExcludedAR:
    """The exclusion rule in the AR loop, a mixin before
    :class:`~dgemma_struct.guide.lookahead.ARMasking` in the guide: each row's AR mask loses the
    tokens that would write a banned value, and a sampled token that would all the same (one that
    opens and completes a value, which the mask does not look through) ends the row as a dead end
    instead of being committed."""

    rows: list

    def ar_token(self, tokens: Any, active: Any) -> None:
        banned = [b for b in self._ar_rows(active) if self.rows[b].exclusion is not None]  # type: ignore[attr-defined]
        if banned:
            toks = tokens.tolist()
            for b in banned:
                r = self.rows[b]
                if r.exclusion.admissible(r.walker.frozen_tokens, [toks[b]]) == 0:
                    r.dead_end = r.no_allowed = True   # ended, not committed: repaired as a dead end
        super().ar_token(tokens, active)  # type: ignore[misc]

    def _ar_masks(self, rows: tuple[int, ...]) -> np.ndarray | None:
        masks = super()._ar_masks(rows)  # type: ignore[misc]
        for i, b in enumerate(rows):
            ex = self.rows[b].exclusion
            if ex is not None:
                masks[i] = ex.masks(self.rows[b].walker.frozen_tokens, [], masks[i:i + 1])[0][0]
        return masks
