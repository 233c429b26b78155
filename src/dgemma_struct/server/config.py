"""The server's settings (:class:`ServerConfig`) and how its model is loaded (:func:`load_runtime`)."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from dgemma_struct.errors import ModelLoadError
from dgemma_struct.runtime import DiffusionRuntime


@dataclass
class ServerConfig:
    """Server settings. ``from_env`` reads ``DGEMMA_STRUCT_HOST/PORT/MODEL/API_KEY/DEVICE/DTYPE``."""

    host: str = "127.0.0.1"
    port: int = 8000
    model: str | None = None              # a local checkpoint directory; None = the embedded model
    device: str = "auto"                  # "auto" (CUDA when present), "cpu", "cuda", "cuda:1", ...
    dtype: str = "auto"                   # "auto" (bf16 on CUDA, fp32 on CPU), "bf16", "fp16", "fp32"
    api_key: str | None = None            # when set, /v1/* needs ``Authorization: Bearer <key>``
    served_model_name: str | None = None  # the id /v1/models reports (default: the runtime's name)
    max_batch_size: int = 8               # rows running at once (continuous) / per batched loop (static)
    max_wait_ms: float = 10.0
    batching: str = "continuous"          # rows join and leave between canvases (the only road; "static" was removed)
    mode_choice: str = "requested"        # "requested" (diffusion) or "auto": diffusion or AR per batch, by load
    max_queue: int = 64
    request_timeout_s: float = 60.0
    max_body_bytes: int = 1_000_000
    max_tokens_cap: int = 1024
    default_max_tokens: int = 256
    compile_timeout_s: float = 10.0
    max_concurrent_compiles: int = 2
    max_repairs: int = 2
    max_prompts_per_request: int = 16
    max_n: int = 8                        # the largest ``n`` (choices per prompt)
    queue_timeout_s: float | None = None  # longest wait in the queue (default: request_timeout_s)
    isolate_compiles: bool = True         # probe-compile user constraints in worker processes first
    compile_memory_mb: int = 4096         # address space a compile worker may add (0 = no cap)
    stream_live: bool = False             # stream canvases as they commit (may end in stream_diverged)
    max_error_chars: int = 1000           # error messages are cut to this length
    # readiness, drain, refusals
    warmup: bool = True                   # /health/ready waits for one warm-up generation
    drain_timeout_s: float = 30.0         # after SIGTERM: longest wait for in-flight requests
    retry_after_s: int = 1                # Retry-After (seconds) on every 429 and 503
    verdict_ttl_s: float = 3600.0         # how long a refused constraint is refused at once
    # connections (uvicorn)
    header_timeout_s: float = 10.0        # a request's headers and body must arrive within this
    timeout_keep_alive_s: float = 5.0     # idle keep-alive connections are closed after this
    max_connections: int = 1000           # beyond this, the oldest idle connections are closed
    limit_concurrency: int | None = None  # uvicorn: 503 beyond this many connections + tasks
    h11_max_incomplete_event_size: int = 64 * 1024   # largest request line + headers

    @classmethod
    def from_env(cls, **overrides: Any) -> "ServerConfig":
        env = {"host": os.environ.get("DGEMMA_STRUCT_HOST"), "port": os.environ.get("DGEMMA_STRUCT_PORT"),
               "model": os.environ.get("DGEMMA_STRUCT_MODEL"), "api_key": os.environ.get("DGEMMA_STRUCT_API_KEY"),
               "device": os.environ.get("DGEMMA_STRUCT_DEVICE"), "dtype": os.environ.get("DGEMMA_STRUCT_DTYPE")}
        values = {k: v for k, v in env.items() if v}
        if "port" in values:
            values["port"] = int(values["port"])
        values.update({k: v for k, v in overrides.items() if v is not None})
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


def load_runtime(model: str | None, device: str = "auto", dtype: str = "auto") -> DiffusionRuntime:
    """``model`` = a local checkpoint directory, or None for the embedded model. Never the hub.
    ``device`` / ``dtype``: as :meth:`DiffusionRuntime.from_pretrained` takes them."""
    if not model:
        return DiffusionRuntime.default(device=device, dtype=dtype)
    if not os.path.isdir(model):
        raise ModelLoadError(f"--model must be a local checkpoint directory; {model!r} is not one")
    return DiffusionRuntime.from_pretrained(model, local_files_only=True, device=device, dtype=dtype)
