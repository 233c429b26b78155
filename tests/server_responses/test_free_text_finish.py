"""Free text that ends in pad (the canvas padded after a short answer) finishes with ``"stop"``, on
chat completions and on the Responses API (``status: "completed"``); only a spent budget is ``"length"``."""
from __future__ import annotations

from conftest import MODEL


def test_short_free_text_is_stop(oai):
    for seed in range(3):
        chat = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hi"}],
                                           max_tokens=96, seed=seed)
        if chat.usage.completion_tokens < 96:
            assert chat.choices[0].finish_reason == "stop", chat
        resp = oai.responses.create(model=MODEL, input="Say hi", max_output_tokens=96, extra_body={"seed": seed})
        if resp.usage.output_tokens < 96:
            assert resp.status == "completed" and resp.incomplete_details is None
    cut = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Write a long story."}],
                                      max_tokens=2, seed=0)
    assert cut.choices[0].finish_reason in ("stop", "length") and cut.usage.completion_tokens <= 2
