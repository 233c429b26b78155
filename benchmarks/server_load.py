"""Server load (issue #14): the OpenAI-compatible server under C concurrent JSON-schema clients
(default C = 1, 8, 32, 64), this tree and (``--old-src``) an older one in the same run: valid
req/s, p50 / p99 latency, errors (non-200 or transport failure) and invalid outputs (every
returned ``content`` is checked here with ``jsonschema``, format checker on); then streaming
(``stream: true``): time to the first SSE chunk with non-empty ``delta.content`` at 1 and 8
concurrent streaming clients.

One server at a time: ``dgemma-struct serve`` (its CLI ``main``, started in a subprocess with
``PYTHONPATH`` = the tree's ``src``; the editable install's ``kernels``/``grammars`` re-pointed at
the tree) on 127.0.0.1 at a free port, the embedded model, the server's default settings unless
``--server-args`` says otherwise; the benchmark waits for ``GET /health`` = 200, sends every
distinct schema once (compile caches), then runs the levels. Each client of a level sends requests
back to back until ``--duration-s`` has passed, then finishes its request in flight; req/s = valid
responses / (time until the last client finished). Request ``k`` of a level uses held-out corpus
example ``k`` (cycled) and ``seed: k``, so both trees get the same request sequence.
``--rounds 2`` runs old, new, new, old (a fresh server each time) and pools the rounds.

    git worktree add --detach /tmp/old_bench <old commit>
    OMP_NUM_THREADS=1 python benchmarks/server_load.py --old-src /tmp/old_bench/src          # full run
    OMP_NUM_THREADS=1 python benchmarks/server_load.py --clients 1 2 --stream-clients 1 2 \\
        --duration-s 10 --stream-duration-s 5                                              # smoke run

Writes ``docs/results/server_load.{json,md}`` and ``docs/img/server_load.png``.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from batch_scaling import (ROOT, held_out, pin_tree, schema_checker, tree_info, tree_root,  # noqa: E402
                           write_results)


# ---------------------------------------------------------------- the server process

def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``dgemma-struct serve`` from one tree, in its own process group."""

    def __init__(self, label: str, root: Path, extra: list[str], threads: int, logdir: Path, tag: str):
        self.label, self.root = label, root
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = logdir / f"server_{tag}.log"
        self.log = open(self.log_path, "w")
        self.args = ["serve", "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning", *extra]
        env = dict(os.environ, PYTHONPATH=str(root / "src"), OMP_NUM_THREADS=str(threads),
                   MKL_NUM_THREADS=str(threads))
        env.pop("DGEMMA_STRUCT_API_KEY", None)
        env.pop("DGEMMA_STRUCT_MODEL", None)
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve-tree", str(root),
                                      "--", *self.args], env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def tail(self, n: int = 3000) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-n:]

    async def wait_ready(self, client, timeout_s: float) -> float:
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"server {self.label} exited with {self.proc.returncode}; log:\n{self.tail()}")
            try:
                r = await client.get(self.base + "/health", timeout=5)
                if r.status_code == 200:
                    return time.perf_counter() - self.t0
            except Exception:  # noqa: BLE001 - not listening yet
                pass
            await asyncio.sleep(0.5)
        self.stop()
        raise SystemExit(f"server {self.label} not healthy after {timeout_s:.0f}s; log:\n{self.tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)       # uvicorn's graceful shutdown
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log.close()


def serve_tree(root: str, argv: list[str]) -> None:
    """The server process: import ``dgemma_struct`` from ``root``, then run its CLI."""
    pin_tree(root)
    from dgemma_struct.cli import main as cli_main
    sys.exit(cli_main(argv))


# ---------------------------------------------------------------- clients

def percentile(xs: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100), linear interpolation between order statistics."""
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


class Load:
    """One level: C clients sending requests back to back until the deadline."""

    def __init__(self, corpus: list[dict], check, a: argparse.Namespace, model: str):
        self.corpus, self.check, self.a, self.model = corpus, check, a, model

    def payload(self, k: int, stream: bool) -> tuple[dict, dict]:
        ex = self.corpus[k % len(self.corpus)]
        body: dict[str, Any] = {
            "model": self.model, "messages": [{"role": "user", "content": ex["prompt"]}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": f"schema_{ex.get('family', 'x')}", "schema": ex["schema"]}},
            "seed": k}
        if self.a.max_tokens:
            body["max_tokens"] = self.a.max_tokens
        if stream:
            body["stream"] = True
        return body, ex["schema"]

    def judge(self, content: Any, schema: dict) -> str | None:
        if not isinstance(content, str):
            return f"content is {type(content).__name__}"
        try:
            value = json.loads(content)
        except ValueError as err:
            return f"not JSON: {err}"
        return self.check(value, schema)

    async def one(self, client, url: str, k: int, rec: dict) -> None:
        body, schema = self.payload(k, stream=False)
        t0 = time.perf_counter()
        try:
            r = await client.post(url, json=body)
            lat = time.perf_counter() - t0
            if r.status_code != 200:
                rec["errors"].append(f"{k}: HTTP {r.status_code}: {r.text[:160]}")
                return
            data = r.json()
            choice = data["choices"][0]
            content = choice["message"]["content"]
        except Exception as err:  # noqa: BLE001 - transport failures and malformed bodies are errors
            rec["errors"].append(f"{k}: {type(err).__name__}: {str(err)[:160]}")
            return
        msg = self.judge(content, schema)
        if msg is not None:
            rec["invalid"].append(f"{k}: {msg}")
            return
        rec["latencies"].append(lat)
        stats = data.get("dgemma_stats")
        if isinstance(stats, dict):
            rec["repairs"] += int(stats.get("repairs") or 0)
        rec["finish"][choice.get("finish_reason")] = rec["finish"].get(choice.get("finish_reason"), 0) + 1

    async def one_stream(self, client, url: str, k: int, rec: dict) -> None:
        body, schema = self.payload(k, stream=True)
        t0 = time.perf_counter()
        first_event = first_content = None
        parts: list[str] = []
        try:
            async with client.stream("POST", url, json=body) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode(errors="replace")
                    rec["errors"].append(f"{k}: HTTP {r.status_code}: {text[:160]}")
                    return
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    now = time.perf_counter()
                    first_event = first_event or now
                    ev = json.loads(data)
                    if "error" in ev:
                        rec["errors"].append(f"{k}: stream error event: {json.dumps(ev['error'])[:160]}")
                        return
                    for ch in ev.get("choices") or []:
                        piece = (ch.get("delta") or {}).get("content")
                        if piece:
                            first_content = first_content or now
                            parts.append(piece)
        except Exception as err:  # noqa: BLE001
            rec["errors"].append(f"{k}: {type(err).__name__}: {str(err)[:160]}")
            return
        total = time.perf_counter() - t0
        msg = self.judge("".join(parts), schema)
        if msg is not None:
            rec["invalid"].append(f"{k}: {msg}")
            return
        rec["latencies"].append(total)
        rec["ttfe"].append(first_event - t0)
        if first_content is not None:
            rec["ttfc"].append(first_content - t0)

    async def level(self, base: str, clients: int, duration_s: float, *, stream: bool) -> dict:
        import httpx

        url = base + "/v1/chat/completions"
        rec: dict[str, Any] = {"clients": clients, "stream": stream, "latencies": [], "ttfc": [], "ttfe": [],
                               "errors": [], "invalid": [], "repairs": 0, "finish": {}}
        counter = iter(range(10 ** 9))
        limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
        timeout = httpx.Timeout(self.a.client_timeout_s, connect=10.0)
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            health0 = await health(client, base)
            t0 = time.perf_counter()
            deadline = t0 + duration_s

            async def run_client() -> None:
                while True:   # at least one request per client
                    k = next(counter)
                    await (self.one_stream if stream else self.one)(client, url, k, rec)
                    if time.perf_counter() >= deadline:
                        break

            await asyncio.gather(*(run_client() for _ in range(clients)))
            elapsed = time.perf_counter() - t0
            health1 = await health(client, base)
        lat = rec["latencies"]
        out = {"clients": clients, "stream": stream, "duration_s": duration_s, "elapsed_s": elapsed,
               "sent": next(counter), "valid": len(lat), "errors": len(rec["errors"]), "invalid": len(rec["invalid"]),
               "req_per_s": len(lat) / elapsed, "latency_p50_s": percentile(lat, 50),
               "latency_p90_s": percentile(lat, 90), "latency_p99_s": percentile(lat, 99),
               "latency_mean_s": sum(lat) / len(lat) if lat else None, "latency_max_s": max(lat, default=None),
               "repairs": rec["repairs"], "finish_reasons": rec["finish"],
               "error_samples": rec["errors"][:5], "invalid_samples": rec["invalid"][:5],
               "health_delta": health_delta(health0, health1), "latencies": lat}
        if stream:
            out.update({"ttfc_p50_s": percentile(rec["ttfc"], 50), "ttfc_p90_s": percentile(rec["ttfc"], 90),
                        "ttfc_p99_s": percentile(rec["ttfc"], 99), "ttfc_mean_s":
                        sum(rec["ttfc"]) / len(rec["ttfc"]) if rec["ttfc"] else None,
                        "ttfe_p50_s": percentile(rec["ttfe"], 50), "ttfc": rec["ttfc"],
                        "no_content": len(lat) - len(rec["ttfc"])})
        return out


async def health(client, base: str) -> dict:
    try:
        r = await client.get(base + "/health", timeout=10)
        return r.json()
    except Exception:  # noqa: BLE001
        return {}


def health_delta(h0: dict, h1: dict) -> dict:
    """The numeric /health counters' change over a level (batches, rows, ...: whatever the server
    reports; the scheduler's nested counters as ``scheduler.NAME``), plus rows per batch when both are there."""
    h0 = {**h0, **{f"scheduler.{k}": v for k, v in (h0.get("scheduler") or {}).items()}}
    h1 = {**h1, **{f"scheduler.{k}": v for k, v in (h1.get("scheduler") or {}).items()}}
    d = {k: h1[k] - h0[k] for k in h1 if isinstance(h1.get(k), (int, float)) and isinstance(h0.get(k), (int, float))
         and not isinstance(h1[k], bool)}
    if d.get("batches"):
        d["rows_per_batch"] = d.get("rows", 0) / d["batches"]
    return d


# ---------------------------------------------------------------- one arm

async def run_arm(label: str, root: Path, extra: list[str], tag: str, corpus: list[dict], check,
                  a: argparse.Namespace, logdir: Path, t_start: float) -> dict:
    import httpx

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {tag:8s} {msg}", flush=True)

    srv = Server(label, root, extra, a.threads, logdir, tag)
    say(f"starting server: {' '.join(srv.args)} (tree {root}, log {srv.log_path})")
    out: dict[str, Any] = {"label": label, "server_args": srv.args, "levels": [], "stream_levels": []}
    try:
        async with httpx.AsyncClient() as c:
            out["startup_s"] = await srv.wait_ready(c, a.startup_timeout_s)
            out["health"] = await health(c, srv.base)
            out["model"] = (await c.get(srv.base + "/v1/models", timeout=10)).json()["data"][0]["id"]
        load = Load(corpus, check, a, out["model"])
        say(f"healthy after {out['startup_s']:.1f}s; warm-up")
        t0 = time.perf_counter()
        seen: dict[str, int] = {}
        for k, ex in enumerate(corpus):
            seen.setdefault(json.dumps(ex["schema"], sort_keys=True), k)
        warm = await load.level(srv.base, 1, 0, stream=False)   # one request: first-call costs
        if warm["valid"] != 1:
            raise SystemExit(f"{tag}: the first request failed: {(warm['error_samples'] + warm['invalid_samples'])[:1]}"
                             f"\nserver log:\n{srv.tail()}")
        for k in seen.values():                                 # every distinct schema once
            rec = {"latencies": [], "errors": [], "invalid": [], "repairs": 0, "finish": {}}
            async with httpx.AsyncClient(timeout=a.client_timeout_s) as c:
                await load.one(c, srv.base + "/v1/chat/completions", k, rec)
            if rec["errors"]:
                say(f"warm-up error: {rec['errors'][0]}")
        if a.warmup_s > 0:
            await load.level(srv.base, min(8, max(a.clients)), a.warmup_s, stream=False)
        out["warmup_s"] = time.perf_counter() - t0
        out["warmup_first"] = {k: warm[k] for k in ("valid", "errors", "invalid", "latency_max_s")}
        say(f"warm-up done in {out['warmup_s']:.1f}s ({len(seen)} distinct schemas)")
        for c_ in a.clients:
            lv = await load.level(srv.base, c_, a.duration_s, stream=False)
            out["levels"].append(lv)
            rpb = lv["health_delta"].get("rows_per_batch")
            say(f"C={c_:<3d} {lv['valid']:4d} valid in {lv['elapsed_s']:5.1f}s = {lv['req_per_s']:6.2f} req/s  "
                f"p50 {fmt(lv['latency_p50_s'])} p99 {fmt(lv['latency_p99_s'])}  errors {lv['errors']} "
                f"invalid {lv['invalid']}" + (f"  rows/batch {rpb:.1f}" if rpb else ""))
            if lv["error_samples"] or lv["invalid_samples"]:
                say("  e.g. " + "; ".join(lv["error_samples"][:2] + lv["invalid_samples"][:2]))
        for c_ in a.stream_clients:
            lv = await load.level(srv.base, c_, a.stream_duration_s, stream=True)
            out["stream_levels"].append(lv)
            say(f"stream C={c_:<3d} {lv['valid']:4d} valid  TTFC p50 {fmt(lv['ttfc_p50_s'])} "
                f"p90 {fmt(lv['ttfc_p90_s'])}  total p50 {fmt(lv['latency_p50_s'])}  errors {lv['errors']} "
                f"invalid {lv['invalid']}")
            if lv["error_samples"] or lv["invalid_samples"]:
                say("  e.g. " + "; ".join(lv["error_samples"][:2] + lv["invalid_samples"][:2]))
    finally:
        srv.stop()
        out["server_log_tail"] = srv.log_path.read_text(errors="replace")[-2000:]
        say("server stopped")
    return out


def fmt(x: float | None) -> str:
    return "  n/a" if x is None else f"{x:5.2f}s"


# ---------------------------------------------------------------- pooling, table, plot

def pool(runs: list[dict], key: str) -> list[dict]:
    """Levels of several rounds of one tree pooled: counts summed, latencies merged."""
    by_c: dict[int, list[dict]] = {}
    for run in runs:
        for lv in run[key]:
            by_c.setdefault(lv["clients"], []).append(lv)
    out = []
    for c, lvs in sorted(by_c.items()):
        lat = [x for lv in lvs for x in lv["latencies"]]
        valid, elapsed = sum(lv["valid"] for lv in lvs), sum(lv["elapsed_s"] for lv in lvs)
        p = {"clients": c, "rounds": len(lvs), "valid": valid, "errors": sum(lv["errors"] for lv in lvs),
             "invalid": sum(lv["invalid"] for lv in lvs), "elapsed_s": elapsed, "req_per_s": valid / elapsed,
             "req_per_s_rounds": [lv["req_per_s"] for lv in lvs],
             "latency_p50_s": percentile(lat, 50), "latency_p90_s": percentile(lat, 90),
             "latency_p99_s": percentile(lat, 99), "repairs_per_req": sum(lv["repairs"] for lv in lvs) / max(valid, 1),
             "rows_per_batch": [lv["health_delta"].get("rows_per_batch") for lv in lvs],
             "rows_ar": sum(lv["health_delta"].get("scheduler.rows_ar", 0) for lv in lvs),
             "rows_diffusion": sum(lv["health_delta"].get("scheduler.rows_diffusion", 0) for lv in lvs)}
        if key == "stream_levels":
            ttfc = [x for lv in lvs for x in lv["ttfc"]]
            p.update({"ttfc_p50_s": percentile(ttfc, 50), "ttfc_p90_s": percentile(ttfc, 90),
                      "ttfc_p99_s": percentile(ttfc, 99), "no_content": sum(lv["no_content"] for lv in lvs)})
        out.append(p)
    return out


def ratio(x: float | None, y: float | None) -> float | None:
    return None if x is None or not y else x / y


def targets(summary: dict) -> dict:
    """Issue #14's server targets, from the pooled levels: for every arm but ``old``, its errors and
    invalid outputs and, at the new tree's highest concurrency, its req/s and p99 over old's."""
    t: dict[str, Any] = {}
    new = summary.get("new")
    old = summary.get("old")
    if new is None:
        return t
    top = max((lv["clients"] for lv in new["levels"]), default=None)
    if top is None:
        return t
    t["clients"] = top
    lv_old = {lv["clients"]: lv for lv in old["levels"]} if old is not None else {}
    for label, s in summary.items():
        if label == "old":
            continue
        t[f"{label}_errors"] = sum(lv["errors"] for lv in s["levels"] + s["stream_levels"])
        t[f"{label}_invalid"] = sum(lv["invalid"] for lv in s["levels"] + s["stream_levels"])
        lv_arm = {lv["clients"]: lv for lv in s["levels"]}
        if top in lv_arm and top in lv_old:
            t[f"{label}_req_per_s_over_old"] = ratio(lv_arm[top]["req_per_s"], lv_old[top]["req_per_s"])
            t[f"{label}_p99_over_old"] = ratio(lv_arm[top]["latency_p99_s"], lv_old[top]["latency_p99_s"])
    for label, s in summary.items():
        st = {lv["clients"]: lv for lv in s["stream_levels"]}
        if 1 in st and len(st) > 1:
            hi = max(st)
            t[f"{label}_ttfc_C{hi}_over_C1"] = ratio(st[hi]["ttfc_p50_s"], st[1]["ttfc_p50_s"])
    return t


def markdown(result: dict) -> str:
    meta, summary, t = result["meta"], result["summary"], result["targets"]
    labels = list(summary)
    L = []
    if meta["smoke"]:
        L += ["> **SMOKE RUN** (tiny settings, a check that the script works; not a measurement).", ""]
    L += ["# Server load (issue #14)", "",
          f"`benchmarks/server_load.py`, {meta['date']}: `dgemma-struct serve` (embedded model, "
          f"{meta['threads']} torch thread(s), {meta['cpu_count']} CPUs, client on the same box) under C concurrent "
          f"clients sending held-out JSON-schema chat requests back to back for {meta['duration_s']:.0f}s per level "
          f"(streaming: {meta['stream_duration_s']:.0f}s), {meta['rounds']} round(s) per tree; req/s = valid "
          f"responses / time until the last client finished. Every content checked with jsonschema.", ""]
    for label in labels:
        tr = meta["trees"][label]
        L.append(f"- **{label}**: `{tr['commit'][:12]}`{' + uncommitted changes' if tr['dirty'] else ''} "
                 f"({tr['root']}), server args `{' '.join(meta['server_args'][label]) or '(defaults)'}`")
    L += ["", "## Non-streaming", "",
          "| C | " + " | ".join(f"{lab} req/s | {lab} p50 s | {lab} p99 s | {lab} err/invalid | {lab} rows/batch"
                               for lab in labels) + " |",
          "|--:|" + "--:|--:|--:|--:|--:|" * len(labels)]
    cs = sorted({lv["clients"] for s in summary.values() for lv in s["levels"]})
    for c in cs:
        row = f"| {c} |"
        for lab in labels:
            lv = next((x for x in summary[lab]["levels"] if x["clients"] == c), None)
            if lv is None:
                row += " | | | | |"
                continue
            rpb = [x for x in lv["rows_per_batch"] if x is not None]
            row += (f" {lv['req_per_s']:.2f} | {num(lv['latency_p50_s'])} | {num(lv['latency_p99_s'])} | "
                    f"{lv['errors']}/{lv['invalid']} | {sum(rpb) / len(rpb):.1f} |" if rpb else
                    f" {lv['req_per_s']:.2f} | {num(lv['latency_p50_s'])} | {num(lv['latency_p99_s'])} | "
                    f"{lv['errors']}/{lv['invalid']} | n/a |")
        L.append(row)
    for lab in labels:
        mix = [(lv["clients"], lv.get("rows_ar", 0), lv.get("rows_diffusion", 0)) for lv in summary[lab]["levels"]]
        if any(ar for _, ar, _ in mix):
            L += ["", f"{lab}: rows run in AR mode / all rows, per level (the scheduler's counters): "
                  + ", ".join(f"C={c}: {ar}/{ar + df}" for c, ar, df in mix)]
    L += ["", "## Streaming (`stream: true`)", "",
          "| C | " + " | ".join(f"{lab} TTFC p50 s | {lab} TTFC p90 s | {lab} total p50 s | {lab} req/s | "
                               f"{lab} err/invalid" for lab in labels) + " |",
          "|--:|" + "--:|--:|--:|--:|--:|" * len(labels)]
    for c in sorted({lv["clients"] for s in summary.values() for lv in s["stream_levels"]}):
        row = f"| {c} |"
        for lab in labels:
            lv = next((x for x in summary[lab]["stream_levels"] if x["clients"] == c), None)
            row += " | | | | |" if lv is None else (
                f" {num(lv['ttfc_p50_s'])} | {num(lv['ttfc_p90_s'])} | {num(lv['latency_p50_s'])} | "
                f"{lv['req_per_s']:.2f} | {lv['errors']}/{lv['invalid']} |")
        L.append(row)
    L += ["", "TTFC: request sent → first SSE chunk with non-empty `delta.content`. rows/batch: from the "
          "server's `/health` counters (`rows` / `batches` over the level), where it reports them.", "",
          "## Targets", ""]
    for lab in labels:
        if f"{lab}_req_per_s_over_old" in t:
            L.append(f"- {lab}, C={t['clients']}: {lab}/old req/s = **{num(t[f'{lab}_req_per_s_over_old'], 2)}×** "
                     f"(target ≥ 3×); {lab}/old p99 = **{num(t[f'{lab}_p99_over_old'], 2)}×** (target ≤ 0.33×)")
        if f"{lab}_errors" in t:
            L.append(f"- {lab}: {t[f'{lab}_errors']} errors, {t[f'{lab}_invalid']} invalid (target 0 / 0)")
    for lab in labels:
        for k, v in t.items():
            if k.startswith(f"{lab}_ttfc_"):
                L.append(f"- {lab}: TTFC p50 at C={k.split('_C')[1].split('_')[0]} / C=1 = **{num(v, 2)}×** "
                         f"(target ≤ 2×)")
    bad = [(lab, lv) for lab in labels for run in result["runs"] if run["label"] == lab
           for lv in run["levels"] + run["stream_levels"] if lv["error_samples"] or lv["invalid_samples"]]
    if bad:
        L += ["", "## Errors / invalid (samples)", ""]
        for lab, lv in bad:
            L.append(f"- {lab} C={lv['clients']}{' stream' if lv['stream'] else ''}: "
                     + "; ".join(lv["error_samples"][:3] + lv["invalid_samples"][:3]))
    if result.get("plot"):
        L += ["", f"![server load]({os.path.relpath(result['plot'], ROOT / 'docs' / 'results')})"]
    return "\n".join(L) + "\n"


def num(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def plot(result: dict, path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return False
    summary = result["summary"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    colors = {"old": "tab:gray", "new": "tab:green", "new-auto": "tab:blue"}
    for lab, s in summary.items():
        cs = [lv["clients"] for lv in s["levels"]]
        axes[0].plot(cs, [lv["req_per_s"] for lv in s["levels"]], marker="o", color=colors.get(lab), label=lab)
        axes[1].plot(cs, [lv["latency_p99_s"] or 0 for lv in s["levels"]], marker="o", color=colors.get(lab),
                     label=f"{lab} p99")
        axes[1].plot(cs, [lv["latency_p50_s"] or 0 for lv in s["levels"]], ":", marker=".", color=colors.get(lab),
                     label=f"{lab} p50")
        sc = [lv["clients"] for lv in s["stream_levels"]]
        axes[2].plot(sc, [lv["ttfc_p50_s"] or 0 for lv in s["stream_levels"]], marker="o", color=colors.get(lab),
                     label=f"{lab} p50")
    ticks = [sorted({lv["clients"] for s in summary.values() for lv in s[k]}) for k in ("levels", "levels",
                                                                                   "stream_levels")]
    for ax, yl, tk in zip(axes, ("valid req/s", "latency (s)", "time to first content chunk (s)"), ticks):
        ax.set_xscale("log", base=2)
        if tk:
            ax.set_xticks(tk, [str(c) for c in tk])
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(yl)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title("throughput")
    axes[1].set_title("latency")
    axes[2].set_title("streaming TTFC")
    fig.suptitle("dgemma-struct server, JSON-schema clients (embedded model, CPU)"
                 + (" [SMOKE RUN]" if result["meta"]["smoke"] else ""))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ---------------------------------------------------------------- driver

async def amain(a: argparse.Namespace) -> None:
    trees = ([("old", tree_root(a.old_src))] if a.old_src else []) + [("new", tree_root(a.new_src))]
    # --arm LABEL=ARGS: the new tree again, with other serve arguments (e.g. new-auto="--mode-choice auto")
    arms = dict(a.arm)
    trees += [(label, tree_root(a.new_src)) for label in arms]
    # prompts and schemas: the held-out corpus of the new tree (the client side of both arms)
    pin_tree(trees[-1][1])
    corpus = held_out(a.corpus_n)
    check = schema_checker()
    common = shlex.split(a.server_args)
    extra = {"old": shlex.split(a.old_server_args) if a.old_server_args is not None else common,
             "new": shlex.split(a.new_server_args) if a.new_server_args is not None else common,
             **{label: shlex.split(args) for label, args in arms.items()}}
    logdir = Path(tempfile.mkdtemp(prefix="server_load_"))
    t_start = time.perf_counter()
    order: list[tuple[str, Path]] = []
    for r in range(a.rounds):
        order += trees if r % 2 == 0 else trees[::-1]
    runs = []
    for i, (label, root) in enumerate(order):
        runs.append(await run_arm(label, root, extra[label], f"{label}#{i // len(trees) + 1}", corpus, check, a,
                                  logdir, t_start))
    summary = {label: {"levels": pool([r for r in runs if r["label"] == label], "levels"),
                       "stream_levels": pool([r for r in runs if r["label"] == label], "stream_levels")}
               for label, _ in trees}
    meta = {"date": dt.datetime.now().isoformat(timespec="seconds"), "clients": a.clients,
            "stream_clients": a.stream_clients, "duration_s": a.duration_s, "stream_duration_s": a.stream_duration_s,
            "rounds": a.rounds, "threads": a.threads, "corpus_n": a.corpus_n, "max_tokens": a.max_tokens,
            "cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "smoke": bool(a.smoke or a.duration_s < 20), "wall_s_total": time.perf_counter() - t_start,
            "trees": {label: tree_info(root) for label, root in trees},
            "server_args": {label: extra[label] for label, _ in trees}, "command": " ".join(sys.argv)}
    result: dict[str, Any] = {"meta": meta, "summary": summary}
    result["targets"] = targets(summary)
    result["runs"] = runs
    if not a.no_plot and plot(result, Path(a.plot)):
        result["plot"] = str(Path(a.plot).resolve())
    js, mdp = write_results(result, a.out, markdown)
    print(f"wrote {js}, {mdp}" + (f", {result['plot']}" if result.get("plot") else "")
          + f" in {meta['wall_s_total']:.0f}s (server logs in {logdir})")


def arm_arg(text: str) -> tuple[str, str]:
    """``--arm LABEL=ARGS``: a new label (not old/new) and the serve arguments of that arm."""
    label, sep, args = text.partition("=")
    if not sep or not label or label in ("old", "new"):
        raise argparse.ArgumentTypeError(f"expected LABEL=ARGS with a label other than old/new, got {text!r}")
    return label, args


def main() -> None:
    if "--serve-tree" in sys.argv[1:3]:   # the server subprocess: --serve-tree ROOT -- <cli args>
        i = sys.argv.index("--serve-tree")
        rest = sys.argv[i + 2:]
        serve_tree(sys.argv[i + 1], rest[1:] if rest[:1] == ["--"] else rest)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 64], help="concurrency levels")
    ap.add_argument("--stream-clients", type=int, nargs="*", default=[1, 8], help="streaming concurrency levels")
    ap.add_argument("--duration-s", type=float, default=40.0, help="seconds per non-streaming level (default 40)")
    ap.add_argument("--stream-duration-s", type=float, default=20.0, help="seconds per streaming level (default 20)")
    ap.add_argument("--warmup-s", type=float, default=5.0,
                    help="after the one-request-per-schema warm-up, this many seconds at 8 clients (0: none)")
    ap.add_argument("--rounds", type=int, default=1, help="servers started per tree (order alternates)")
    ap.add_argument("--corpus-n", type=int, default=256, help="held-out JSON-schema examples cycled through")
    ap.add_argument("--max-tokens", type=int, default=None, help="max_tokens per request (default: the server's)")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS") or 1),
                    help="OMP_NUM_THREADS of the server (default: $OMP_NUM_THREADS or 1)")
    ap.add_argument("--client-timeout-s", type=float, default=120.0)
    ap.add_argument("--startup-timeout-s", type=float, default=300.0)
    ap.add_argument("--server-args", default="", help="extra 'dgemma-struct serve' arguments for both trees")
    ap.add_argument("--old-server-args", default=None, help="extra serve arguments for the old tree only")
    ap.add_argument("--new-server-args", default=None, help="extra serve arguments for the new tree only")
    ap.add_argument("--arm", action="append", default=[], metavar="LABEL=ARGS", type=arm_arg,
                    help="one more arm: this tree served with ARGS (repeatable), e.g. new-auto='--mode-choice auto'")
    ap.add_argument("--old-src", default=None, help="an older tree (its src/ or root) to run side by side")
    ap.add_argument("--new-src", default=str(ROOT / "src"), help="the tree measured as 'new' (default: this checkout)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "server_load"),
                    help="output path without extension (.json and .md are written)")
    ap.add_argument("--plot", default=str(ROOT / "docs" / "img" / "server_load.png"))
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="mark the outputs as a smoke run (automatic below 20 s)")
    a = ap.parse_args()
    asyncio.run(amain(a))


if __name__ == "__main__":
    main()
