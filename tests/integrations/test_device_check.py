"""benchmarks/device_check.py, the one prepared GPU script, cannot rot: its ``--cpu-smoke`` run (every
part with tiny shapes on the CPU) passes and writes each part's results as it finishes; the wheel
list covers what the package imports."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dgemma_struct.testing import embedded_model_available

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "device_check.py"


@pytest.mark.skipif(not embedded_model_available(), reason="embedded checkpoint missing")
def test_cpu_smoke_runs_every_part(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DGEMMA_STRUCT_")}
    env.update(OMP_NUM_THREADS="1", OUT=str(tmp_path))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--cpu-smoke"], capture_output=True, text=True,
                          timeout=400, env=env, cwd=tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert proc.returncode == 0, (summary, proc.stdout[-3000:], proc.stderr[-3000:])
    assert summary["parts"] == dict.fromkeys("abcde", "ok")
    lines = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert lines[0]["part"] == "head" and lines[0]["smoke"] is True
    for p in "abcde":
        assert json.loads((tmp_path / f"{p}.json").read_text())["status"] == "ok"
        assert sum(x["part"] == p for x in lines) >= 2  # measurements, then the part's closing line
    c = json.loads((tmp_path / "c.json").read_text())["result"]
    assert c["ok"] == c["total"] >= 15, [k for k, v in c["paths"].items() if not v["ok"]]
    d = json.loads((tmp_path / "d.json").read_text())["result"]
    assert d["ok_200"] == d["valid"] == d["requests"]
    e = json.loads((tmp_path / "e.json").read_text())["result"]
    assert e["diffusion"]["batch_valid"] == e["ar"]["batch_valid"] == e["n"]
    b = json.loads((tmp_path / "b.json").read_text())["result"]
    assert {(r["arm"], r["B"]) for r in b["rows"]} == {(a, n) for a in ("json", "free") for n in (1, 2)}


def test_a_failing_part_is_recorded_and_the_rest_still_run(tmp_path):
    """A part that raises or overruns its budget is written down as such, and the next part runs."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import device_check as dc
    finally:
        sys.path.remove(str(SCRIPT.parent))
    run = dc.Run(tmp_path, smoke=True)
    bad = run.part("x", lambda r: 1 / 0, 5)
    good = run.part("y", lambda r: {"fine": True}, 5)
    slow = run.part("z", lambda r: __import__("time").sleep(3), 0.2)
    assert (bad["status"], good["status"], slow["status"]) == ("error", "ok", "timeout")
    assert "ZeroDivisionError" in json.loads((tmp_path / "x.json").read_text())["error"]
    assert [json.loads(x)["part"] for x in (tmp_path / "results.jsonl").read_text().splitlines()] == ["x", "y", "z"]


def test_wheel_list_covers_the_runtime_dependencies():
    """Every runtime dependency in pyproject.toml (and the server extra) is in the wheel list,
    torch aside (preinstalled on the GPU box)."""
    import re

    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    wheels = {w.split("==")[0] for w in subprocess.run([sys.executable, str(SCRIPT), "--print-wheels"],
                                                       capture_output=True, text=True, check=True).stdout.split()}
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needed = meta["dependencies"] + meta["optional-dependencies"]["server"]
    names = {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in needed}
    assert names - {"torch"} <= wheels, names - {"torch"} - wheels
