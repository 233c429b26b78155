"""Scale out with Ray Serve: N replicas of the OpenAI-compatible server, each with its own model
copy and its own batching worker; Ray's HTTP proxy spreads requests over them.

Run (single node, loopback only)::

    pip install "dgemma-struct[ray]"
    python examples/ray_serve_app.py --replicas 2 --port 8000      # the embedded model
    python examples/ray_serve_app.py --model /path/to/checkpoint    # a local checkpoint dir

    curl -s 127.0.0.1:8000/v1/chat/completions -H 'content-type: application/json' -d \\
      '{"messages":[{"role":"user","content":"Give the phone number.\\nCall 555-123-4567."}],
        "guided_regex":"\\\\d{3}-\\\\d{3}-\\\\d{4}"}'

or with the Serve CLI: ``serve run examples.ray_serve_app:app``.
Every replica is one process serving one model (see docs/scale_out.md).
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Any

from ray import serve

from dgemma_struct.server import ServerConfig, create_app


@serve.deployment(ray_actor_options={"num_cpus": 1}, max_ongoing_requests=64)
@serve.ingress()
class DgemmaStructServer:
    """One replica: loads the model (``model`` = local checkpoint dir, None = embedded) and serves
    the same app as ``dgemma-struct serve`` (batching, limits, OpenAI errors)."""

    def __init__(self, model: str | None = None, **config: Any):
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        self.config = ServerConfig(model=model, **config)

    def __serve_build_asgi_app__(self):
        return create_app(config=self.config)


def build(model: str | None = None, replicas: int = 2, **config: Any):
    """The Serve application: ``serve.run(build(...))``."""
    return DgemmaStructServer.options(num_replicas=replicas).bind(model=model, **config)


app = build(os.environ.get("DGEMMA_STRUCT_MODEL") or None, int(os.environ.get("DGEMMA_STRUCT_REPLICAS", "2")))


def main() -> None:
    import ray

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=None)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--api-key", default=None)
    args = ap.parse_args()
    ray.init(include_dashboard=False, _node_ip_address="127.0.0.1")  # loopback only
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    serve.run(build(args.model, args.replicas, api_key=args.api_key), name="dgemma-struct", route_prefix="/")
    print(f"serving on http://127.0.0.1:{args.port} with {args.replicas} replicas; Ctrl-C to stop")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()


if __name__ == "__main__":
    main()
