"""examples/ray_serve_app.py on a simulated three-node Ray cluster on loopback
(``ray.cluster_utils.Cluster``, every node bound to 127.0.0.1, one CPU each), serving a tiny
random checkpoint with Serve autoscaling (1..3 replicas, at most one per node). Checks, in one
bounded run: the sockets Ray listens on (loopback, but for the documented exceptions), that
replicas spread across nodes, autoscaling up under load and back down when idle, and that a
replica killed mid-load loses no accepted request the client retries. The times it measures are
printed, and written as JSON to ``$DGEMMA_STRUCT_RAY_RESULTS`` when that is set (docs/scale_out.md
quotes them). Skipped without ray[serve], or with DGEMMA_STRUCT_SKIP_RAY=1."""
from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")   # before ray is imported, when this is first

import asyncio  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import httpx  # noqa: E402
import pytest  # noqa: E402

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'dgemma-struct[ray]')")
serve = pytest.importorskip("ray.serve", reason="ray[serve] is not installed")
psutil = pytest.importorskip("psutil")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("DGEMMA_STRUCT_SKIP_RAY") == "1", reason="DGEMMA_STRUCT_SKIP_RAY=1")]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
APP = "dgemma-struct"
BODY = {"messages": [{"role": "user", "content": "hi"}], "guided_choice": ["on", "off"], "max_tokens": 8}
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
#: What (Ray 2.60) still listens on every interface with node_ip_address=127.0.0.1: each Serve
#: replica's internal gRPC server (bound to "::", ray#64623). Everything else is on loopback.
ALL_INTERFACES_OK = ("ray::ServeReplica",)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_serve(tries: int = 3) -> int:
    """Start Serve's HTTP proxy on a free loopback port; returns the port.

    A port found free is only free until someone binds it: the cluster's own processes and the
    other test workers open ephemeral ports all the time, so a bind race gets a fresh port.
    """
    for attempt in range(tries):
        port = _port()
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
            return port
        except Exception as e:  # noqa: BLE001 - ray wraps the proxy's bind error in RayTaskError
            if "Failed to bind" not in str(e) or attempt == tries - 1:
                raise
            serve.shutdown()
    raise AssertionError("unreachable")


def _listening(root_pid: int) -> list[tuple[str, int, str]]:
    """(address, port, process name) of every TCP listener of ``root_pid`` and its descendants."""
    procs = {p.pid: p for p in psutil.Process(root_pid).children(recursive=True)}
    out = []
    for c in psutil.net_connections(kind="tcp"):
        if c.status == psutil.CONN_LISTEN and c.pid in procs:
            try:
                name = " ".join(procs[c.pid].cmdline())[:80] or procs[c.pid].name()
            except psutil.Error:
                name = "?"
            out.append((c.laddr.ip, c.laddr.port, name))
    return sorted(out)


def _replicas() -> list[dict]:
    """The running replica actors of the app, with their node ids (from the GCS)."""
    from ray._private import state

    return [a for a in state.actors().values()
            if a.get("State") == "ALIVE" and "ServeReplica" in (a.get("ActorClassName") or "")
            and a.get("Name", "").find(APP) >= 0]


def _running() -> int:
    st = serve.status().applications[APP].deployments["DgemmaStructServer"]
    return st.replica_states.get("RUNNING", 0)


def _wait(pred, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not pred():
        assert time.monotonic() - t0 < timeout, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.25)
    return time.monotonic() - t0


async def _client(c: httpx.AsyncClient, stop: asyncio.Event, log: dict) -> None:
    """Requests until ``stop``; each is retried (5xx, transport errors) until it gets its answer."""
    while not stop.is_set():
        for attempt in range(40):
            try:
                r = await c.post("/v1/chat/completions", json=BODY)
                if r.status_code == 200:
                    assert r.json()["choices"][0]["message"]["content"] in ("on", "off")
                    log["ok"] += 1
                    break
                assert r.status_code >= 500 or r.status_code == 429, r.text
            except httpx.TransportError:
                pass
            log["retries"] += 1
            await asyncio.sleep(0.2)
        else:
            log["lost"] += 1


