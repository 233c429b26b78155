"""examples/responses_client.py runs against the server: parse, stream, a function and a custom tool call;
and, as the script does without ``--base-url``, offline against the embedded model it serves itself."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import lark

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "responses_client.py"


def _load():
    spec = importlib.util.spec_from_file_location("example_responses_client", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_example_against_the_server(server_url):
    mod = _load()
    out = mod.main(server_url + "/v1")
    assert isinstance(out["person"], mod.Person) and isinstance(out["streamed"], mod.Person)
    assert set(json.loads(out["function_call"].arguments)) == {"city"}
    lark.Lark(mod.ARITHMETIC).parse(out["custom_tool_call"].input)


def test_example_serves_the_embedded_model_itself():
    mod = _load()
    with mod.local_server() as url:          # what the script does without --base-url: offline, loopback
        out = mod.main(url, max_output_tokens=64)
    lark.Lark(mod.ARITHMETIC).parse(out["custom_tool_call"].input)
