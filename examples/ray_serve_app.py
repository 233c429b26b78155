"""Scale out with Ray Serve: replicas of the OpenAI-compatible server, each with its own model
copy and batching worker; Ray's HTTP proxy spreads requests over them (docs/scale_out.md).

Run (loopback only)::

    pip install "dgemma-struct[ray]"
    python examples/ray_serve_app.py --replicas 2 --port 8000      # the embedded model
    python examples/ray_serve_app.py --model /path/to/checkpoint --autoscale 1:4

    curl -s 127.0.0.1:8000/v1/chat/completions -H 'content-type: application/json' -d \\
      '{"messages":[{"role":"user","content":"Give the phone number.\\nCall 555-123-4567."}],
        "guided_regex":"\\\\d{3}-\\\\d{3}-\\\\d{4}"}'

or with the Serve CLI: ``serve run examples.ray_serve_app:app``.

What it sets up:

* **Health**: Serve calls :meth:`DgemmaStructServer.check_health` every few seconds; it fails when
  the replica's generation worker thread died, so Serve replaces the replica. The replica's own
  ``/health/ready`` (after a warm-up generation) is what a gateway in front of Ray would probe.
* **Drain**: Serve stops routing to a replica it removes and waits ``graceful_shutdown_timeout_s``
  for its requests (the server's own drain, :class:`~dgemma_struct.server.lifecycle.DrainingServer`,
  is for ``dgemma-struct serve``).
* **Spread and autoscaling**: replicas are placed with Serve's SPREAD strategy
  (``max_replicas_per_node=1`` makes it strict); autoscaling targets ``max_batch_size`` requests per
  replica (the rows one batcher runs at once), so a replica scales out when its batch is full
  and work starts queueing.
* **Shared compile verdicts**: a constraint refused by one replica (too complex, crashing its
  compile worker) is remembered in a named actor (:class:`VerdictStore`), so every replica refuses
  it at once (:mod:`dgemma_struct.server.verdicts`).

**Loopback**: ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` is set before ``import ray`` (else Ray 2.60
replaces 127.0.0.1 with the machine's external address) and every node gets
``node_ip_address=127.0.0.1``; the GCS, raylets, object managers, workers, the Serve controller
and the HTTP proxy then listen on 127.0.0.1. What still listens on all interfaces with Ray 2.60 is
listed by ``tests/integrations/test_ray_cluster.py`` (each Serve replica's internal gRPC server,
ray#64623, and the metrics/dashboard agents' ports unless ``include_dashboard=False``); on a
shared host, firewall those ports or run Ray in its own network namespace.
"""
from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")   # before ray: keep 127.0.0.1

import argparse  # noqa: E402
import asyncio  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import ray  # noqa: E402
from ray import serve  # noqa: E402

from dgemma_struct.server import ServerConfig, create_app  # noqa: E402
from dgemma_struct.server.verdicts import Verdicts  # noqa: E402

VERDICTS_ACTOR = "dgemma_struct_verdicts"
NAMESPACE = "dgemma_struct"
WARM_WAIT_S = 25.0   # within health_check_timeout_s


@ray.remote(num_cpus=0, max_restarts=-1)
class VerdictStore:
    """Refused constraints by spec hash, shared by every replica (a few KB per entry)."""

    def __init__(self, size: int = 100_000):
        self.size, self.d = size, {}

    def get(self, key: str) -> dict | None:
        return self.d.get(key)

    def put(self, key: str, verdict: dict) -> None:
        self.d[key] = verdict
        while len(self.d) > self.size:
            self.d.pop(next(iter(self.d)))


class RayVerdicts:
    """The :class:`~dgemma_struct.server.verdicts.SharedVerdicts` of a named :class:`VerdictStore`."""

    def __init__(self) -> None:
        self.actor = VerdictStore.options(name=VERDICTS_ACTOR, namespace=NAMESPACE, get_if_exists=True,
                                          lifetime="detached").remote()

    async def get(self, key: str) -> dict | None:
        return await self.actor.get.remote(key)

    def put(self, key: str, verdict: dict) -> None:
        self.actor.put.remote(key, verdict)


