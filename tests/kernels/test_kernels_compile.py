"""Every ``@triton.jit`` kernel in ``kernels/`` compiles ahead of time for a real CUDA target
(sm_90, through PTX to a cubin when ptxas is bundled), on a CPU box without a GPU or driver.

The interpreter (``TRITON_INTERPRET=1``, which tests/conftest.py sets on CPU machines) runs
kernels as numpy and type-checks nothing, so a kernel can pass every interpreted test and fail
to build on a GPU (issue 22: ``tl.maximum(u, 1.0e-38)`` is typed float64 and Triton 3.6 rejects
the loop). The compile runs in a subprocess without ``TRITON_INTERPRET``.

Kernels are found automatically (JITFunction objects in every module of the package, and
``@triton.jit`` functions in every file of kernels/): one without an entry in :data:`SIGNATURES`
fails the test, so a new kernel cannot escape it.
"""
from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

KERNELS_DIR = Path(__file__).resolve().parents[2] / "kernels"
ARCH = 90  # sm_90 (H100 / H200)

_APPLY = {"logits_ptr": "*{dt}", "logits_row_stride": "i32", "bitmask_ptr": "*i32", "bitmask_row_stride": "i32",
          "indices_ptr": "*i64", "vocab_size": "i32", "HAS_INDICES": "constexpr", "BLOCK": "constexpr"}
_STATS = {"logits_ptr": "*{dt}", "logits_row_stride": "i32", "bitmask_ptr": "*i32", "bitmask_row_stride": "i32",
          "temp_ptr": "*fp32", "out_max_ptr": "*fp32", "out_argmax_ptr": "*i64", "out_lse_ptr": "*fp32",
          "out_entropy_ptr": "*fp32", "out_sample_ptr": "*i64", "vocab_size": "i32", "seed": "i32",
          "HAS_MASK": "constexpr", "GUMBEL": "constexpr", "BLOCK": "constexpr"}

# "module:kernel" -> list of (signature with {dt} for the logits dtype, dtypes, constexpr variants).
SIGNATURES: dict[str, list[tuple[dict, tuple[str, ...], list[dict]]]] = {
    "dgemma_struct.kernels.triton_masking:_apply_bitmask_kernel": [
        (_APPLY, ("fp32", "bf16", "fp16"), [{"HAS_INDICES": True, "BLOCK": 4096}]),
        (_APPLY, ("bf16",), [{"HAS_INDICES": False, "BLOCK": 4096}]),
    ],
    "dgemma_struct.kernels.triton_masking:_masked_stats_kernel": [
        (_STATS, ("fp32", "bf16"), [{"HAS_MASK": True, "GUMBEL": True, "BLOCK": 2048}]),
        (_STATS, ("fp32",), [{"HAS_MASK": m, "GUMBEL": g, "BLOCK": 2048}
                             for m, g in ((True, False), (False, True), (False, False))]),
    ],
}

_CHILD = r'''
import importlib, json, pkgutil, sys, traceback
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile as tcompile
from triton.runtime.jit import JITFunction
import dgemma_struct.kernels as pkg

spec = json.loads(sys.argv[1])
found = {}
for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
    mod = importlib.import_module(m.name)
    for name, obj in vars(mod).items():
        if isinstance(obj, JITFunction) and obj.__module__ == mod.__name__:
            found[f"{mod.__name__}:{name}"] = obj
results = []
for key, fn in sorted(found.items()):
    for sig, constexprs in spec.get(key, []):
        rec = {"kernel": key, "signature": sig, "constexprs": constexprs}
        try:
            k = tcompile(ASTSource(fn, sig, constexprs), target=GPUTarget("cuda", ARCH, 32))
            rec["stages"] = sorted(k.asm)
            rec["ok"] = "ptx" in k.asm
        except Exception as err:
            rec["ok"] = False
            rec["error"] = "".join(traceback.format_exception_only(type(err), err))[-2000:]
        results.append(rec)
import os
ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
print(json.dumps({"triton": triton.__version__, "found": sorted(found), "results": results,
                  "ptxas": os.access(ptxas, os.X_OK)}))
'''.replace("ARCH", str(ARCH))


def _expand() -> dict[str, list]:
    out: dict[str, list] = {}
    for key, entries in SIGNATURES.items():
        for sig, dtypes, variants in entries:
            for dt in dtypes:
                for cx in variants:
                    out.setdefault(key, []).append(({k: v.format(dt=dt) for k, v in sig.items()}, cx))
    return out


def _compile_all() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory() as cache:
        env["TRITON_CACHE_DIR"] = cache  # a real compile every run, never a cache hit
        env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
        proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(_expand())], capture_output=True,
                              text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _jit_functions_in_files() -> dict[str, ast.FunctionDef]:
    """``module:name`` -> function node, for every function decorated with ``triton.jit`` / ``jit``."""
    out = {}
    for path in sorted(KERNELS_DIR.rglob("*.py")):
        rel = path.relative_to(KERNELS_DIR).with_suffix("")
        module = ".".join(("dgemma_struct", "kernels", *rel.parts)).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                for d in node.decorator_list:
                    target = d.func if isinstance(d, ast.Call) else d
                    if ast.unparse(target) in ("triton.jit", "jit"):
                        out[f"{module}:{node.name}"] = node
    return out


def float64_literals(fn: ast.FunctionDef) -> list[str]:
    """Float literals Triton types as float64 (non-zero, finite, outside float32's normal range):
    mixed into float32 values they turn a kernel's arithmetic into fp64 (or fail to compile)."""
    bad = []
    for node in ast.walk(fn):
        value = None
        if isinstance(node, ast.Constant) and isinstance(node.value, float):
            value = node.value
        elif (isinstance(node, ast.Call) and ast.unparse(node.func) == "float" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            value = float(node.args[0].value)
        if value is None or value == 0 or math.isinf(value) or math.isnan(value):
            continue
        if not 2.0 ** -126 <= abs(value) <= (2 - 2.0 ** -23) * 2.0 ** 127:
            bad.append(f"line {node.lineno}: {value!r}")
    return bad


def test_every_kernel_has_a_signature_and_no_float64_literal():
    found = _jit_functions_in_files()
    assert found, "no @triton.jit kernel found in kernels/"
    missing = sorted(set(found) - set(SIGNATURES))
    assert not missing, f"kernels without a compile signature in {__file__}: {missing}"
    bad = {k: float64_literals(fn) for k, fn in found.items()}
    assert not any(bad.values()), f"float literals Triton types as float64: {bad}"


def test_float64_literal_check_can_fail():
    fn = ast.parse("def k(u):\n    return tl.maximum(u, 1.0e-38) + float('1e-40') + 1e-30\n").body[0]
    assert sorted(float64_literals(fn)) == ["line 2: 1e-38", "line 2: 1e-40"]


@pytest.mark.skipif(__import__("importlib.util").util.find_spec("triton") is None, reason="triton not installed")
def test_every_kernel_compiles_for_sm90():
    report = _compile_all()
    found = set(report["found"])
    assert found == set(_jit_functions_in_files()), "runtime and source discovery disagree"
    assert not found - set(SIGNATURES), f"kernels without a compile signature: {sorted(found - set(SIGNATURES))}"
    failed = [r for r in report["results"] if not r["ok"]]
    assert not failed, json.dumps(failed, indent=1)
    assert len(report["results"]) == sum(len(v) for v in _expand().values())
    stages = {"ttir", "ttgir", "llir", "ptx"} | ({"cubin"} if report["ptxas"] else set())
    for r in report["results"]:
        assert stages <= set(r["stages"]), r
