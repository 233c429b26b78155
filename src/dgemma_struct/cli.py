"""The ``dgemma-struct`` command: ``demo`` (the main job), ``train``, ``eval``, ``serve``."""
from __future__ import annotations

import argparse
import json
import sys


def _cmd_train(args: argparse.Namespace) -> int:
    from dgemma_struct.training.train import train

    meta = train(args.out, minutes=args.minutes, max_steps=args.max_steps, batch_size=args.batch_size,
                 seed=args.seed, threads=args.threads, lr=args.lr, resume=args.resume)
    print(json.dumps(meta, indent=1))
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from dgemma_struct.runtime import DiffusionRuntime
    from dgemma_struct.training.evaluate import evaluate

    rt = DiffusionRuntime.from_pretrained(args.model) if args.model else DiffusionRuntime.default()
    report = evaluate(rt, n=args.n)
    text = json.dumps(report, indent=1)
    if args.out:
        from pathlib import Path

        Path(args.out).write_text(text)
    print(text)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    """The main job: typed JSON extraction on the embedded model, offline on a CPU."""
    import torch
    from pydantic import BaseModel

    from dgemma_struct import Choice, DiffusionRuntime, Regex, generate

    torch.set_num_threads(args.threads)

    class Person(BaseModel):
        name: str
        age: int
        email: str

    rt = DiffusionRuntime.default()
    jobs = [
        ("Extract the name, age and email as JSON.\nTara Zhang is 42 years old and can be reached at "
         "tzhang@post.io.", Person),
        ("Give the phone number.\nYou can call Ada on 555-867-5309 after six.", Regex(r"\d{3}-\d{3}-\d{4}")),
        ("Classify the sentiment as positive, negative or neutral.\nThe hotel was clean and the view was amazing.",
         Choice(["positive", "negative", "neutral"])),
    ]
    print("dgemma-struct demo: the embedded 4.9M-parameter DiffusionGemma on this CPU. Every value below is\n"
          "valid by construction; whether it is *right* is up to the model, and this toy model often\n"
          "miscopies names and numbers (docs/model_card.md). Diffusion first, then AR on the same weights.\n")
    for prompt, spec in jobs:
        print(f"prompt: {prompt!r}")
        for mode in ("diffusion", "ar"):
            res = generate(prompt, spec, runtime=rt, seed=args.seed, mode=mode, return_details=True)
            value = res.value.model_dump() if hasattr(res.value, "model_dump") else res.value
            s = res.stats
            print(f"  {mode:9s} value: {json.dumps(value)}  ({type(res.value).__name__})")
            print(f"  {'':9s} stats: {s.forward_passes} forward passes, {s.tokens_per_forward:.2f} tokens/forward, "
                  f"{s.forced_tokens} forced tokens, {s.repairs} repairs, fallback={s.fallback}, "
                  f"{s.wall_s * 1000:.0f} ms ({s.mask_s * 1000:.0f} ms constraint work)")
    from dgemma_struct.grounding import demo as grounded_demo

    print("\n" + grounded_demo(rt, seed=args.seed))
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from dgemma_struct.errors import ModelLoadError
    from dgemma_struct.server import ServerConfig, serve

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
                                   stream_live=True if args.stream_live else None)
    if config.host not in ("127.0.0.1", "localhost", "::1") and not config.api_key:
        print(f"warning: serving on {config.host} without --api-key", file=sys.stderr)
    try:
        serve(config, log_level=args.log_level)
    except ModelLoadError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dgemma-struct", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("train", help="train the embedded model (tokenizer + diffusion and AR objectives)")
    p.add_argument("--out", default="runs/embedded")
    p.add_argument("--minutes", type=float, default=45.0)
    p.add_argument("--max-steps", type=int, default=None,
                   help="step budget; makes the LR schedule (and the run) deterministic")
    p.add_argument("--batch-size", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--resume", action="store_true", help="continue training the checkpoint in --out")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("eval", help="held-out evaluation of a checkpoint (unconstrained)")
    p.add_argument("--model", default=None, help="checkpoint dir (default: the embedded model)")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--out", default=None)
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("demo", help="the main job: typed extraction with the embedded model")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (FastAPI + uvicorn)")
    p.add_argument("--host", default=None, help="bind address (env DGEMMA_STRUCT_HOST; default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (env DGEMMA_STRUCT_PORT; default 8000)")
    p.add_argument("--model", default=None,
                   help="local checkpoint directory (env DGEMMA_STRUCT_MODEL; default: the embedded model)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (env DGEMMA_STRUCT_API_KEY)")
    p.add_argument("--max-batch-size", type=int, default=None,
                   help="rows running at once (default 8)")
    p.add_argument("--batching", choices=("continuous", "static"), default=None,
                   help="continuous (default): requests join and leave a running batch between canvases; "
                        "static: batches formed in the queue run to their end")
    p.add_argument("--mode-choice", choices=("requested", "auto"), default=None,
                   help="requested (default): diffusion; auto: each new batch runs diffusion or AR, whichever "
                        "measured more finished rows per second at the current load (continuous batching only)")
    p.add_argument("--max-wait-ms", type=float, default=None, help="batching window (default 10 ms)")
    p.add_argument("--max-queue", type=int, default=None, help="waiting requests before 429 (default 64)")
    p.add_argument("--timeout", type=float, default=None, help="per-request timeout in seconds (default 60)")
    p.add_argument("--max-tokens-cap", type=int, default=None, help="largest max_tokens accepted (default 1024)")
    p.add_argument("--queue-timeout", type=float, default=None,
                   help="longest wait in the queue before a 504, seconds (default: --timeout)")
    p.add_argument("--compile-timeout", type=float, default=None, help="constraint compile limit, seconds (default 10)")
    p.add_argument("--compile-workers", type=int, default=None, help="compile worker processes (default 2)")
    p.add_argument("--no-compile-isolation", action="store_true",
                   help="compile in the serving process (a native crash then kills the server)")
    p.add_argument("--header-timeout", type=float, default=None,
                   help="a request's headers and body must arrive within this many seconds (default 10)")
    p.add_argument("--keep-alive", type=float, default=None, help="idle keep-alive timeout, seconds (default 5)")
    p.add_argument("--max-connections", type=int, default=None,
                   help="connections held at once; beyond, the oldest idle ones are closed (default 1000)")
    p.add_argument("--limit-concurrency", type=int, default=None,
                   help="uvicorn's limit: 503 beyond this many connections + tasks (default: none)")
    p.add_argument("--stream-live", action="store_true",
                   help="stream canvases as they commit (a repair may then end a stream in stream_diverged)")
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=_cmd_serve)

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
