"""Remembered compile verdicts: a constraint whose compile was refused (invalid, too complex, timed
out, or crashed its compile worker) is remembered by its hash, so the same spec sent again is
refused at once instead of paying the compile (or a worker) again.

:class:`Verdicts` is the in-process memory (a bounded LRU with an age limit). ``shared`` plugs in
a store that outlives one process — e.g. the Ray example's named actor, so a spec refused by one
replica is refused at once by every other (``examples/ray_serve_app.py``). A shared store is
asked only about a spec this process has neither refused nor compiled, bounded by ``shared_timeout_s``; when it does not answer, the compile
simply runs (a verdict is an optimisation, never a dependency).

Example::

    import asyncio
    v = Verdicts()
    v.remember("k", {"status": 400, "message": "too complex", "code": "constraint_too_complex"})
    assert asyncio.run(v.lookup("k"))["code"] == "constraint_too_complex"
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from typing import Any, Protocol

__all__ = ["Verdicts", "SharedVerdicts", "REMEMBERED_CODES"]

#: Error codes of a compile that are remembered (the spec itself is at fault, whichever replica tries).
REMEMBERED_CODES = frozenset({"constraint_too_complex", "invalid_constraint", "constraint_engine_crash",
                              "constraint_engine_error", "invalid_schema", "unsupported_schema_keyword",
                              "invalid_regex", "invalid_grammar", "invalid_choice"})


class SharedVerdicts(Protocol):
    """A verdict store shared by several servers (all methods may block briefly)."""

    async def get(self, key: str) -> dict | None: ...

    def put(self, key: str, verdict: dict) -> None: ...


class Verdicts:
    """In-process verdicts (``size`` newest, each kept ``ttl_s``), optionally backed by ``shared``."""

    def __init__(self, size: int = 4096, ttl_s: float = 3600.0, shared: SharedVerdicts | None = None,
                 shared_timeout_s: float = 1.0):
        self.size, self.ttl_s = size, ttl_s
        self.shared, self.shared_timeout_s = shared, shared_timeout_s
        self._local: "OrderedDict[str, tuple[float, dict]]" = OrderedDict()
        self._ok: "OrderedDict[str, None]" = OrderedDict()   # compiled here: never asked about again
        self._lock = threading.Lock()
        self.counters = {"remembered": 0, "hits": 0, "shared_hits": 0, "shared_errors": 0}

    def _get_local(self, key: str) -> dict | None:
        with self._lock:
            item = self._local.get(key)
            if item is None:
                return None
            if time.monotonic() - item[0] > self.ttl_s:
                del self._local[key]
                return None
            self._local.move_to_end(key)
            return item[1]

    def _put_local(self, key: str, verdict: dict) -> None:
        with self._lock:
            self._local[key] = (time.monotonic(), verdict)
            self._local.move_to_end(key)
            while len(self._local) > self.size:
                self._local.popitem(last=False)

    async def lookup(self, key: str) -> dict | None:
        """The remembered verdict of ``key`` (an error body: status, message, code), or ``None``."""
        with self._lock:
            if key in self._ok:
                self._ok.move_to_end(key)
                return None
        found = self._get_local(key)
        if found is None and self.shared is not None:
            try:
                found = await asyncio.wait_for(self.shared.get(key), self.shared_timeout_s)
            except Exception:  # noqa: BLE001 - a missing store only costs the compile
                self.counters["shared_errors"] += 1
                found = None
            if found is not None:
                self.counters["shared_hits"] += 1
                self._put_local(key, found)
        if found is not None:
            self.counters["hits"] += 1
        return found

    def remember(self, key: str, verdict: dict) -> None:
        """Remember a refusal here and, when there is one, in the shared store."""
        self.counters["remembered"] += 1
        self._put_local(key, verdict)
        if self.shared is not None:
            try:
                self.shared.put(key, verdict)
            except Exception:  # noqa: BLE001 - best effort
                self.counters["shared_errors"] += 1

    def accept(self, key: str) -> None:
        """``key`` compiled here: later lookups of it answer at once, without the shared store."""
        with self._lock:
            self._ok[key] = None
            self._ok.move_to_end(key)
            while len(self._ok) > self.size:
                self._ok.popitem(last=False)

    def __len__(self) -> int:
        return len(self._local)
