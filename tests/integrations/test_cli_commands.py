"""The ``dgemma-struct`` command: every subcommand given bad input ends in one ``error:`` line on
stderr and exit status 2, never a traceback; ``--device`` / ``--dtype`` reach the runtime (CPU
here: CUDA is refused with a typed one-line error where there is none); ``serve --device cpu
--dtype fp32`` serves."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

from dgemma_struct.errors import ModelLoadError
from dgemma_struct.runtime import DiffusionRuntime, resolve_device, resolve_dtype
from dgemma_struct.testing import embedded_model_available

needs_model = pytest.mark.skipif(not embedded_model_available(), reason="embedded checkpoint missing")
NO_CUDA = not torch.cuda.is_available()


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DGEMMA_STRUCT_")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **extra)
    return env


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dgemma_struct.cli", *args], capture_output=True, text=True,
                          timeout=180, env=_env(**env), cwd=os.getcwd())


# (argv, env, text the error line must hold); the first of each subcommand runs in a subprocess
# (the real console entry point, its imports and exit status), the rest through main() in-process
BAD = [
    (["demo", "--threads", "0"], {}, "--threads"),
    (["eval", "--model", "/nonexistent"], {}, "'/nonexistent' is not one"),
    (["train", "--batch-size", "0"], {}, "--batch-size"),
    (["serve", "--dtype", "fp8"], {}, "unknown dtype 'fp8'"),
    (["frobnicate"], {}, "invalid choice"),
]
BAD_IN_PROCESS = [
    (["demo", "--seed", "-1"], {}, "--seed"),
    (["demo", "--threads", "x"], {}, "expected an integer"),
    (["demo", "--dtype", "int8"], {}, "unknown dtype 'int8'"),
    (["demo", "--device", "tpu"], {}, "unknown device 'tpu'"),
    (["eval", "--n", "0"], {}, "--n"),
    (["eval", "--dtype", "float64"], {}, "unknown dtype"),
    (["train", "--minutes", "-3"], {}, "--minutes"),
    (["train", "--device", "cuda:x", "--out", "unused"], {}, "unknown device"),
    (["serve", "--port", "70000"], {}, "--port"),
    (["serve", "--max-batch-size", "0"], {}, "--max-batch-size"),
    (["serve"], {"DGEMMA_STRUCT_DEVICE": "tpu"}, "unknown device 'tpu'"),
    (["serve"], {"DGEMMA_STRUCT_PORT": "eighty"}, "DGEMMA_STRUCT_PORT"),
    (["serve", "--model", "/nonexistent"], {}, "/nonexistent"),
]
if NO_CUDA:
    BAD += [(["serve", "--device", "cuda", "--dtype", "bf16"], {}, "CUDA is not available")]
    BAD_IN_PROCESS += [(["demo", "--device", "cuda"], {}, "CUDA is not available"),
                       (["eval", "--device", "cuda:1"], {}, "CUDA is not available"),
                       (["train", "--device", "cuda", "--out", "unused"], {}, "CUDA is not available")]


def _assert_one_line_error(proc: subprocess.CompletedProcess, needle: str) -> None:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    assert needle in lines[0], lines[0]


def _ids(cases):
    return [" ".join(a) + (" " + " ".join(f"{k}={v}" for k, v in e.items()) if e else "") for a, e, _ in cases]


@pytest.mark.parametrize("args,env,needle", BAD, ids=_ids(BAD))
def test_bad_input_is_one_line_error_with_exit_2(args, env, needle):
    _assert_one_line_error(_run(args, **env), needle)


@pytest.mark.parametrize("args,env,needle", BAD_IN_PROCESS, ids=_ids(BAD_IN_PROCESS))
def test_bad_input_in_process(args, env, needle, capsys, monkeypatch):
    from dgemma_struct.cli import main

    for k in [k for k in os.environ if k.startswith("DGEMMA_STRUCT_")]:
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    try:
        rc = main(args)
    except SystemExit as stop:  # argparse
        rc = stop.code
    err = capsys.readouterr().err
    _assert_one_line_error(subprocess.CompletedProcess(args, rc, "", err), needle)


def test_train_resume_without_saved_state_is_one_line(tmp_path):
    proc = _run(["train", "--resume", "--out", str(tmp_path / "empty"), "--device", "cpu"])
    _assert_one_line_error(proc, "no saved training state")
    assert not (tmp_path / "empty").exists()  # refused before anything is written


def test_error_check_can_fail():
    """The helper above really rejects a traceback and a multi-line error."""
    bad = subprocess.CompletedProcess([], 2, "", "Traceback (most recent call last):\nerror: x\n")
    with pytest.raises(AssertionError):
        _assert_one_line_error(bad, "x")


# ----------------------------------------------------------------------------- device / dtype
@pytest.mark.parametrize("given,expected", [("cpu", "cpu"), (torch.device("cpu"), "cpu"), ("CPU", "cpu")]
                         + ([("auto", "cpu"), (None, "cpu")] if NO_CUDA else []))
def test_resolve_device(given, expected):
    assert resolve_device(given) == torch.device(expected)


@pytest.mark.parametrize("given,expected", [("auto", torch.float32), ("bf16", torch.bfloat16),
                                            ("bfloat16", torch.bfloat16), ("fp16", torch.float16),
                                            ("float16", torch.float16), ("fp32", torch.float32),
                                            ("float32", torch.float32), (torch.bfloat16, torch.bfloat16)])
def test_resolve_dtype_on_cpu(given, expected):
    assert resolve_dtype(given, torch.device("cpu")) == expected


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "", "gpu0"] + (["cuda", "cuda:0", "cuda:3"] if NO_CUDA else []))
def test_bad_device_is_a_model_load_error(device):
    with pytest.raises(ModelLoadError) as info:
        resolve_device(device)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("dtype", ["int8", "fp64", torch.int32, torch.float64])
def test_bad_dtype_is_a_model_load_error(dtype):
    with pytest.raises(ModelLoadError):
        resolve_dtype(dtype, torch.device("cpu"))


@needs_model
def test_default_runtime_is_cached_per_device_and_dtype():
    a = DiffusionRuntime.default()
    assert a is DiffusionRuntime.default("cpu" if NO_CUDA else "cuda", "auto")
    b = DiffusionRuntime.default("cpu", "bf16")
    assert b is not a and b.model.dtype == torch.bfloat16 and b.model.device.type == "cpu"
    assert b is DiffusionRuntime.default(torch.device("cpu"), torch.bfloat16)
    out = b.generate("Give the phone number.\nYou can call Ada on 555-867-5309 after six.", max_new_tokens=16,
                     seed=0)
    assert out.stats.forward_passes > 0


@needs_model
def test_from_pretrained_takes_device_and_dtype():
    from dgemma_struct.runtime import EMBEDDED_DIR

    rt = DiffusionRuntime.from_pretrained(EMBEDDED_DIR, device="cpu", dtype="fp16", local_files_only=True)
    assert rt.model.dtype == torch.float16 and rt.model.device == torch.device("cpu")
    if NO_CUDA:
        with pytest.raises(ModelLoadError, match="CUDA is not available"):
            DiffusionRuntime.from_pretrained(EMBEDDED_DIR, device="cuda", local_files_only=True)


def test_train_runs_with_device_and_autocast_and_resumes(tmp_path):
    from dgemma_struct.training.train import train

    kw = dict(corpus_size=300, vocab_size=400, batch_size=2, threads=1, device="cpu", log_every=1)
    meta = train(tmp_path, max_steps=1, dtype="bf16", **kw)
    assert meta["device"] == "cpu" and meta["autocast"] == "bfloat16" and meta["steps"] == 1
    meta = train(tmp_path, max_steps=2, dtype="fp32", resume=True, **kw)
    assert meta["steps"] == 2 and meta["autocast"] is None
    assert len(json.loads((tmp_path / "training_log.json").read_text())) == 2


# ----------------------------------------------------------------------------- serve on the CPU
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_model
def test_serve_on_cpu_with_explicit_device_and_dtype():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "dgemma_struct.cli", "serve", "--device", "cpu", "--dtype", "fp32",
                             "--port", str(port), "--compile-workers", "1", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        deadline, ready = time.monotonic() + 120, False
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/ready", timeout=2) as r:
                    ready = r.status == 200
                    break
            except OSError:
                time.sleep(0.5)
        assert ready, proc.stderr.read() if proc.poll() is not None else "not ready in 120 s"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
            model = json.loads(r.read())["data"][0]["id"]
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Give the phone number.\n"
                           "You can call Ada on 555-867-5309 after six."}], "max_tokens": 16,
                           "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {
                               "type": "string", "pattern": r"^\d{3}-\d{3}-\d{4}$"}}}}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            content = json.loads(r.read())["choices"][0]["message"]["content"]
        assert json.loads(content).count("-") == 2
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
