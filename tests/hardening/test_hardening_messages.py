"""#26.2: many tiny messages never stall the server. A request with too many messages (or one whose
messages alone cannot fit the context) is refused before the chat template runs, in milliseconds,
and a small request sent at the same time is answered as usual. Loopback only."""
from __future__ import annotations

import threading
import time

import httpx
import pytest
from server_harness import running_server

from dgemma_struct.prompts import MIN_TOKENS_PER_MESSAGE
from dgemma_struct.server.protocol import MAX_MESSAGES


@pytest.fixture(scope="module")
def url(rt):
    with running_server(rt, max_tokens_cap=64, default_max_tokens=16) as u:
        yield u


def _post(url: str, messages: list, **extra) -> tuple[httpx.Response, float]:
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 8, **extra}, timeout=60)
    return r, time.perf_counter() - t0


def test_three_thousand_messages_are_refused_in_milliseconds(url):
    _post(url, [{"role": "user", "content": "warm"}], guided_choice=["yes", "no"])
    times = []
    for _ in range(3):  # best of three: a loaded 2-core CI machine adds its own stalls
        r, s = _post(url, [{"role": "user", "content": "hi"}] * 3000, guided_choice=["yes", "no"])
        assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_messages", r.text
        assert r.json()["error"]["param"] == "messages"
        times.append(s)
    assert min(times) < 0.3, times   # the target is < 100 ms (measured ~10 ms on an idle machine)


def test_messages_that_cannot_fit_the_context_are_refused_before_the_template():
    from dgemma_struct.testing import tiny_runtime

    small = tiny_runtime()
    small.max_context = 400   # a short context: 200 messages alone need at least 600 tokens
    n = min(MAX_MESSAGES, small.max_context // MIN_TOKENS_PER_MESSAGE + 1)
    with running_server(small, max_tokens_cap=16, default_max_tokens=8) as u:
        times = []
        for _ in range(3):
            r, s = _post(u, [{"role": "user", "content": "hi"}] * n)
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
            times.append(s)
    assert min(times) < 0.3, times


def test_a_small_request_is_not_held_up_by_message_floods(url):
    msg = [{"role": "user", "content": "warm"}]
    _, idle = _post(url, msg, guided_choice=["yes", "no"])
    _, idle = _post(url, msg, guided_choice=["yes", "no"])
    floods = [threading.Thread(target=_post, args=(url, [{"role": "user", "content": "hi"}] * 3000))
              for _ in range(4)]
    for t in floods:
        t.start()
    r, s = _post(url, msg, guided_choice=["yes", "no"])
    for t in floods:
        t.join()
    assert r.status_code == 200
    assert s < max(2 * idle, 1.0), (s, idle)


def test_the_python_api_refuses_a_message_flood_before_the_template(monkeypatch):
    """3,000 tiny messages cannot fit a 4,096-token context: PromptTooLongError in milliseconds, the
    chat template never runs (it took 14.5 s to get there)."""
    import dgemma_struct as ds
    from dgemma_struct.errors import PromptTooLongError
    from dgemma_struct.testing import tiny_runtime

    rt = tiny_runtime()
    rt.tokenizer.chat_template = rt.tokenizer.chat_template or "{% for m in messages %}{{ m.content }}{% endfor %}"
    rt.max_context = 4096
    rendered = []
    real = rt.tokenizer.apply_chat_template
    monkeypatch.setattr(rt.tokenizer, "apply_chat_template", lambda *a, **k: (rendered.append(1), real(*a, **k))[1])
    flood = [{"role": "user", "content": "hi"}] * 3000
    t0 = time.perf_counter()
    with pytest.raises(PromptTooLongError, match="3000 chat messages"):
        ds.generate_json(flood, {"type": "integer"}, runtime=rt, max_new_tokens=8)
    assert time.perf_counter() - t0 < 1.0 and rendered == []
    ok = [{"role": "system", "content": "s"}] + [{"role": "user", "content": "hi"}] * 4
    assert rt.encode_prompt(ok) and rendered == [1]


def test_a_template_past_its_deadline_is_refused_and_the_server_goes_on(monkeypatch):
    """A chat template that does not finish (a pathological custom template that loops) costs its
    request a 400 once its render has spent the deadline in CPU time; the server keeps answering."""
    from dgemma_struct.server import template_render
    from dgemma_struct.testing import tiny_runtime

    rt = tiny_runtime()
    monkeypatch.setattr(template_render, "TEMPLATE_DEADLINE_S", 0.3)
    real = rt.encode_prompt
    def spin(seconds: float) -> None:   # a loop that burns CPU, as a runaway template does
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    monkeypatch.setattr(rt, "encode_prompt",
                        lambda p: (spin(4.0) if "slow" in str(p) else None, real(p))[1])
    with running_server(rt, max_tokens_cap=16, default_max_tokens=8, warmup=False) as u:
        r, s = _post(u, [{"role": "user", "content": "slow"}])
        assert r.status_code == 400 and r.json()["error"]["code"] == "prompt_too_complex", r.text
        assert s < 3.5, s    # answered before the 4 s render ends
        r, _ = _post(u, [{"role": "user", "content": "fast"}])
        assert r.status_code == 200, r.text


def test_a_render_that_waits_for_a_core_is_not_refused(monkeypatch):
    """Waiting is not rendering: a render that sits past the deadline without burning CPU (here a sleep,
    on a loaded host a thread waiting for its core) is answered, not refused as too complex (CI once saw
    Ray replicas on two cores refuse ordinary prompts on a wall-clock deadline)."""
    from dgemma_struct.server import template_render
    from dgemma_struct.testing import tiny_runtime

    rt = tiny_runtime()
    monkeypatch.setattr(template_render, "TEMPLATE_DEADLINE_S", 0.3)
    real = rt.encode_prompt
    monkeypatch.setattr(rt, "encode_prompt", lambda p: (time.sleep(1.0), real(p))[1])
    with running_server(rt, max_tokens_cap=16, default_max_tokens=8, warmup=False) as u:
        r, _ = _post(u, [{"role": "user", "content": "hi"}])
        assert r.status_code == 200, r.text
