"""matches() on the official JSON-Schema-Test-Suite (draft2020-12) and a JSONSchemaBench sample:
no invalid instance may be accepted; valid-but-rejected instances are counted and explained."""
from __future__ import annotations

import gzip
import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest

from dgemma_struct.constraints import compile_constraint
from dgemma_struct.errors import DgemmaStructError

_BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "jsonschemabench_soundness.py"


def _serialise():
    spec = importlib.util.spec_from_file_location("_jsb", _BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.serialise


def test_json_schema_test_suite_draft2020(hf_tok, data_dir):
    root = data_dir / "json-schema-test-suite" / "tests" / "draft2020-12"
    if not root.is_dir():
        pytest.skip("json-schema-test-suite missing")
    serialise = _serialise()
    stats = Counter()
    wrongly_accepted = []
    for f in sorted(root.glob("*.json")):
        for group in json.loads(f.read_text()):
            try:
                c = compile_constraint(group["schema"], tokenizer=hf_tok, use_cache=False)
            except DgemmaStructError as e:
                stats[f"compile: {type(e).__name__}"] += 1
                continue
            stats["compiled"] += 1
            for t in group["tests"]:
                try:
                    text = serialise(group["schema"], t["data"])
                except Exception:
                    stats["unserialisable"] += 1
                    continue
                ok = c.matches(text)
                if not t["valid"] and ok:
                    wrongly_accepted.append((f.name, group["description"], t["description"], text))
                elif t["valid"] and not ok:
                    stats["valid rejected: " + ("grammar" if not c.grammar_accepts(text) else "validator")] += 1
                else:
                    stats["agree"] += 1
    print(dict(stats))
    assert not wrongly_accepted, wrongly_accepted[:5]
    assert stats["compiled"] > 300 and stats["agree"] > 1000


@pytest.mark.parametrize("subset", ["Glaiveai2K", "Github_medium", "Kubernetes", "Synthesized"])
def test_jsonschemabench_sample(hf_tok, data_dir, subset):
    p = data_dir / "jsonschemabench" / f"{subset}.jsonl.gz"
    if not p.exists():
        pytest.skip(f"{p} missing")
    serialise = _serialise()
    n_comp = n = 0
    valid_acc = valid = 0
    with gzip.open(p, "rt") as fh:
        for i, line in enumerate(fh):
            if i >= 25:
                break
            r = json.loads(line)
            n += 1
            try:
                c = compile_constraint(r["schema"], tokenizer=hf_tok, use_cache=False)
            except DgemmaStructError:
                continue
            n_comp += 1
            for t in r["tests"]:
                text = serialise(r["schema"], t["data"])
                ok = c.matches(text)
                if not t["valid"]:
                    # label disputes (format-only negatives the validator accepts) are excluded
                    v = c.validate_text(text)
                    assert not ok or v.ok, (r["id"], text)
                    if ok:
                        assert "format" in t.get("description", "") or "format" in json.dumps(r["schema"])
                else:
                    valid += 1
                    valid_acc += ok
    assert n_comp >= 0.8 * n
    assert valid == 0 or valid_acc >= 0.8 * valid
