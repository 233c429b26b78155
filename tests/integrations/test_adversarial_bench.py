"""A smoke run of benchmarks/adversarial.py (issue #26): a few corpus cases per group through the
subprocess runner (a worker death is attributed, not fatal), and the md generated from the json."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("adversarial_bench", ROOT / "benchmarks" / "adversarial.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_runner_counts_a_few_cases_per_group_and_renders_the_md():
    A = _bench()
    cases = A.corpus(smoke=True)
    pick, seen = [], {}
    for c in cases:   # two cases per group keep it well under a minute
        if seen.get(c["group"], 0) < 2 and c["group"] not in ("huge_choices", "deep_nesting"):
            seen[c["group"]] = seen.get(c["group"], 0) + 1
            pick.append(c)
    runner = A.Runner(smoke=True, case_timeout_s=60)
    recs = runner.run([c["id"] for c in pick], print)
    assert set(recs) == {c["id"] for c in pick}
    assert all(r["outcome"] in A.OUTCOMES for r in recs.values()), recs
    api = A.summarize_api(pick, recs)
    api["workers"] = runner.workers
    assert api["total"]["cases"] == len(pick) and api["total"]["crash"] == 0 and api["total"]["hang"] == 0
    result = {"meta": {"date": "d", "smoke": True, "cpu_count": 1, "platform": "p", "python": "3",
                       "tree": {"commit": "0" * 40, "dirty": False}, "case_timeout_s": 60, "server_args": [],
                       "shared_data": False, "wall_s_total": 1.0}, "api": api, "server": None}
    result["targets"] = A.targets(result)
    md = A.markdown(result)
    assert "SMOKE RUN" in md and "| **total** |" in md and "Not run" in md


def test_a_dead_worker_is_counted_as_a_crash_of_its_case():
    A = _bench()
    runner = A.Runner(smoke=True, case_timeout_s=60)
    # a worker that announces its first case and dies at once (as a native crash would)
    runner.worker_cmd = [sys.executable, "-c", "import json, os, sys; ids = json.loads(sys.stdin.read()); "
                         "print('START ' + ids[0], flush=True); os.abort()"]
    recs = runner.run(["x:0", "x:1"], print)
    assert set(recs) == {"x:0", "x:1"} and {r["outcome"] for r in recs.values()} == {"crash"}
    assert runner.workers == 4   # each case: its batch worker died, then it died alone too
