"""An incremental JSON scanner that knows, byte by byte, which values are open (started and not
finished) and at which JSON path, and reports each value as it ends. The repair's exclusion rule
(:mod:`dgemma_struct.guide.exclusion`) runs it over a row's output to tell where a rejected value
would be written again.

Only the path bookkeeping of JSON is scanned, not its validity (the grammar sees to that): a value
ends at its closing quote or bracket, a number or literal at the first byte that cannot continue it
(or at the end of the output, :meth:`JsonScan.end`).

Example::

    >>> s = JsonScan()
    >>> [tuple(e) for e in s.feed(b'{"a":[1,"x",')]
    [(('a', 0), 6, 7, 5), (('a', 1), 8, 11, 5)]
    >>> s.open_values()
    [((), 0), (('a',), 5), (('a', 2), 12)]
"""
from __future__ import annotations

import json
from typing import NamedTuple

__all__ = ["JsonScan", "Ended", "SCALAR_BYTES"]

#: bytes that can continue a number or a literal (``true``, ``false``, ``null``)
SCALAR_BYTES = frozenset(b"0123456789.eE+-abcdefghijklmnopqrstuvwxyz")
_WS = frozenset(b" \t\n\r")

# modes: V a value is expected (at ``vpath``), S in a string value, N in a number / literal,
# K in a key, C a colon is expected, O a key or '}' is expected, A after a value, X past the root
_V, _S, _N, _K, _C, _O, _A, _X = range(8)


class Ended(NamedTuple):
    """A value that ended: its path, its byte span ``[start, end)`` in the scanned output and where
    the value holding it starts (``-1`` for the root)."""

    path: tuple
    start: int
    end: int
    parent: int = -1


class JsonScan:
    """The scanner's state after the bytes fed so far (``pos`` of them); :meth:`copy` is cheap
    (a few small lists), so a caller can branch it per draft position."""

    __slots__ = ("pos", "mode", "stack", "vpath", "vstart", "esc", "key", "first")

    def __init__(self) -> None:
        self.pos = 0
        self.mode = _V
        self.stack: list[list] = []      # open containers: [is_object, path, start, key or index]
        self.vpath: tuple = ()           # path of the value expected / being written
        self.vstart = 0                  # where that value started
        self.esc = False                 # the previous byte of a string was a backslash
        self.key = bytearray()           # the key being read
        self.first = False               # just after '[' (']' may close it at once)

    def copy(self) -> "JsonScan":
        c = JsonScan.__new__(JsonScan)
        c.pos, c.mode, c.vpath, c.vstart, c.esc, c.first = self.pos, self.mode, self.vpath, self.vstart, self.esc, \
            self.first
        c.stack = [list(f) for f in self.stack]
        c.key = bytearray(self.key)
        return c

    def open_values(self) -> list[tuple[tuple, int]]:
        """``(path, start)`` of every value started and not finished, outermost first; a value
        expected next counts as open from here (its start is the current position)."""
        out = [(f[1], f[2]) for f in self.stack]
        if self.mode in (_S, _N):
            out.append((self.vpath, self.vstart))
        elif self.mode == _V:
            out.append((self.vpath, self.pos))
        return out

    def in_scalar(self) -> bool:
        """Inside a number or a literal, which the next byte may still continue."""
        return self.mode == _N

    def feed(self, data: bytes) -> list[Ended]:
        """Scan ``data``; the values that ended in it, in order."""
        ended: list[Ended] = []
        for c in data:
            self._byte(c, ended)
            self.pos += 1
        return ended

    def end(self) -> list[Ended]:
        """The output ends here: a number or literal still open ends with it."""
        if self.mode == _N:
            ended = [Ended(self.vpath, self.vstart, self.pos, self.stack[-1][2] if self.stack else -1)]
            self.mode = _X
            return ended
        return []

    def _close_value(self, end: int, ended: list[Ended], path: tuple, start: int) -> None:
        ended.append(Ended(path, start, end, self.stack[-1][2] if self.stack else -1))
        self.mode = _A if self.stack else _X

    def _byte(self, c: int, ended: list[Ended]) -> None:
        m = self.mode
        if m == _S:
            if self.esc:
                self.esc = False
            elif c == 0x5C:
                self.esc = True
            elif c == 0x22:
                self._close_value(self.pos + 1, ended, self.vpath, self.vstart)
            return
        if m == _K:
            if self.esc:
                self.esc = False
            elif c == 0x5C:
                self.esc = True
            elif c == 0x22:
                self.mode = _C
                return
            self.key.append(c)
            return
        if m == _N:
            if c in SCALAR_BYTES:
                return
            self._close_value(self.pos, ended, self.vpath, self.vstart)
            m = self.mode   # the byte after a number is read in the new mode
        if c in _WS:
            return
        if m == _V:
            if self.first and c == 0x5D:   # ']' of an empty array
                self.first = False
                f = self.stack.pop()
                self._close_value(self.pos + 1, ended, f[1], f[2])
                return
            self.first = False
            self.vstart = self.pos
            if c == 0x7B:      # '{'
                self.stack.append([True, self.vpath, self.pos, None])
                self.mode = _O
            elif c == 0x5B:    # '['
                self.stack.append([False, self.vpath, self.pos, 0])
                self.vpath = self.vpath + (0,)
                self.first = True
            elif c == 0x22:
                self.mode, self.esc = _S, False
            else:
                self.mode = _N
        elif m == _O:
            if c == 0x22:
                self.mode, self.esc, self.key = _K, False, bytearray()
            elif c == 0x7D:
                f = self.stack.pop()
                self._close_value(self.pos + 1, ended, f[1], f[2])
        elif m == _C:
            if c == 0x3A:
                top = self.stack[-1]
                try:
                    top[3] = json.loads(b'"' + bytes(self.key) + b'"')
                except ValueError:
                    top[3] = self.key.decode("utf-8", "replace")
                self.vpath = top[1] + (top[3],)
                self.mode = _V
        elif m == _A:
            top = self.stack[-1]
            if c == 0x2C:
                if top[0]:
                    self.mode = _O
                else:
                    top[3] += 1
                    self.vpath = top[1] + (top[3],)
                    self.mode = _V
            elif c in (0x7D, 0x5D):
                self.stack.pop()
                self._close_value(self.pos + 1, ended, top[1], top[2])
