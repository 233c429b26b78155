"""The examples run: the FastAPI app (TestClient), the property-test example (pytest in a
subprocess), the batch script (small N) against the embedded model; the FastAPI app also against
the tiny random runtime so it is exercised even without the embedded checkpoint."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from dgemma_struct.testing import embedded_model_available

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
needs_embedded = pytest.mark.skipif(
    not embedded_model_available(),
    reason="src/dgemma_struct/embedded/model.safetensors is missing (the embedded model is not trained yet)")
ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
           TOKENIZERS_PARALLELISM="false")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # pydantic resolves the models' annotations through it
    spec.loader.exec_module(mod)
    return mod


ORDER_TEXT = {"text": "ORD-49763 is cancelled: 19 desk for 761.89 per unit."}
CONTACT_TEXT = {"text": "Our contact in Toronto is Quinn Silva, reachable at 707-879-8364."}


def _exercise(client: TestClient, *, expect_ok: bool) -> dict:
    out = {}
    for path, body in [("/orders", ORDER_TEXT), ("/contacts", CONTACT_TEXT), ("/phone", CONTACT_TEXT)]:
        r = client.post(path, json=body)
        assert r.status_code in (200, 422), (path, r.status_code, r.text)      # a value, or a typed error
        if r.status_code == 422:
            assert r.json()["detail"]["code"] in ("length_exceeded", "generation_failed")
        out[path] = r
    if expect_ok:
        assert all(r.status_code == 200 for r in out.values()), {p: r.text for p, r in out.items()}
    return out


def test_fastapi_example_with_a_tiny_runtime():
    from dgemma_struct.testing import tiny_runtime

    mod = _load("fastapi_app")
    with TestClient(mod.build_app(tiny_runtime())) as c:
        out = _exercise(c, expect_ok=False)
        assert any(r.status_code == 200 for r in out.values()), {p: r.text for p, r in out.items()}
        if out["/phone"].status_code == 200:
            assert len(out["/phone"].json()["phone"]) == 12


@needs_embedded
def test_fastapi_example_with_the_embedded_model():
    mod = _load("fastapi_app")
    with TestClient(mod.app) as c:
        out = _exercise(c, expect_ok=True)
    # validity, not accuracy: the accuracy of the embedded model is measured elsewhere
    mod.Order.model_validate(out["/orders"].json())
    mod.Contact.model_validate(out["/contacts"].json())
    assert re.fullmatch(r"\d{3}-\d{3}-\d{4}", out["/phone"].json()["phone"])


@needs_embedded
def test_property_test_example_passes():
    proc = subprocess.run([sys.executable, "-m", "pytest", str(EXAMPLES / "test_properties_example.py"), "-q",
                           "-o", "addopts=", "-p", "no:cacheprovider"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert re.search(r"\b3 passed\b", proc.stdout) and "skipped" not in proc.stdout, proc.stdout[-2000:]


@needs_embedded
def test_batch_extraction_example():
    proc = subprocess.run([sys.executable, str(EXAMPLES / "batch_extraction.py"), "--n", "4", "--batch-size", "4"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert len(rows) == 4
    summary = json.loads(proc.stderr.strip().splitlines()[-1])["summary"]
    assert summary["n"] == 4 and summary["ok"] >= 3
