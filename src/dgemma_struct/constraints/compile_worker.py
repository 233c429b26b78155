"""The compile worker process's side of :mod:`.compile_pool`: the loop that runs one pickled call
at a time, and the calls the pool sends (:func:`prepare` a tokenizer, :func:`probe` a spec).
Imported in a fresh interpreter; its address space is capped after start-up."""
from __future__ import annotations

import os
import pickle
import signal
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

#: Longest error message a worker sends back.
MAX_MESSAGE = 2000
_TOKENIZERS: dict[str, Any] = {}


def _limit_memory(memory_mb: int | None) -> None:
    if not memory_mb:
        return
    try:
        import resource

        with open("/proc/self/statm") as f:
            vm_pages = int(f.read().split()[0])
        import os

        current = vm_pages * os.sysconf("SC_PAGE_SIZE")
        limit = current + memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (OSError, ValueError, ImportError):  # not Linux: no cap
        pass


def watch_parent(parent_pid: int, interval_s: float = 0.5) -> None:
    """Ends this process at once (status 0, no output) when ``parent_pid`` is no longer its parent:
    a worker busy in a long compile would otherwise outlive a server that died. (Not
    ``PR_SET_PDEATHSIG``: it fires when the *thread* that started the worker ends, and the pool
    starts replacements from short-lived threads.)"""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval_s)
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="dgemma-struct-parent-watch").start()


def worker_entry(fd: int, memory_mb: int | None, parent_pid: int | None = None) -> None:
    """The worker process's main loop (started by :class:`~.compile_pool.CompilePool`). It exits
    quietly, with status 0, when its parent goes away (a closed socket or a changed parent pid)."""
    if parent_pid is not None:
        watch_parent(parent_pid)
    try:
        _worker_main(Connection(fd), memory_mb)
    except (EOFError, OSError):   # the parent closed the socket mid-send (BrokenPipeError): it is gone
        os._exit(0)


def _worker_main(conn: Any, memory_mb: int | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the parent's Ctrl-C is the parent's business
    import dgemma_struct.constraints  # noqa: F401 - import before the memory cap is set

    _limit_memory(memory_mb)
    conn.send(("ready",))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        fn, args, kwargs, tok = msg
        if tok is not None and tok[0] not in _TOKENIZERS:
            _TOKENIZERS[tok[0]] = pickle.loads(tok[1])
        try:
            reply = ForkingPickler.dumps(("ok", fn(*args, **kwargs)))   # what conn.send pickles with
        except BaseException as err:  # noqa: BLE001 - PanicException is a BaseException
            reply = ForkingPickler.dumps(("err", type(err).__module__, type(err).__name__, str(err)[:MAX_MESSAGE]))
        conn.send_bytes(reply)


def prepare(tok_key: str, stop_token_ids: list[int], vocab_size: int | None) -> bool:
    """Build the llguidance tokenizer of ``tok_key`` once per worker (not timed as a compile)."""
    from dgemma_struct.constraints import get_tokenizer_info

    get_tokenizer_info(_TOKENIZERS[tok_key], stop_token_ids, vocab_size)
    return True


def probe(spec: Any, tok_key: str, stop_token_ids: list[int], vocab_size: int | None, strict: bool,
           whitespace: str) -> int:
    """Compile ``spec`` and compute its first masks; returns the number of forced tokens."""
    from dgemma_struct.constraints import compile_constraint

    c = compile_constraint(spec, _TOKENIZERS[tok_key], strict=strict, whitespace=whitespace,
                           stop_token_ids=stop_token_ids, vocab_size=vocab_size, use_cache=False)
    walker = c.canvas_walker()
    forced = walker.forced_tokens(256)
    walker.mask()
    return len(forced)
