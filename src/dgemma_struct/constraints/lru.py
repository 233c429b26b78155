"""The one cache of compiled constraints: a thread-safe LRU bounded by entry count and by an
estimated byte total (a compiled grammar can weigh hundreds of MB, so a count alone is no bound).

Example::

    >>> cache = BoundedLRU(max_items=2, max_bytes=100, sizeof=len)
    >>> cache.put("a", "x" * 60); cache.put("b", "y" * 30)
    >>> cache.get("a") is not None          # "a" is now the most recent
    True
    >>> cache.put("c", "z" * 30)            # over 100 bytes: the least recent ("b") leaves
    >>> sorted(cache.keys()), cache.hits, cache.misses
    (['a', 'c'], 1, 0)
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable

__all__ = ["BoundedLRU"]


class BoundedLRU:
    """``get`` / ``put`` under one lock; ``sizeof(value)`` estimates an entry's bytes (an entry
    larger than ``max_bytes`` is not kept). ``hits`` / ``misses`` count ``get`` calls."""

    def __init__(self, max_items: int, max_bytes: int | None = None,
                 sizeof: Callable[[Any], int] = lambda _: 0):
        self.max_items, self.max_bytes, self.sizeof = max_items, max_bytes, sizeof
        self._d: "OrderedDict[Hashable, tuple[Any, int]]" = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = self.bytes = 0

    def __len__(self) -> int:
        return len(self._d)

    def keys(self) -> list[Hashable]:
        with self._lock:
            return list(self._d)

    def get(self, key: Hashable) -> Any:
        """The value for ``key`` (now the most recent), or ``None``."""
        with self._lock:
            hit = self._d.get(key)
            if hit is None:
                self.misses += 1
                return None
            self._d.move_to_end(key)
            self.hits += 1
            return hit[0]

    def put(self, key: Hashable, value: Any) -> None:
        size = self.sizeof(value)
        if self.max_bytes is not None and size > self.max_bytes:
            return
        with self._lock:
            old = self._d.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            self._d[key] = (value, size)
            self.bytes += size
            while len(self._d) > self.max_items or (self.max_bytes is not None and self.bytes > self.max_bytes):
                _, (_, sz) = self._d.popitem(last=False)
                self.bytes -= sz

    def clear(self) -> None:
        with self._lock:
            self._d.clear()
            self.hits = self.misses = self.bytes = 0
