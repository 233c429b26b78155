"""``dgemma-struct serve``: the OpenAI-compatible HTTP server (FastAPI + uvicorn); its flags are
``ServerConfig``'s fields (environment variables for the ones a deployment sets)."""
from __future__ import annotations

import argparse
import os
import sys

from dgemma_struct.cli.arguments import POS_FLOAT, POS_INT, add_device, bounded, one_line


def add_parser(sub) -> None:
    """Adds the ``serve`` subcommand to ``sub`` (an argparse subparsers object)."""
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (FastAPI + uvicorn)")
    p.add_argument("--host", default=None, help="bind address (env DGEMMA_STRUCT_HOST; default 127.0.0.1)")
    p.add_argument("--port", type=bounded(int, 0, 65535), default=None,
                   help="port (env DGEMMA_STRUCT_PORT; default 8000)")
    p.add_argument("--model", default=None,
                   help="local checkpoint directory (env DGEMMA_STRUCT_MODEL; default: the embedded model)")
    add_device(p, None, env=" (env DGEMMA_STRUCT_DEVICE / DGEMMA_STRUCT_DTYPE)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (env DGEMMA_STRUCT_API_KEY)")
    p.add_argument("--max-batch-size", type=POS_INT, default=None,
                   help="rows running at once (default 8)")
    p.add_argument("--batching", choices=("continuous",), default=None,
                   help="continuous (the only road): requests join and leave a running batch between canvases "
                        "(kept for old scripts; 'static' was removed)")
    p.add_argument("--mode-choice", choices=("requested", "auto"), default=None,
                   help="requested (default): diffusion; auto: each new batch runs diffusion or AR, whichever "
                        "measured more finished rows per second at the current load")
    p.add_argument("--max-wait-ms", type=bounded(float, 0), default=None, help="batching window (default 10 ms)")
    p.add_argument("--max-queue", type=POS_INT, default=None, help="waiting requests before 429 (default 64)")
    p.add_argument("--timeout", type=POS_FLOAT, default=None, help="per-request timeout in seconds (default 60)")
    p.add_argument("--max-tokens-cap", type=POS_INT, default=None, help="largest max_tokens accepted (default 1024)")
    p.add_argument("--queue-timeout", type=POS_FLOAT, default=None,
                   help="longest wait in the queue before a 504, seconds (default: --timeout)")
    p.add_argument("--compile-timeout", type=POS_FLOAT, default=None,
                   help="constraint compile limit, seconds (default 10)")
    p.add_argument("--compile-workers", type=POS_INT, default=None, help="compile worker processes (default 2)")
    p.add_argument("--no-compile-isolation", action="store_true",
                   help="compile in the serving process (a native crash then kills the server)")
    p.add_argument("--header-timeout", type=POS_FLOAT, default=None,
                   help="a request's headers and body must arrive within this many seconds (default 10)")
    p.add_argument("--keep-alive", type=POS_FLOAT, default=None, help="idle keep-alive timeout, seconds (default 5)")
    p.add_argument("--max-connections", type=POS_INT, default=None,
                   help="connections held at once; beyond, the oldest idle ones are closed (default 1000)")
    p.add_argument("--limit-concurrency", type=POS_INT, default=None,
                   help="uvicorn's limit: 503 beyond this many connections + tasks (default: none)")
    p.add_argument("--stream-live", action="store_true",
                   help="stream canvases as they commit (a repair may then end a stream in stream_diverged)")
    p.add_argument("--no-warmup", action="store_true",
                   help="report ready at once instead of after one warm-up generation")
    p.add_argument("--drain-timeout", type=POS_FLOAT, default=None,
                   help="after SIGTERM, longest wait for in-flight requests, seconds (default 30)")
    p.add_argument("--retry-after", type=POS_INT, default=None,
                   help="Retry-After seconds on every 429 and 503 (default 1)")
    p.add_argument("--verdict-ttl", type=POS_FLOAT, default=None,
                   help="how long a refused constraint is refused at once, seconds (default 3600)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug", "trace"))
    p.set_defaults(func=run)


def _check_bind(host: str, port: int) -> None:
    """Fails in one line, before the model loads, when ``host:port`` cannot be listened on."""
    import socket

    from dgemma_struct.errors import InvalidRequestError
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as uvicorn binds
            s.bind(addr)
    except OSError as err:
        raise InvalidRequestError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None


def run(args: argparse.Namespace) -> int:
    """Checks the flags, the device and the port before the model loads, then serves until stopped."""
    from dgemma_struct.errors import InvalidRequestError, ModelLoadError
    from dgemma_struct.server import ServerConfig, serve

    try:
        port = int(os.environ.get("DGEMMA_STRUCT_PORT") or 0)
    except ValueError:
        raise InvalidRequestError(f"DGEMMA_STRUCT_PORT must be an integer, got {os.environ['DGEMMA_STRUCT_PORT']!r}")
    if args.port is None and not 0 <= port <= 65535:
        raise InvalidRequestError(f"DGEMMA_STRUCT_PORT must be in [0, 65535], got {port}")
    config = ServerConfig.from_env(host=args.host, port=args.port, model=args.model, api_key=args.api_key,
                                   max_batch_size=args.max_batch_size, max_wait_ms=args.max_wait_ms,
                                   batching=args.batching, mode_choice=args.mode_choice,
                                   max_queue=args.max_queue, request_timeout_s=args.timeout,
                                   max_tokens_cap=args.max_tokens_cap, queue_timeout_s=args.queue_timeout,
                                   compile_timeout_s=args.compile_timeout,
                                   max_concurrent_compiles=args.compile_workers,
                                   isolate_compiles=False if args.no_compile_isolation else None,
                                   header_timeout_s=args.header_timeout, timeout_keep_alive_s=args.keep_alive,
                                   max_connections=args.max_connections, limit_concurrency=args.limit_concurrency,
                                   stream_live=True if args.stream_live else None, device=args.device,
                                   dtype=args.dtype, warmup=False if args.no_warmup else None,
                                   drain_timeout_s=args.drain_timeout, retry_after_s=args.retry_after,
                                   verdict_ttl_s=args.verdict_ttl)
    from dgemma_struct.runtime import resolve_device, resolve_dtype

    resolve_dtype(config.dtype, resolve_device(config.device))   # bad names fail before the port check
    if config.model and not os.path.isdir(config.model):
        raise ModelLoadError(f"--model must be a local checkpoint directory; {config.model!r} is not one")
    _check_bind(config.host, config.port)
    if config.host not in ("127.0.0.1", "localhost", "::1") and not config.api_key:
        print(f"warning: serving on {config.host} without --api-key", file=sys.stderr)
    try:
        serve(config, log_level=args.log_level)
    except ModelLoadError as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    return 0
