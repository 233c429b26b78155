"""The README's main job, `dgemma-struct demo`, on the embedded model: every value it prints is
valid for its spec, in both modes."""
import json
import re
import subprocess
import sys

import pytest

from dgemma_struct.testing import embedded_model_available

pytestmark = pytest.mark.skipif(not embedded_model_available(), reason="embedded checkpoint missing")


def test_demo_prints_valid_values_in_both_modes():
    out = subprocess.run([sys.executable, "-m", "dgemma_struct.cli", "demo"], capture_output=True, text=True,
                         timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": "", "HOME": "/tmp"}, check=True).stdout
    values = re.findall(r"^\s+(diffusion|ar)\s+value: (.*)  \((\w+)\)$", out, flags=re.M)
    assert [m for m, _, _ in values] == ["diffusion", "ar"] * 3, out
    person = [json.loads(v) for _, v, t in values[:2]]
    assert all(set(p) == {"name", "age", "email"} and isinstance(p["age"], int) for p in person)
    assert all(re.fullmatch(r"\d{4}-\d{2}-\d{2}", json.loads(v)) for _, v, _ in values[2:4])
    assert all(json.loads(v) in ("positive", "negative", "neutral") for _, v, _ in values[4:6])
