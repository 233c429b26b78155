"""examples/responses_client.py runs against the server: parse, stream, a function and a custom tool call;
and as a script, offline, serving the embedded model itself."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
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


def test_example_runs_as_a_script_offline():
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    done = subprocess.run([sys.executable, str(EXAMPLE)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "custom_tool_call: calc" in done.stdout and "function_call: get_weather" in done.stdout
