"""The compile worker process's side of :mod:`.compile_pool`: the loop that runs one pickled call
at a time, and the calls the pool sends (:func:`prepare` a tokenizer, :func:`probe` a spec).
Imported in a fresh interpreter; its address space is capped after start-up."""
from __future__ import annotations

import pickle
import signal
from multiprocessing.connection import Connection
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


def worker_entry(fd: int, memory_mb: int | None) -> None:
    """The worker process's main loop (started by :class:`~.compile_pool.CompilePool`)."""
    _worker_main(Connection(fd), memory_mb)


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
            conn.send(("ok", fn(*args, **kwargs)))
        except BaseException as err:  # noqa: BLE001 - PanicException is a BaseException
            conn.send(("err", type(err).__module__, type(err).__name__, str(err)[:MAX_MESSAGE]))


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