def test_cluster_spread_autoscaling_and_replica_loss(rt, tmp_path, monkeypatch):
    from ray._private import ray_constants

    # the driver's ray was maybe imported before the variable was set: keep its 127.0.0.1 as is
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
    rt.model.save_pretrained(tmp_path)
    rt.tokenizer.save_pretrained(tmp_path)
    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(EXAMPLES), os.environ.get("PYTHONPATH")]))}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    times: dict[str, float] = {}
    t0 = time.monotonic()
    node = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=dict(node, dashboard_host="127.0.0.1"))
    sys.path.insert(0, str(EXAMPLES))
    try:
        for _ in range(2):
            cluster.add_node(**node)
        cluster.wait_for_nodes(timeout=120)
        ray.init(address=cluster.address, _node_ip_address="127.0.0.1", log_to_driver=False,
                 runtime_env={"env_vars": env})
        times["cluster_s"] = time.monotonic() - t0
        assert len([n for n in ray.nodes() if n["Alive"]]) == 3
        import ray_serve_app

        t1 = time.monotonic()
        port = _start_serve()
        serve.run(ray_serve_app.build(str(tmp_path), autoscale=(1, 3), max_replicas_per_node=1, max_batch_size=2,
                                      isolate_compiles=False, max_tokens_cap=64), name=APP, route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        _wait(lambda: httpx.get(url + "/health/ready", timeout=30).status_code == 200, 120, "readiness")
        times["first_replica_ready_s"] = time.monotonic() - t1

        # a refused constraint is remembered in the shared verdict actor
        bad = httpx.post(url + "/v1/chat/completions", timeout=60,
                         json={"messages": [{"role": "user", "content": "x"}], "guided_regex": "((", "max_tokens": 8})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_regex"
        from dgemma_struct.constraints.compile_pool import spec_key
        from dgemma_struct.server.protocol import ChatCompletionRequest, spec_of

        spec, _ = spec_of(ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], guided_regex="(("))
        store = ray.get_actor(ray_serve_app.VERDICTS_ACTOR, namespace=ray_serve_app.NAMESPACE)
        assert ray.get(store.get.remote(spec_key(spec)), timeout=30)["code"] == "invalid_regex"

        # what listens where (Ray's processes are this process's descendants)
        listeners = _listening(os.getpid())
        exposed = [x for x in listeners if x[0] not in LOOPBACK]
        print("listening:", json.dumps(listeners, indent=1))
        assert (("127.0.0.1", port) in {(a, p) for a, p, _ in listeners}), listeners   # the HTTP proxy
        unexplained = [x for x in exposed if not x[2].startswith(ALL_INTERFACES_OK)]
        assert not unexplained, unexplained
        assert len(listeners) > 10 and any("raylet" in x[2] for x in listeners)   # it did see Ray

        async def load(kill_after: float | None) -> dict:
            log = {"ok": 0, "retries": 0, "lost": 0}
            stop = asyncio.Event()
            async with httpx.AsyncClient(base_url=url, timeout=60) as c:
                tasks = [asyncio.ensure_future(_client(c, stop, log)) for _ in range(12)]
                t2 = time.monotonic()
                while _running() < 3:
                    assert time.monotonic() - t2 < 180, f"no scale-up: {_running()} replicas"
                    await asyncio.sleep(0.25)
                times.setdefault("scale_up_1_to_3_s", time.monotonic() - t2)
                nodes = {a["Address"]["NodeID"] for a in _replicas()}
                assert len(nodes) == 3, _replicas()            # one replica per node
                if kill_after is not None:
                    await asyncio.sleep(kill_after)
                    victim = _replicas()[0]
                    ray.kill(ray.get_actor(victim["Name"], namespace="serve"), no_restart=True)
                    await asyncio.sleep(3.0)                    # load goes on while Serve replaces it
                stop.set()
                await asyncio.gather(*tasks)
            return log

        log = asyncio.run(load(kill_after=1.0))
        print("load:", log)
        assert log["lost"] == 0 and log["ok"] > 12, log
        times["scale_down_3_to_1_s"] = _wait(lambda: _running() == 1, 180, "scale-down to 1 replica")
        times["requests_ok"], times["retries"] = log["ok"], log["retries"]
        print("times:", times)
        if os.environ.get("DGEMMA_STRUCT_RAY_RESULTS"):
            Path(os.environ["DGEMMA_STRUCT_RAY_RESULTS"]).write_text(
                json.dumps({"times": times, "listeners": listeners}, indent=1))
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            cluster.shutdown()
            sys.path.remove(str(EXAMPLES))
