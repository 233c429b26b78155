"""Readiness and drain. :class:`Lifecycle` is what the probes report: loaded, warmed up (one real
constrained generation ran through the batcher: :func:`warm_up`), draining. :class:`DrainingServer`
is uvicorn with a bounded graceful shutdown: the first SIGTERM makes the server *drain* (readiness
503, new ``/v1/*`` requests 503 with ``Retry-After``, the port stays open so a load balancer sees
the refusals instead of connection errors), in-flight requests run to the end, and the process
exits when none is left or after ``ServerConfig.drain_timeout_s``, whichever comes first. A second
signal exits at once.

Example::

    lc = Lifecycle()
    assert not lc.ready and lc.idle()
    lc.begin_drain()
    assert lc.draining and not lc.ready
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

import uvicorn

__all__ = ["Lifecycle", "DrainingServer", "warm_up", "WARMUP_SCHEMA"]

log = logging.getLogger("dgemma_struct.server")
#: The constraint of the warm-up generation (compiles the JSON path, the tokenizer set-up included).
WARMUP_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                 "additionalProperties": False}


class Lifecycle:
    """Where the server stands: ``loaded`` (model and batcher up), ``warmed`` (the warm-up ran),
    ``draining`` (SIGTERM seen); ``in_flight``: HTTP requests being answered; ``errors``:
    requests answered with a status >= 400."""

    def __init__(self) -> None:
        self.loaded = False
        self.warmed = False
        self.draining = False
        self.drain_started: float | None = None
        self.warmup_s: float | None = None
        self.warmup_error: str | None = None
        self.in_flight = 0
        self.errors = 0

    @property
    def ready(self) -> bool:
        """Whether a new request can be answered now (what ``/health/ready`` reports)."""
        return self.loaded and self.warmed and not self.draining

    def begin_drain(self) -> None:
        """Stop admitting new work (idempotent)."""
        if not self.draining:
            self.draining = True
            self.drain_started = time.monotonic()

    def idle(self) -> bool:
        """No HTTP request is being answered."""
        return self.in_flight <= 0

    def summary(self) -> dict[str, Any]:
        return {"ready": self.ready, "warmed": self.warmed, "draining": self.draining,
                "warmup_s": None if self.warmup_s is None else round(self.warmup_s, 3),
                "warmup_error": self.warmup_error, "in_flight": self.in_flight}


async def warm_up(state: Any, lifecycle: Lifecycle) -> None:
    """One constrained generation through the real path (compile, prompt encoding, the batcher);
    the server is ready when it returns. A typed outcome (even a length error) counts: the point
    is that every first-request cost has been paid."""
    from dgemma_struct.errors import DgemmaStructError

    from .http_errors import APIError

    t0 = time.perf_counter()
    try:
        constraint = await state.compile(WARMUP_SCHEMA, "response_format")
        prompt = [{"role": "user", "content": 'Answer {"ok": true}.'}]
        state.prompt_tokens(prompt)
        await state.batcher.submit(prompt, constraint, max_new_tokens=16, seed=0,
                                   timeout_s=state.config.request_timeout_s)
    except (DgemmaStructError, APIError) as err:
        lifecycle.warmup_error = f"{type(err).__name__}: {err}"[:300]
    except Exception as err:  # noqa: BLE001 - reported on /health/ready; the worker decides readiness
        lifecycle.warmup_error = f"{type(err).__name__}: {err}"[:300]
        log.warning("warm-up generation failed: %s", lifecycle.warmup_error)
    lifecycle.warmup_s = time.perf_counter() - t0
    if state.metrics is not None:
        state.metrics.warmup_seconds.set(lifecycle.warmup_s)
    lifecycle.warmed = True
    log.info("ready after a %.2f s warm-up", lifecycle.warmup_s)


class DrainingServer(uvicorn.Server):
    """uvicorn with a bounded drain on SIGTERM (see the module docstring)."""

    def __init__(self, config: uvicorn.Config, lifecycle: Lifecycle, drain_timeout_s: float):
        super().__init__(config)
        self.lifecycle = lifecycle
        self.drain_timeout_s = drain_timeout_s
        # connections still open when the drain ends get this long before they are cut
        config.timeout_graceful_shutdown = max(1, int(drain_timeout_s))

    def handle_exit(self, sig: int, frame: Any) -> None:
        if sig != signal.SIGTERM or self.lifecycle.draining:
            return super().handle_exit(sig, frame)
        self.lifecycle.begin_drain()
        log.info("SIGTERM: draining (at most %.0f s)", self.drain_timeout_s)
        threading.Thread(target=self._drain, daemon=True, name="dgemma-struct-drain").start()

    def _drain(self) -> None:
        deadline = time.monotonic() + self.drain_timeout_s
        while time.monotonic() < deadline and not self.lifecycle.idle():
            time.sleep(0.05)
        if not self.lifecycle.idle():
            log.warning("drain limit reached with %d request(s) in flight", self.lifecycle.in_flight)
        self.config.timeout_graceful_shutdown = 1   # the limit is spent: what is left is cut
        self.should_exit = True
