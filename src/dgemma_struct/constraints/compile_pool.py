"""Compile workers: user constraints are first compiled in a separate process, so that a native
crash (llguidance segfaults on some inputs) or a compile that never ends cannot take the serving
process down or hold it up.

* A pool of ``size`` worker processes (fresh interpreters: no fork of a process with live threads), started
  lazily and restarted when one dies; a worker's start-up time never counts against a compile.
* :meth:`CompilePool.run` sends one picklable call to an idle worker and waits at most
  ``timeout_s``. A worker that dies meanwhile is reported as :class:`CompileCrashed` (the signal
  is in the message); one that runs past the timeout is killed, and the call raises
  :class:`~dgemma_struct.errors.ConstraintCompileTimeout`. Either way the next call gets a
  fresh worker.
* :meth:`CompilePool.probe` compiles a spec there (and walks its first mask); the server then
  compiles the same spec in-process (a ``Constraint`` is not picklable), which is safe once the
  probe succeeded. Typed errors raised in the worker come back as the same typed errors.
* Each worker caps its address space (``memory_mb`` above what it uses after start-up), so a
  runaway compile fails in the worker instead of swapping the machine.

Example::

    pool = CompilePool(size=2)
    pool.probe({"type": "object"}, runtime.tokenizer, stop_token_ids=[1], vocab_size=512, timeout_s=10)
    pool.close()
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from multiprocessing.connection import Connection
from typing import Any, Callable

import dgemma_struct.errors as E

from .compile_worker import prepare, probe

__all__ = ["CompilePool", "CompileCrashed", "PoolUnavailable", "PoolBusy", "CompileLanes", "spec_key", "spec_size",
           "SMALL_SPEC_BYTES"]

#: specs up to this many bytes (as JSON text) are "small": they have a lane of their own, so a flood
#: of big compiles never holds them up (a 2-option choice, a flat object schema)
SMALL_SPEC_BYTES = 4096

class CompileCrashed(E.ConstraintEngineError):
    """The compile worker died (a native crash) while compiling this constraint."""


class PoolUnavailable(E.DgemmaStructError):
    """No compile worker could be started, or the pool is closed (a server fault, not the spec's)."""


class PoolBusy(E.DgemmaStructError):
    """Every compile slot stayed busy for the whole bounded wait (the server answers 503 ``overloaded``
    with ``Retry-After``)."""

    def __init__(self, message: str, retry_after_s: float = 1.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class _WorkerDied(Exception):
    pass


class _CallTimeout(Exception):   # not TimeoutError: that one is an OSError
    pass


# ---------------------------------------------------------------------------------------- parent side
class _Worker:
    """One worker: a fresh interpreter (``python -c``, so the parent's ``__main__`` is never
    re-imported), talking over a socket pair with ``multiprocessing.connection``."""

    def __init__(self, memory_mb: int | None, start_timeout_s: float):
        parent, child = socket.socketpair()
        code = (f"from dgemma_struct.constraints.compile_worker import worker_entry; "
                f"worker_entry({child.fileno()}, {memory_mb!r}, {os.getpid()})")
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(child.fileno(),),
                                         stdin=subprocess.DEVNULL, close_fds=True)
        finally:
            child.close()
        self.conn = Connection(parent.detach())
        self.tokenizers: set[str] = set()
        if not self.conn.poll(start_timeout_s):
            self.kill()
            raise PoolUnavailable("the compile worker did not start")
        try:
            self.conn.recv()
        except (EOFError, OSError):
            self.kill()
            raise PoolUnavailable("the compile worker died while starting") from None

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def call(self, msg: tuple, timeout_s: float) -> tuple:
        try:
            self.conn.send(msg)
            ready = self.conn.poll(timeout_s)
        except (EOFError, OSError):
            raise _WorkerDied from None
        if not ready:
            raise _CallTimeout
        try:
            return self.conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            raise _WorkerDied from None

    def exit_description(self) -> str:
        try:
            code = self.proc.wait(2)
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            return "it stopped answering"
        if code < 0:
            try:
                return f"it was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"it was killed by signal {-code}"
        return f"it exited with status {code}"

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        try:
            self.conn.close()
        except OSError:
            pass


class _Big:
    """Stands for a spec of unknown size (always the big lane)."""

    def __repr__(self) -> str:
        return "x" * (SMALL_SPEC_BYTES + 1)


_BIG = _Big()


def spec_key(spec: Any, strict: bool = False, whitespace: str = "compact") -> str:
    """A stable key of a spec (dicts by canonical JSON, spec objects by repr)."""
    try:
        text = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(spec)
    raw = f"{type(spec).__name__}|{strict}|{whitespace}|{text}"
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def spec_size(spec: Any) -> int:
    """About how many bytes ``spec`` is (its JSON text, or its repr): what decides its lane."""
    try:
        return len(json.dumps(spec, separators=(",", ":"), ensure_ascii=False, default=repr))
    except (TypeError, ValueError, RecursionError):
        return len(repr(spec))


class CompileLanes:
    """Admission to compile slots in two lanes: ``big`` slots for every spec and ``small`` slots only
    specs of at most :data:`SMALL_SPEC_BYTES` may take, so a small spec never waits behind big ones.
    A slot is waited for at most ``wait_s``; then :class:`PoolBusy` (a bounded wait, never a client
    time-out). Thread-safe; ``with lanes.slot(spec): ...``."""

    def __init__(self, big: int = 2, small: int = 1, *, wait_s: float = 10.0):
        self.big = threading.BoundedSemaphore(max(1, big))
        self.small = threading.BoundedSemaphore(max(1, small))
        self.wait_s = wait_s

    def acquire(self, spec: Any, wait_s: float | None = None) -> threading.BoundedSemaphore:
        """Take a slot for ``spec``; returns the semaphore to release."""
        wait = self.wait_s if wait_s is None else wait_s
        deadline = time.monotonic() + wait
        small = spec_size(spec) <= SMALL_SPEC_BYTES
        while True:
            if self.big.acquire(blocking=False):
                return self.big
            if small and self.small.acquire(blocking=False):
                return self.small
            left = deadline - time.monotonic()
            if left <= 0:
                raise PoolBusy(f"every compile slot stayed busy for {wait:g} s; retry shortly",
                               retry_after_s=max(1.0, round(wait / 2)))
            if not small:
                if self.big.acquire(timeout=left):
                    return self.big
                continue
            time.sleep(min(0.01, left))

    def slot(self, spec: Any, wait_s: float | None = None) -> Any:
        """A context manager holding a slot for ``spec``."""
        import contextlib

        @contextlib.contextmanager
        def held() -> Any:
            sem = self.acquire(spec, wait_s)
            try:
                yield sem
            finally:
                sem.release()
        return held()


class CompilePool:
    """Worker processes for compiles that may crash or run away; see the module docstring.

    ``size`` workers serve every spec; ``small_lane`` more serve small specs only
    (:class:`CompileLanes`), and a call waits at most ``queue_wait_s`` for one (:class:`PoolBusy`)."""

    def __init__(self, size: int = 2, *, memory_mb: int | None = 4096, start_timeout_s: float = 180.0,
                 remember: int = 1024, small_lane: int = 1, queue_wait_s: float = 10.0):
        if size < 1:
            raise ValueError("the compile pool needs at least one worker")
        self.size = size
        self.lanes = CompileLanes(size, small_lane, wait_s=queue_wait_s)
        self.max_workers = size + max(1, small_lane)
        self.memory_mb = memory_mb
        self.start_timeout_s = start_timeout_s
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._all: list[_Worker] = []
        self._closed = False
        self._tok_bytes: dict[int, tuple[Any, str, bytes]] = {}
        self._ok: "OrderedDict[str, None]" = OrderedDict()   # keys of specs whose probe succeeded
        self._crashed: "OrderedDict[str, str]" = OrderedDict()   # specs that crashed a worker -> message
        self._remember = remember
        self.counters = {"compiles": 0, "crashes": 0, "timeouts": 0, "restarts": 0}

    # ------------------------------------------------------------------ workers
    def _take(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise PoolUnavailable("the compile pool is closed")
            while self._idle:
                w = self._idle.pop()
                if w.alive:
                    return w
                self._forget(w)
        w = _Worker(self.memory_mb, self.start_timeout_s)
        with self._lock:
            self._all.append(w)
        return w

    def _forget(self, w: _Worker) -> None:
        if w in self._all:
            self._all.remove(w)

    def _discard(self, w: _Worker) -> None:
        w.kill()
        with self._lock:
            self._forget(w)
            self.counters["restarts"] += 1
        # a replacement starts now, in the background, so the next compile does not wait for it
        threading.Thread(target=self._replenish, daemon=True, name="dgemma-struct-compile-restart").start()

    def _replenish(self) -> None:
        try:
            self.warm(1)
        except PoolUnavailable:
            pass

    def warm(self, count: int = 1) -> None:
        """Start workers (blocking) until ``count`` are idle (at most ``size``), so that the next
        compiles do not wait for a start-up."""
        count = min(count, self.max_workers)
        while True:
            with self._lock:
                if self._closed or len(self._idle) >= count or len(self._all) >= self.max_workers:
                    return
            w = _Worker(self.memory_mb, self.start_timeout_s)
            with self._lock:
                if self._closed or len(self._all) >= self.max_workers:
                    w.kill()
                    return
                self._all.append(w)
                self._idle.append(w)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers, self._all, self._idle = list(self._all), [], []
        for w in workers:
            w.kill()

    # ------------------------------------------------------------------ calls
    def _tok_payload(self, tokenizer: Any) -> tuple[str, bytes]:
        entry = self._tok_bytes.get(id(tokenizer))
        if entry is None or entry[0] is not tokenizer:
            data = pickle.dumps(tokenizer)
            entry = (tokenizer, hashlib.sha256(data).hexdigest(), data)
            self._tok_bytes[id(tokenizer)] = entry
        return entry[1], entry[2]

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float, tokenizer: Any = None,
            setup: tuple | None = None, lane_of: Any = None, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in a worker (``fn`` and the arguments must pickle). Raises the
        worker's typed error, :class:`CompileCrashed`, or ``ConstraintCompileTimeout``.
        ``tokenizer`` is sent to a worker once; ``setup`` = ``(fn, args)`` runs first, once per
        worker and tokenizer, under the start-up timeout (tokenizer set-up is not a compile).
        ``lane_of``: the spec whose size picks the lane (None: a big-lane call)."""
        tok = self._tok_payload(tokenizer) if tokenizer is not None else None
        with self.lanes.slot(lane_of if lane_of is not None else _BIG):
            w = self._take()
            send_tok = None if tok is None or tok[0] in w.tokenizers else tok
            try:
                if send_tok is not None and setup is not None:
                    first = w.call((setup[0], setup[1], {}, send_tok), self.start_timeout_s)
                    send_tok = None
                    if first[0] != "ok":
                        w.tokenizers.add(tok[0])
                        self._give_back(w)
                        return self._raise(first)
                reply = w.call((fn, args, kwargs, send_tok), timeout_s)
            except _CallTimeout:
                self._discard(w)
                self.counters["timeouts"] += 1
                raise E.ConstraintCompileTimeout(
                    f"compiling the constraint took longer than {timeout_s:g} s (the compile was stopped)") from None
            except _WorkerDied:
                how = w.exit_description()
                self._discard(w)
                self.counters["crashes"] += 1
                raise CompileCrashed(f"the constraint engine crashed on this constraint ({how}); the crash was "
                                     "contained in a compile worker") from None
            if tok is not None:
                w.tokenizers.add(tok[0])
            self._give_back(w)
        return self._raise(reply)

    def _give_back(self, w: _Worker) -> None:
        with self._lock:
            if self._closed:
                w.kill()
            else:
                self._idle.append(w)

    def _raise(self, reply: tuple) -> Any:
        if reply[0] == "ok":
            return reply[1]
        _, module, name, message = reply
        cls = getattr(E, name, None) if module == E.__name__ or module.startswith("dgemma_struct") else None
        if isinstance(cls, type) and issubclass(cls, E.DgemmaStructError):
            try:
                raise cls(message)
            except TypeError:  # a constructor with other required arguments
                raise E.ConstraintError(message) from None
        if name == "PanicException":
            raise E.ConstraintEngineError(f"the constraint engine panicked: {message}")
        raise E.ConstraintError(f"cannot compile the constraint: {name}: {message}")

    def known_ok(self, spec: Any, strict: bool = False, whitespace: str = "compact") -> bool:
        """Whether ``spec`` was probed successfully before (its compile is then known to be safe)."""
        with self._lock:
            return spec_key(spec, strict, whitespace) in self._ok

    def probe(self, spec: Any, tokenizer: Any, *, stop_token_ids: list[int], vocab_size: int | None,
              strict: bool = False, whitespace: str = "compact", timeout_s: float = 10.0) -> None:
        """Compile ``spec`` in a worker; returns when it compiled, raises the typed error otherwise.
        Specs that compiled before are not probed again."""
        key = spec_key(spec, strict, whitespace)
        with self._lock:
            if key in self._ok:
                self._ok.move_to_end(key)
                return
            if key in self._crashed:   # sent again: answered at once, no worker is sacrificed
                raise CompileCrashed(self._crashed[key])
        self.counters["compiles"] += 1
        tok_key = self._tok_payload(tokenizer)[0]
        try:
            self.run(probe, spec, tok_key, list(stop_token_ids), vocab_size, strict, whitespace,
                     timeout_s=timeout_s, tokenizer=tokenizer, lane_of=spec,
                     setup=(prepare, (tok_key, list(stop_token_ids), vocab_size)))
        except CompileCrashed as err:
            with self._lock:
                self._crashed[key] = str(err)
                while len(self._crashed) > self._remember:
                    self._crashed.popitem(last=False)
            raise
        with self._lock:
            self._ok[key] = None
            while len(self._ok) > self._remember:
                self._ok.popitem(last=False)