@serve.deployment(ray_actor_options={"num_cpus": 1}, max_ongoing_requests=16, graceful_shutdown_timeout_s=30,
                  graceful_shutdown_wait_loop_s=1, health_check_period_s=5, health_check_timeout_s=30)
@serve.ingress()
class DgemmaStructServer:
    """One replica: loads the model (``model`` = local checkpoint dir, None = embedded) and serves
    the same app as ``dgemma-struct serve`` (batching, limits, probes, metrics, OpenAI errors)."""

    def __init__(self, model: str | None = None, shared_verdicts: bool = True, **config: Any):
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        self.config = ServerConfig(model=model, **config)
        self.verdicts = Verdicts(ttl_s=self.config.verdict_ttl_s, shared=RayVerdicts() if shared_verdicts else None)
        self.asgi_app = None

    def __serve_build_asgi_app__(self):
        self.asgi_app = create_app(config=self.config, verdicts=self.verdicts)
        return self.asgi_app

    async def check_health(self) -> None:
        """Serve's health check: fails when the generation worker thread is not running. Serve
        runs it once before it routes to a new replica: that first call waits (up to
        ``WARM_WAIT_S``) for the warm-up generation, so a new replica gets traffic warm."""
        app_state = getattr(self.asgi_app, "state", None)
        state = getattr(app_state, "dgemma", None)
        if state is not None and not state.batcher.worker_alive:
            raise RuntimeError("the generation worker thread is not running")
        lifecycle = getattr(app_state, "lifecycle", None)
        deadline = time.monotonic() + WARM_WAIT_S
        while lifecycle is not None and not lifecycle.warmed and time.monotonic() < deadline:
            await asyncio.sleep(0.1)


def build(model: str | None = None, replicas: int = 2, *, autoscale: tuple[int, int] | None = None,
          max_replicas_per_node: int | None = None, **config: Any):
    """The Serve application: ``serve.run(build(...))``. ``autoscale=(min, max)`` replaces the fixed
    ``replicas`` with Serve autoscaling targeting ``max_batch_size`` ongoing requests per replica."""
    batch = config.get("max_batch_size", ServerConfig.max_batch_size)
    opts: dict[str, Any] = {"max_ongoing_requests": 2 * batch}
    if max_replicas_per_node:
        opts["max_replicas_per_node"] = max_replicas_per_node
    if autoscale is None:
        opts["num_replicas"] = replicas
    else:
        opts["autoscaling_config"] = {"min_replicas": autoscale[0], "max_replicas": autoscale[1],
                                      "target_ongoing_requests": batch, "upscale_delay_s": 2.0,
                                      "downscale_delay_s": 10.0, "metrics_interval_s": 1.0,
                                      "look_back_period_s": 4.0}
    return DgemmaStructServer.options(**opts).bind(model=model, **config)


app = build(os.environ.get("DGEMMA_STRUCT_MODEL") or None, int(os.environ.get("DGEMMA_STRUCT_REPLICAS", "2")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--autoscale", default=None, help="MIN:MAX replicas (Serve autoscaling)")
    ap.add_argument("--max-replicas-per-node", type=int, default=None)
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--api-key", default=None)
    args = ap.parse_args()
    auto = tuple(int(x) for x in args.autoscale.split(":")) if args.autoscale else None
    ray.init(include_dashboard=False, _node_ip_address="127.0.0.1")
    serve.start(http_options={"host": "127.0.0.1", "port": args.port}, proxy_location="HeadOnly")
    serve.run(build(args.model, args.replicas, autoscale=auto, max_replicas_per_node=args.max_replicas_per_node,
                    api_key=args.api_key), name="dgemma-struct", route_prefix="/")
    print(f"serving on http://127.0.0.1:{args.port}; Ctrl-C to stop")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()


if __name__ == "__main__":
    main()
