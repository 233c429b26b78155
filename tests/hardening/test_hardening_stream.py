"""#15.6: streams never end in a 5xx for something that is not a server fault. The default
stream sends only validated text (it cannot diverge); ``stream_live`` streams canvases and, if a
repair rewrites sent text, ends with a 4xx-class ``stream_diverged`` event."""
from __future__ import annotations

import json

import httpx
import pytest
from server_harness import running_server

MSG = [{"role": "user", "content": "Give the answer as JSON."}]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 9},
                                           "tags": {"type": "array", "items": {"type": "string"},
                                                    "uniqueItems": True, "maxItems": 3}},
          "required": ["name", "n", "tags"], "additionalProperties": False}


def _events(c: httpx.Client, body: dict) -> tuple[int, list]:
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, [r.json()]
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]" or "error" in json.loads(lines[-1][6:])
    return 200, [json.loads(ln[6:]) for ln in lines if ln != "data: [DONE]"]


@pytest.mark.parametrize("live", [False, True], ids=["validated", "live"])
def test_streams_never_end_in_a_5xx(rt, live):
    with running_server(rt, stream_live=live, max_tokens_cap=128) as url, \
            httpx.Client(base_url=url, timeout=120) as c:
        finishes = []
        for seed in range(6):
            status, events = _events(c, {"messages": MSG, "max_tokens": 64, "seed": seed, "stream": True,
                                         "guided_json": SCHEMA})
            assert status < 500
            last = events[-1]
            if "error" in last:
                assert last["error"]["status"] < 500 and last["error"]["code"], last
                assert not live or last["error"]["code"] in ("stream_diverged", "generation_failed")
                continue
            finishes.append(last["choices"][0]["finish_reason"])
            if finishes[-1] == "stop":
                text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
                json.loads(text)
        assert finishes and set(finishes) <= {"stop", "length"}
        # cut by max_tokens: finish_reason "length" in both modes, never an error or "stop"
        status, events = _events(c, {"messages": MSG, "max_tokens": 16, "stream": True,
                                     "guided_regex": "[0-9]{200}"})
        assert status == 200 and events[-1]["choices"][0]["finish_reason"] == "length"
