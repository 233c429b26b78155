"""A chat template rendered off the event loop, under a deadline on the CPU time it spends."""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from .http_errors import APIError

#: the most CPU time a chat template may spend rendering before the request is refused (the message
#: caps keep real requests near 0.5 s; a template that loops is the case this bounds)
TEMPLATE_DEADLINE_S = 10.0
_RENDER_POLL_S = 0.05   # how often a render's CPU clock is read while it runs


async def rendered(render: Any) -> Any:
    """``render()`` in a thread of its own, answered with a 400 once it has spent
    :data:`TEMPLATE_DEADLINE_S` seconds of *its own CPU time* (the thread finishes on its own; the request
    is not held).

    CPU time, not wall time: on a loaded host (a Ray node running replicas on two cores) an ordinary
    render waits for a core far longer than it computes, and a wall deadline refused it; a template that
    loops burns CPU, which is what the deadline is for. Its own thread, not the default executor: a render
    never queues behind choice scoring or other work there. Where a thread's CPU clock cannot be read
    (no ``time.pthread_getcpuclockid``), the wall time since the render started stands in.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()
    clock: list[int] = []
    started = threading.Event()

    def settle(ok: bool, value: Any) -> None:
        if not done.done():
            (done.set_result if ok else done.set_exception)(value)

    def work() -> None:
        if hasattr(time, "pthread_getcpuclockid"):
            clock.append(time.pthread_getcpuclockid(threading.get_ident()))
        started.set()
        try:
            out = (True, render())
        except BaseException as e:   # noqa: BLE001 - handed to the awaiting request, raised there
            out = (False, e)
        try:
            loop.call_soon_threadsafe(settle, *out)
        except RuntimeError:         # the loop closed while the template rendered: nobody is waiting
            pass

    threading.Thread(target=work, name="dgemma-struct-template", daemon=True).start()
    t0 = time.monotonic()
    try:
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(done), _RENDER_POLL_S)
            except asyncio.TimeoutError:
                pass
            if not started.is_set():
                continue
            try:
                spent = time.clock_gettime(clock[0]) if clock else time.monotonic() - t0
            except OSError:              # the thread just ended: its answer is on its way
                continue
            if spent > TEMPLATE_DEADLINE_S:
                raise APIError(400, f"rendering the chat template took more than {TEMPLATE_DEADLINE_S:g} s of "
                               "CPU time", param="messages", code="prompt_too_complex") from None
    finally:
        # nobody waits any more (refused, or the request cancelled): a late answer is dropped, and an
        # exception the render raises later is not logged as "never retrieved"
        done.cancel()
