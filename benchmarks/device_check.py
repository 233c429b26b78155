#!/usr/bin/env python3
"""Everything that needs a GPU, in one call of at most ~6 minutes (issue 22): results are written
under ``$OUT`` (default ``./device_out``) as each part finishes -- ``results.jsonl`` (one line per
measurement, appended as it is made) and ``<part>.json`` per part. Every part runs in try/except,
timed and bounded (SIGALRM); a failing or slow part never stops the others.

  a  kernels: apply-bitmask and masked-stats vs the HBM copy bound (a device copy of the same
     logits), vs the torch path, and vs xgrammar's Triton kernel when importable
  b  a full denoising step at vocab 262,144 / canvas 256 (random weights, bf16), B = 1 / 8 / 32,
     constrained JSON and free text: forward (CUDA events) vs everything else per step, host syncs
     per step (``torch.cuda.set_sync_debug_mode("warn")``, those inside the forward apart) and host
     reads outside the forward (``dgemma_struct.engine.profiling.HostSyncProbe`` when present)
  c  every public path once with the embedded model on the device
  d  ``dgemma-struct serve --device cuda --dtype bf16`` in a subprocess on loopback, 16 concurrent
     JSON requests
  e  the embedded model: 64 held-out JSON requests, one at a time vs one batch of 64, diffusion and AR

Runs offline on a GPU box with only torch + Triton preinstalled: ``bash benchmarks/device_check.sh``
installs the wheels in ./.whl first (list: ``--print-wheels``; see benchmarks/device_check.md). The
package is used from this checkout without installing it. ``--cpu-smoke``: tiny shapes on the CPU
(tests/integrations/test_device_check.py runs it so the script cannot rot).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the project's runtime + server dependencies (and hypothesis, for the synthetic Gemma 4 tokenizer),
# less torch / triton and their own dependencies, which the GPU box already has
WHEELS = """annotated-doc==0.0.7 annotated-types==0.8.0 anyio==4.16.0 arrow==1.4.0 attrs==26.1.0
certifi==2026.10.19.post1 click==8.5.1 fastapi==0.165.0 fqdn==1.6.0 h11==0.16.0 hf-xet==1.8.0 httpcore==1.0.9
httpcore2==2.16.2 httpx==0.29.0 httpx2==2.16.2 huggingface-hub==2.4.0 hypothesis==6.170.9 idna==3.20
isoduration==20.11.0 jsonpointer==3.12 jsonschema==4.26.0 jsonschema-rs==0.60.3 jsonschema-specifications==2025.9.1
lark==1.3.1 llguidance==1.9.1 markdown-it-py==4.3.0 mdurl==0.1.2 numpy==2.4.6 opentelemetry-api==1.45.2
packaging==26.4 prometheus-client==0.26.0 pydantic==2.14.4 pydantic-core==2.50.5 pygments==2.21.0
python-dateutil==4.0.0 pyyaml==6.0.4 referencing==0.37.0 regex==2026.11.19 rfc3339-validator==0.1.4
rfc3986-validator==0.1.1 rfc3987-syntax==1.1.0 rich==14.3.4 rpds-py==2026.9.1 safetensors==0.8.0
shellingham==1.5.4 six==1.17.0 sortedcontainers==2.4.0 starlette==1.10.0 tokenizers==0.23.3 tqdm==4.70.1
transformers==5.23.0 truststore==0.10.5 typer==0.29.2 typing-inspection==0.4.5 tzdata==2026.6
uri-template==1.3.0 uvicorn==0.55.0 webcolors==25.10.0""".split()
BUDGETS = {"a": 55, "b": 105, "c": 55, "d": 60, "e": 65}   # seconds per part on the GPU: 340 s in all
SCHEMA = {"type": "object", "properties": {"note": {"type": "string", "maxLength": 12},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["note", "n"], "additionalProperties": False}
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "email": {"type": "string"}},
          "required": ["name", "age", "email"], "additionalProperties": False}
P_PERSON = "Extract the name, age and email as JSON.\nAlice Gomez is 51 years old and can be reached at alice44@example.com."
P_PHONE = "Give the phone number.\nYou can call Ada on 555-867-5309 after six."
P_SENT = "Classify the sentiment as positive, negative or neutral.\nThe hotel was clean and the view was amazing."


class PartTimeout(Exception):
    """A part ran past its budget."""


def use_checkout() -> None:
    """Import ``dgemma_struct`` from this checkout without installing it: a shadow package that links
    src/dgemma_struct/* plus kernels/ and grammars/ (pyproject's package-dir), on PYTHONPATH for the
    subprocesses too. An installed ``dgemma_struct`` is used as it is."""
    import importlib.util

    if importlib.util.find_spec("dgemma_struct") is not None:
        return
    shadow = Path(tempfile.mkdtemp(prefix="dgemma-struct-")) / "dgemma_struct"
    shadow.mkdir()
    for entry in (ROOT / "src" / "dgemma_struct").iterdir():
        (shadow / entry.name).symlink_to(entry)
    for name in ("kernels", "grammars"):
        (shadow / name).symlink_to(ROOT / name)
    sys.path.insert(0, str(shadow.parent))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(shadow.parent), os.environ.get("PYTHONPATH")]))


class Run:
    """Where results go, and the device every part uses."""

    def __init__(self, out: Path, smoke: bool):
        import torch

        self.out, self.smoke, self.torch = out, smoke, torch
        out.mkdir(parents=True, exist_ok=True)
        self.cuda = torch.cuda.is_available() and not smoke
        self.device = torch.device("cuda" if self.cuda else "cpu")
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self.scale = 1.0 if self.cuda else 0.5

    def line(self, part: str, **rec) -> None:
        with open(self.out / "results.jsonl", "a") as f:
            f.write(json.dumps({"part": part, "t": round(time.time(), 3), **rec}, default=str) + "\n")

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def bench(self, fn, reps: int = 20, warmup: int = 3) -> float:
        """Median milliseconds of ``fn`` (CUDA events on the GPU)."""
        torch = self.torch
        for _ in range(warmup):
            fn()
        self.sync()
        ts = []
        for _ in range(reps if self.cuda else max(2, reps // 10)):
            if self.cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                ts.append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                fn()
                ts.append(1e3 * (time.perf_counter() - t0))
        return sorted(ts)[len(ts) // 2]

    def part(self, name: str, fn, budget_s: float) -> dict:
        def alarm(*_):
            raise PartTimeout(f"part {name} ran past {budget_s:.0f} s")
        old = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, budget_s)
        t0, rec = time.time(), {"part": name}
        try:
            rec.update(status="ok", result=fn(self))
        except PartTimeout as err:
            rec.update(status="timeout", error=str(err))
        except BaseException as err:  # noqa: BLE001 - a part's failure is a result
            rec.update(status="error", error=f"{type(err).__name__}: {err}"[:2000],
                       traceback=traceback.format_exc()[-4000:])
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        rec["wall_s"] = round(time.time() - t0, 2)
        (self.out / f"{name}.json").write_text(json.dumps(rec, indent=1, default=str))
        self.line(name, status=rec["status"], wall_s=rec["wall_s"], error=rec.get("error"))
        print(f"[{name}] {rec['status']} in {rec['wall_s']} s" + (f": {rec.get('error')}" if "error" in rec else ""),
              flush=True)
        return rec


# ----------------------------------------------------------------------------- a: kernels
def part_kernels(run: Run) -> dict:
    torch = run.torch
    from dgemma_struct import kernels as K

    vocab, rows = (262_144, 256) if run.cuda else (4096, 8)
    triton_ok = run.cuda or os.environ.get("TRITON_INTERPRET") == "1"
    backends = ["torch"] + (["triton"] if triton_ok and K.triton_available() else [])
    xgr = None
    try:
        from xgrammar.kernels.apply_token_bitmask_inplace_triton import apply_token_bitmask_inplace_triton as xgr
    except Exception as err:  # noqa: BLE001
        run.line("a", note=f"xgrammar kernel not importable ({type(err).__name__}); no comparison")
    out: dict = {"vocab": vocab, "rows": rows, "backends": backends, "results": []}
    if run.cuda:
        out["auto_backend"] = K.resolve_backend("auto", torch.empty(1, device=run.device))
    gen = torch.Generator(device=run.device).manual_seed(0)
    if run.cuda:  # a canvas's bitmask to the device: from pageable numpy (as llguidance fills it) vs pinned
        import numpy as np

        host = np.zeros((rows, vocab // 32), dtype=np.int32)
        pinned = torch.empty(host.shape, dtype=torch.int32, pin_memory=True)
        dev_buf = torch.empty(host.shape, dtype=torch.int32, device=run.device)
        rec = {"h2d_bitmask_shape": list(host.shape),
               "h2d_pageable_ms": run.bench(lambda: dev_buf.copy_(torch.from_numpy(host), non_blocking=True)),
               "h2d_pinned_ms": run.bench(lambda: dev_buf.copy_(pinned, non_blocking=True))}
        run.line("a", **rec)
        out["h2d"] = rec
    for dtype in (torch.float32, torch.bfloat16):
        logits = (torch.randn(rows, vocab, device=run.device, generator=gen) * 4).to(dtype)
        dst = torch.empty_like(logits)
        copy_ms = run.bench(lambda: dst.copy_(logits))
        for density in (0.01, 0.5):
            allowed = torch.rand(rows, vocab, device=run.device, generator=gen) < density
            bm = K.pack_bool_mask(allowed)
            ref = logits.masked_fill(~allowed, float("-inf"))
            rec = {"dtype": str(dtype), "density": density, "copy_bound_ms": copy_ms}
            for be in backends:
                work = logits.clone()
                K.apply_token_bitmask_(work, bm, backend=be)
                rec[f"apply_{be}_equal"] = bool(torch.equal(work, ref))
                rec[f"apply_{be}_ms"] = run.bench(lambda: K.apply_token_bitmask_(work, bm, backend=be))
                rec[f"apply_{be}_over_copy"] = rec[f"apply_{be}_ms"] / copy_ms
            if xgr is not None:
                try:
                    work = logits.clone()
                    xgr(work, bm)
                    rec["apply_xgrammar_equal"] = bool(torch.equal(work, ref))
                    rec["apply_xgrammar_ms"] = run.bench(lambda: xgr(work, bm))
                except Exception as err:  # noqa: BLE001
                    rec["apply_xgrammar_error"] = f"{type(err).__name__}: {err}"[:300]
            for be in backends:
                for gumbel in (False, True):
                    st = K.masked_stats(logits, bm, temperature=0.8, gumbel=gumbel, seed=1, backend=be)
                    key = f"stats{'_gumbel' if gumbel else ''}_{be}"
                    rec[key + "_ms"] = run.bench(lambda: K.masked_stats(logits, bm, temperature=0.8, gumbel=gumbel,
                                                                        seed=1, backend=be), reps=10)
                    if be != "torch" and not gumbel:
                        sr = K.masked_stats(logits, bm, temperature=0.8, backend="torch")
                        rec[key + "_argmax_equal"] = bool(torch.equal(st.argmax, sr.argmax))
                        rec[key + "_entropy_max_err"] = float((st.entropy - sr.entropy).abs().max())
            run.line("a", **rec)
            out["results"].append(rec)
        del logits, dst
    return out


# ----------------------------------------------------------------------------- b: one denoising step
def _step_runtime(run: Run):
    """Real shape (random weights, bf16) with the Gemma 4 tokenizer from ../shared or a synthetic
    Gemma-4-shaped one; in the smoke run, the embedded model."""
    from dgemma_struct.runtime import DiffusionRuntime
    from dgemma_struct.engine.sampler import DiffusionSettings

    if run.smoke:
        rt = DiffusionRuntime.default(device="cpu", dtype="fp32")
        steps = 2
    else:
        from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion

        from dgemma_struct.engine.model_config import real_shape_config

        found = [d for d in (os.environ.get("DEVICE_CHECK_TOKENIZER"), ROOT.parent / "shared/data/gemma4-tokenizer",
                             ROOT / "shared/data/gemma4-tokenizer") if d and (Path(d) / "tokenizer.json").exists()]
        if found:
            shared = found[0]
        else:  # a synthetic Gemma-4-shaped vocabulary: same size and control-token ids
            from dgemma_struct.testing import gemma4_shaped_tokenizer_dir
            shared = gemma4_shaped_tokenizer_dir()
        run.line("b", tokenizer=str(shared))
        run.torch.manual_seed(0)
        model = DiffusionGemmaForBlockDiffusion(real_shape_config()).eval().to(run.device, run.dtype)
        gc = model.generation_config
        gc.eos_token_id, gc.pad_token_id = [1, 106, 50], 0
        rt, steps = DiffusionRuntime(model, AutoTokenizer.from_pretrained(str(shared)), name="real-shape"), 8
    # a random model never gets confident: exactly ``steps`` steps per canvas
    rt.settings = DiffusionSettings(max_denoising_steps=steps, entropy_bound=0.1, confidence_threshold=1e-9)
    return rt


def _guide(rt, constraint, B: int, max_new: int):
    try:  # step_cost.py keeps this in step with the guide's constructor
        import importlib.util
        spec = importlib.util.spec_from_file_location("_step_cost", ROOT / "benchmarks" / "step_cost.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.guide_for(rt, constraint, B, max_new)
    except (ImportError, AttributeError, FileNotFoundError):
        from dgemma_struct.guide.constraint_guide import ConstraintGuide
        return ConstraintGuide([constraint.canvas_walker() for _ in range(B)], pad_token_id=rt.pad_token_id or 0,
                               budgets=[max_new] * B, close_on_budget=True)


def _measure_step(run: Run, rt, constraint, B: int, max_new: int) -> dict:
    import warnings

    torch = run.torch
    try:
        from dgemma_struct.engine.profiling import HostSyncProbe, model_section
    except ImportError:
        HostSyncProbe, model_section = None, None
    events, caught, in_fwd = [], [], [0]
    model = rt.model
    originals = [(m, m.__dict__.get("forward")) for m in (model, model.model.encoder)]

    def wrap(fwd):
        def forward(*a, **k):
            n0 = len(caught)
            if run.cuda:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
            t0 = time.perf_counter()
            if model_section is not None:
                with model_section():
                    out = fwd(*a, **k)
            else:
                out = fwd(*a, **k)
            if run.cuda:
                e.record()
                events.append((s, e))
            else:
                events.append(time.perf_counter() - t0)
            in_fwd[0] += len(caught) - n0
            return out
        return forward
    for m, _ in originals:
        m.forward = wrap(m.forward)
    probe = HostSyncProbe() if HostSyncProbe is not None else None
    prompt = rt.encode_prompt("Give a note and a number as JSON.")
    try:
        hook = _guide(rt, constraint, B, max_new) if constraint is not None else None
        run.sync()
        with warnings.catch_warnings(record=True) as rec_w:
            warnings.simplefilter("always")
            caught = rec_w
            if run.cuda:
                torch.cuda.set_sync_debug_mode("warn")
            t0 = time.perf_counter()
            if probe is not None:
                with probe:
                    res = rt.generate_ids([prompt] * B, max_new_tokens=max_new, seed=list(range(B)), hook=hook)
            else:
                res = rt.generate_ids([prompt] * B, max_new_tokens=max_new, seed=list(range(B)), hook=hook)
            if run.cuda:
                torch.cuda.set_sync_debug_mode(0)  # the timing's own synchronize is not counted
            run.sync()
            wall = time.perf_counter() - t0
    finally:
        if run.cuda:
            torch.cuda.set_sync_debug_mode(0)
        for m, had in originals:
            if had:
                m.forward = had
            else:
                m.__dict__.pop("forward", None)
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    fwd_s = sum(s.elapsed_time(e) / 1e3 for s, e in events) if run.cuda else sum(events)
    steps = max(1, res[0].stats.denoising_steps)
    return {"B": B, "steps": steps, "forwards": len(events), "wall_ms": 1e3 * wall,
            "forward_ms_per_step": 1e3 * fwd_s / steps, "other_ms_per_step": 1e3 * (wall - fwd_s) / steps,
            "syncs_per_step": syncs / steps if run.cuda else None,
            "syncs_in_forward_per_step": in_fwd[0] / steps if run.cuda else None,
            "host_reads_per_step_outside_forward": probe.total / steps if probe is not None else None,
            "host_reads_by_kind": dict(probe.counts) if probe is not None else None}


def part_step(run: Run) -> dict:
    from dgemma_struct.api import constraint_for

    rt = _step_runtime(run)
    constraint = constraint_for(SCHEMA, rt)
    max_new = rt.model.config.canvas_length
    out = {"vocab": rt.model.config.text_config.vocab_size, "canvas": max_new, "dtype": str(rt.model.dtype),
           "rows": []}
    for arm, c in (("json", constraint), ("free", None)):
        _measure_step(run, rt, c, 1, max_new)  # warm-up (compiles, self-checks, allocator)
        for B in ((1, 8, 32) if run.cuda else (1, 2)):
            best = min((_measure_step(run, rt, c, B, max_new) for _ in range(2)), key=lambda r: r["wall_ms"])
            best["arm"] = arm
            run.line("b", **best)
            out["rows"].append(best)
    return out


# ----------------------------------------------------------------------------- c: public paths
def part_paths(run: Run) -> dict:
    import asyncio

    from dgemma_struct import (Generator, Regex, agenerate_json, generate, generate_batch, generate_choice,
                               generate_grammar, generate_grounded, generate_json, generate_json_batch,
                               generate_regex, generate_tool_calls, stream, stream_json)
    from dgemma_struct.runtime import DiffusionRuntime
    from dgemma_struct.training.dialect_corpus import TOOLS

    rt = DiffusionRuntime.default(device=run.device, dtype=run.dtype)
    grammar = (ROOT / "grammars" / "arithmetic.lark").read_text()
    kw = {"runtime": rt, "seed": 0}
    paths = {
        "generate_json": lambda: generate_json(P_PERSON, PERSON, **kw),
        "generate_json_ar": lambda: generate_json(P_PERSON, PERSON, mode="ar", **kw),
        "generate_regex": lambda: generate_regex(P_PHONE, r"\d{3}-\d{3}-\d{4}", **kw),
        "generate_choice_probabilities": lambda: generate_choice(P_SENT, ["positive", "negative", "neutral"],
                                                                 return_probabilities=True, **kw),
        "generate_grammar": lambda: generate_grammar("Write as an arithmetic expression: 3 plus 4.", grammar, **kw),
        "generate_batch": lambda: [r.value for r in generate_batch([P_PERSON, P_PHONE], [PERSON, Regex(
            r"\d{3}-\d{3}-\d{4}")], **kw)],
        "generate_json_batch": lambda: generate_json_batch([P_PERSON, P_PERSON], PERSON, **kw),
        "stream": lambda: [ev.text for ev in stream(P_PERSON, PERSON, **kw)][-1],
        "stream_json": lambda: list(stream_json(P_PERSON, PERSON, **kw))[-1],
        "logprobs": lambda: [(t.token, round(t.logprob, 3)) for t in
                             generate(P_PHONE, Regex(r"\d{3}-\d{3}-\d{4}"), logprobs=2, return_details=True,
                                      **kw).logprobs[:3]],
        "n": lambda: generate(P_PERSON, PERSON, n=2, **kw),
        "grounded": lambda: generate_grounded(P_PERSON, PERSON, ground="strings", **kw).value,
        "Generator": lambda: (lambda g: [g(P_PERSON), g.batch([P_PERSON, P_PERSON])])(Generator(rt, PERSON)),
        "async": lambda: asyncio.run(agenerate_json(P_PERSON, PERSON, **kw)),
        "thinking": lambda: (lambda r: {"value": r.value, "reasoning": getattr(r, "reasoning", None)})(
            generate_json(P_PERSON, PERSON, thinking=True, return_details=True, **kw)),
        "tool_calls": lambda: [(c.name, c.arguments) for c in generate_tool_calls(
            "What is the weather in Oslo for 3 days?", [TOOLS["get_weather"]], **kw).calls],
        "free_text": lambda: rt.generate(P_PHONE, max_new_tokens=32, seed=0).text,
    }
    out = {"device": str(rt.model.device), "dtype": str(rt.model.dtype), "paths": {}}
    for name, fn in paths.items():
        t0 = time.perf_counter()
        try:
            value = fn()
            rec = {"ok": True, "value": repr(value)[:300]}
        except Exception as err:  # noqa: BLE001
            rec = {"ok": False, "error": f"{type(err).__name__}: {err}"[:500]}
        rec["ms"] = round(1e3 * (time.perf_counter() - t0), 1)
        run.line("c", path=name, **rec)
        out["paths"][name] = rec
    out["ok"] = sum(r["ok"] for r in out["paths"].values())
    out["total"] = len(paths)
    return out


# ----------------------------------------------------------------------------- d: the server
def part_server(run: Run) -> dict:
    import socket
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    device, dtype = ("cuda", "bf16") if run.cuda else ("cpu", "fp32")
    cmd = [sys.executable, "-m", "dgemma_struct.cli", "serve", "--device", device, "--dtype", dtype,
           "--port", str(port), "--max-batch-size", "16", "--compile-workers", "2", "--log-level", "warning"]
    log = open(run.out / "server.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    base = f"http://127.0.0.1:{port}"

    def get(path: str, timeout: float = 5) -> dict:
        with urllib.request.urlopen(base + path, timeout=timeout) as r:
            return json.loads(r.read())
    try:
        t0 = time.time()
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited {proc.returncode}: {(run.out / 'server.log').read_text()[-800:]}")
            try:
                get("/health/ready", 2)
                break
            except OSError:
                time.sleep(0.5)
        ready_s = time.time() - t0
        model = get("/v1/models")["data"][0]["id"]
        n = 16 if run.cuda else 4
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": P_PERSON}], "max_tokens": 64,
                           "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}})

        def one(_):
            t = time.perf_counter()
            req = urllib.request.Request(base + "/v1/chat/completions", data=body.encode(),
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    value = json.loads(json.loads(r.read())["choices"][0]["message"]["content"])
                    return {"status": r.status, "valid": set(value) == set(PERSON["properties"]),
                            "ms": 1e3 * (time.perf_counter() - t)}
            except Exception as err:  # noqa: BLE001
                return {"status": getattr(err, "code", None), "valid": False, "error": str(err)[:200]}
        t1 = time.perf_counter()
        with ThreadPoolExecutor(n) as pool:
            answers = list(pool.map(one, range(n)))
        wall = time.perf_counter() - t1
        out = {"device": device, "dtype": dtype, "ready_s": ready_s, "requests": n,
               "ok_200": sum(a["status"] == 200 for a in answers), "valid": sum(a["valid"] for a in answers),
               "wall_s": wall, "answers": answers, "health": get("/health")}
        run.line("d", **{k: v for k, v in out.items() if k not in ("answers", "health")})
        return out
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


# ----------------------------------------------------------------------------- e: B=1 vs B=64
def part_batch(run: Run) -> dict:
    from dgemma_struct import generate, generate_batch
    from dgemma_struct.runtime import DiffusionRuntime
    from dgemma_struct.training.corpus import make_corpus
    from dgemma_struct.training.evaluate import HELD_OUT_SEED, field_accuracy

    rt = DiffusionRuntime.default(device=run.device, dtype=run.dtype)
    n = 64 if run.cuda else 4
    ex = [e for e in make_corpus(6 * n, seed=HELD_OUT_SEED) if e["kind"] == "json" and not e["thinking"]][:n]
    prompts, schemas = [e["prompt"] for e in ex], [e["schema"] for e in ex]
    generate(prompts[0], schemas[0], runtime=rt, max_new_tokens=96)  # warm-up
    out: dict = {"n": n}
    for mode in ("diffusion", "ar"):
        run.sync()
        t0 = time.perf_counter()
        one = [generate(p, s, runtime=rt, mode=mode, max_new_tokens=96, return_details=True)
               for p, s in zip(prompts, schemas)]
        run.sync()
        t1 = time.perf_counter()
        batch = generate_batch(prompts, schemas, runtime=rt, mode=mode, max_new_tokens=96, return_exceptions=True)
        run.sync()
        t2 = time.perf_counter()
        ok = [r for r in batch if not isinstance(r, Exception)]
        tokens = sum(r.stats.generated_tokens for r in one)
        rec = {"mode": mode, "b1_wall_s": t1 - t0, "b1_ms_per_request": 1e3 * (t1 - t0) / n,
               "b1_ms_per_token": 1e3 * (t1 - t0) / max(1, tokens), "b1_valid_per_s": n / (t1 - t0),
               "batch_wall_s": t2 - t1, "batch_valid": len(ok), "batch_valid_per_s": len(ok) / (t2 - t1),
               "speedup_valid_per_s": (len(ok) / (t2 - t1)) / (n / (t1 - t0)),
               "field_accuracy_b1": sum(field_accuracy(r.value, e["fields"]) for r, e in zip(one, ex)) / n}
        run.line("e", **rec)
        out[mode] = rec
    return out


PARTS = {"a": part_kernels, "b": part_step, "c": part_paths, "d": part_server, "e": part_batch}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU (seconds per part)")
    ap.add_argument("--parts", default="a,b,c,d,e", help="comma-separated subset of a,b,c,d,e")
    ap.add_argument("--out", default=os.environ.get("OUT") or "device_out")
    ap.add_argument("--print-wheels", action="store_true", help="print the wheel list for device_check.sh")
    a = ap.parse_args()
    if a.print_wheels:
        print("\n".join(WHEELS))
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    use_checkout()
    run = Run(Path(a.out), a.cpu_smoke)
    torch = run.torch
    head = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name() if run.cuda else "cpu", "smoke": a.cpu_smoke}
    from importlib.metadata import PackageNotFoundError, version
    for dist in ("triton", "transformers", "llguidance", "fastapi", "uvicorn", "pydantic", "xgrammar"):
        try:
            head[dist] = version(dist)
        except PackageNotFoundError:
            head[dist] = None
    try:
        head["commit"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                                        text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head["commit"] = None
    (run.out / "results.jsonl").write_text("")
    run.line("head", **head)
    print(json.dumps(head), flush=True)
    summary = {}
    for p in [x for x in a.parts.split(",") if x]:
        budget = BUDGETS[p] if run.cuda else BUDGETS[p] * 2
        summary[p] = run.part(p, PARTS[p], budget)["status"]
    (run.out / "summary.json").write_text(json.dumps({"head": head, "parts": summary}, indent=1))
    return 0 if all(s == "ok" for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
