"""``dgemma-struct serve`` as a subprocess: --model (a local checkpoint dir), env vars, 127.0.0.1."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_a_local_checkpoint(rt, tmp_path):
    rt.model.save_pretrained(tmp_path)
    rt.tokenizer.save_pretrained(tmp_path)
    port = _free_port()
    env = dict(os.environ, DGEMMA_STRUCT_PORT=str(port), DGEMMA_STRUCT_API_KEY="k1", OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, "-m", "dgemma_struct.cli", "serve", "--model", str(tmp_path),
                             "--log-level", "warning"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                out = proc.stdout.read().decode() if proc.poll() is not None else ""
                pytest.fail(f"the server did not come up: {out[-2000:]}")
            time.sleep(0.2)
        h = {"Authorization": "Bearer k1"}
        assert httpx.get(url + "/v1/models").status_code == 401
        models = httpx.get(url + "/v1/models", headers=h).json()
        assert models["data"][0]["id"] == tmp_path.name
        r = httpx.post(url + "/v1/chat/completions", headers=h, timeout=60,
                       json={"messages": [{"role": "user", "content": "hi"}], "guided_choice": ["on", "off"],
                             "max_tokens": 8})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] in ("on", "off")
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_serve_rejects_a_missing_model_dir(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dgemma_struct.cli", "serve", "--model", str(tmp_path / "nope"),
                           "--port", str(_free_port())], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 2 and "local checkpoint directory" in proc.stderr
