"""The ``dgemma-struct`` command: ``demo`` (the main job), ``train``, ``eval``, ``serve``.

Every failure the command can foresee (a bad argument, a missing checkpoint, a device that is not
there) ends in one ``error: ...`` line on stderr and exit status 2, never a traceback."""
from __future__ import annotations

import argparse
import json
import os
import sys

DEVICE_HELP = "'auto' (CUDA when available, else CPU), 'cpu', 'cuda' or 'cuda:N'"
DTYPE_HELP = "'auto' (bf16 on CUDA, fp32 on CPU), 'bf16', 'fp16' or 'fp32'"


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (no usage block): ``error: PROG: MESSAGE``."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def _bounded(kind: type, low: float | None = None, high: float | None = None, *, strict: bool = False):
    """An argparse ``type=`` that parses ``kind`` and checks ``low <= x <= high`` (``low < x`` if strict)."""
    def parse(text: str):
        try:
            x = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}")
        if low is not None and (x <= low if strict else x < low) or high is not None and x > high:
            bound = f"> {low}" if strict else f">= {low}" if high is None else f"in [{low}, {high}]"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return x
    parse.__name__ = kind.__name__
    return parse


_POS_INT, _POS_FLOAT, _NONNEG_INT = _bounded(int, 1), _bounded(float, 0, strict=True), _bounded(int, 0)
_THREADS = _bounded(int, 1, 1024)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 600 else text[:597] + "..."


def _cmd_train(args: argparse.Namespace) -> int:
    from dgemma_struct.training.train import train

    meta = train(args.out, minutes=args.minutes, max_steps=args.max_steps, batch_size=args.batch_size,
                 seed=args.seed, threads=args.threads, lr=args.lr, resume=args.resume, device=args.device,
                 dtype=args.dtype, corpus=args.corpus, corpus_size=args.corpus_size)
    print(json.dumps(meta, indent=1))
    return 0


def _load(model: str | None, device: str, dtype: str):
    """The checkpoint in the local directory ``model`` (never the hub), or the embedded model."""
    from dgemma_struct.errors import ModelLoadError
    from dgemma_struct.runtime import DiffusionRuntime

    if not model:
        return DiffusionRuntime.default(device=device, dtype=dtype)
    if not os.path.isdir(model):
        raise ModelLoadError(f"--model must be a local checkpoint directory; {model!r} is not one")
    return DiffusionRuntime.from_pretrained(model, local_files_only=True, device=device, dtype=dtype)


def _cmd_eval(args: argparse.Namespace) -> int:
    from dgemma_struct.training.evaluate import evaluate

    rt = _load(args.model, args.device, args.dtype)
    report = evaluate(rt, n=args.n, splits_n=args.splits_n)
    text = json.dumps(report, indent=1)
    if args.out:
        from pathlib import Path

        Path(args.out).write_text(text)
    print(text)
    return 0


def _demo_preface(rt) -> str:
    """What the embedded model can do, read from its training corpus, before any result is shown."""
    from dgemma_struct.training.corpus import JSON_FAMILIES
    from dgemma_struct.training.dialect_corpus import TOOLS

    params = sum(p.numel() for p in rt.model.parameters()) / 1e6
    device = f"{rt.model.device} ({str(rt.model.dtype).removeprefix('torch.')})"
    return (f"dgemma-struct demo: the embedded {params:.2f}M-parameter DiffusionGemma on {device}, a toy trained\n"
            f"only on synthetic records (docs/model_card.md):\n"
            f"  - JSON extraction, {len(JSON_FAMILIES)} record families: {', '.join(JSON_FAMILIES)}\n"
            f"  - short answers: dates, emails, phone numbers, order codes, sentiment, topic, arithmetic,\n"
            f"    key=value settings\n"
            f"  - tool calls to {len(TOOLS)} declared tools ({', '.join(list(TOOLS)[:3])},\n"
            f"    {', '.join(list(TOOLS)[3:])}), and the same with thinking on\n"
            f"Every value below is valid for its type by construction. Prompts like these get right answers\n"
            f"most of the time; any other prompt gets valid but meaningless values (load a real checkpoint\n"
            f"with DiffusionRuntime.from_pretrained for that). Diffusion first, then AR on the same weights.\n")


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

    rt = DiffusionRuntime.default(device=args.device, dtype=args.dtype)
    # prompts of three training families (person JSON, phone regex, sentiment choice) that the model
    # answers right; the grounded demo below shows a miscopied email and how grounding fixes it
    jobs = [
        ("Extract the name, age and email as JSON.\nAlice Gomez is 51 years old and can be reached at "
         "alice44@example.com.", Person),
        ("Give the phone number.\nYou can call Ada on 555-867-5309 after six.", Regex(r"\d{3}-\d{3}-\d{4}")),
        ("Classify the sentiment as positive, negative or neutral.\nThe hotel was clean and the view was amazing.",
         Choice(["positive", "negative", "neutral"])),
    ]
    print(_demo_preface(rt))
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
    if config.host not in ("127.0.0.1", "localhost", "::1") and not config.api_key:
        print(f"warning: serving on {config.host} without --api-key", file=sys.stderr)
    try:
        serve(config, log_level=args.log_level)
    except ModelLoadError as err:
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 2
    return 0


def _add_device(p: argparse.ArgumentParser, default: str | None = "auto", env: str = "") -> None:
    p.add_argument("--device", default=default, help=f"{DEVICE_HELP}{env} (default auto)")
    p.add_argument("--dtype", default=default, help=f"{DTYPE_HELP}{env} (default auto)")


def build_parser() -> argparse.ArgumentParser:
    """The command's argument parser (every subcommand, with range checks on its numbers)."""
    parser = _Parser(prog="dgemma-struct", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("train", help="train the embedded model (tokenizer + diffusion and AR objectives)")
    p.add_argument("--out", default="runs/embedded")
    p.add_argument("--minutes", type=_POS_FLOAT, default=45.0)
    p.add_argument("--max-steps", type=_POS_INT, default=None,
                   help="step budget; makes the LR schedule (and the run) deterministic")
    p.add_argument("--batch-size", type=_POS_INT, default=24)
    p.add_argument("--seed", type=_NONNEG_INT, default=0)
    p.add_argument("--threads", type=_THREADS, default=2)
    p.add_argument("--lr", type=_POS_FLOAT, default=2e-3)
    p.add_argument("--resume", action="store_true", help="continue training the checkpoint in --out")
    p.add_argument("--corpus", choices=("default", "generalise"), default="default",
                   help="default: the eight record families the shipped model was trained on; generalise: random "
                        "record schemas and phrasings with held-out families and phrasings (docs/model_card.md)")
    p.add_argument("--corpus-size", type=_POS_INT, default=60_000, help="training examples built (default 60000)")
    _add_device(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("eval", help="held-out evaluation of a checkpoint (unconstrained)")
    p.add_argument("--model", default=None, help="local checkpoint dir (default: the embedded model)")
    p.add_argument("--n", type=_POS_INT, default=200)
    p.add_argument("--splits-n", type=_NONNEG_INT, default=8,
                   help="prompts per generalisation split (in-distribution, held-out families, held-out "
                        "phrasings; 0: skip them)")
    p.add_argument("--out", default=None)
    _add_device(p)
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("demo", help="the main job: typed extraction with the embedded model")
    p.add_argument("--seed", type=_NONNEG_INT, default=0)
    p.add_argument("--threads", type=_THREADS, default=1)
    _add_device(p)
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (FastAPI + uvicorn)")
    p.add_argument("--host", default=None, help="bind address (env DGEMMA_STRUCT_HOST; default 127.0.0.1)")
    p.add_argument("--port", type=_bounded(int, 0, 65535), default=None,
                   help="port (env DGEMMA_STRUCT_PORT; default 8000)")
    p.add_argument("--model", default=None,
                   help="local checkpoint directory (env DGEMMA_STRUCT_MODEL; default: the embedded model)")
    _add_device(p, None, env=" (env DGEMMA_STRUCT_DEVICE / DGEMMA_STRUCT_DTYPE)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (env DGEMMA_STRUCT_API_KEY)")
    p.add_argument("--max-batch-size", type=_POS_INT, default=None,
                   help="rows running at once (default 8)")
    p.add_argument("--batching", choices=("continuous",), default=None,
                   help="continuous (the only road): requests join and leave a running batch between canvases "
                        "(kept for old scripts; 'static' was removed)")
    p.add_argument("--mode-choice", choices=("requested", "auto"), default=None,
                   help="requested (default): diffusion; auto: each new batch runs diffusion or AR, whichever "
                        "measured more finished rows per second at the current load")
    p.add_argument("--max-wait-ms", type=_bounded(float, 0), default=None, help="batching window (default 10 ms)")
    p.add_argument("--max-queue", type=_POS_INT, default=None, help="waiting requests before 429 (default 64)")
    p.add_argument("--timeout", type=_POS_FLOAT, default=None, help="per-request timeout in seconds (default 60)")
    p.add_argument("--max-tokens-cap", type=_POS_INT, default=None, help="largest max_tokens accepted (default 1024)")
    p.add_argument("--queue-timeout", type=_POS_FLOAT, default=None,
                   help="longest wait in the queue before a 504, seconds (default: --timeout)")
    p.add_argument("--compile-timeout", type=_POS_FLOAT, default=None,
                   help="constraint compile limit, seconds (default 10)")
    p.add_argument("--compile-workers", type=_POS_INT, default=None, help="compile worker processes (default 2)")
    p.add_argument("--no-compile-isolation", action="store_true",
                   help="compile in the serving process (a native crash then kills the server)")
    p.add_argument("--header-timeout", type=_POS_FLOAT, default=None,
                   help="a request's headers and body must arrive within this many seconds (default 10)")
    p.add_argument("--keep-alive", type=_POS_FLOAT, default=None, help="idle keep-alive timeout, seconds (default 5)")
    p.add_argument("--max-connections", type=_POS_INT, default=None,
                   help="connections held at once; beyond, the oldest idle ones are closed (default 1000)")
    p.add_argument("--limit-concurrency", type=_POS_INT, default=None,
                   help="uvicorn's limit: 503 beyond this many connections + tasks (default: none)")
    p.add_argument("--stream-live", action="store_true",
                   help="stream canvases as they commit (a repair may then end a stream in stream_diverged)")
    p.add_argument("--no-warmup", action="store_true",
                   help="report ready at once instead of after one warm-up generation")
    p.add_argument("--drain-timeout", type=_POS_FLOAT, default=None,
                   help="after SIGTERM, longest wait for in-flight requests, seconds (default 30)")
    p.add_argument("--retry-after", type=_POS_INT, default=None,
                   help="Retry-After seconds on every 429 and 503 (default 1)")
    p.add_argument("--verdict-ttl", type=_POS_FLOAT, default=None,
                   help="how long a refused constraint is refused at once, seconds (default 3600)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug", "trace"))
    p.set_defaults(func=_cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the command; a foreseen failure prints one ``error: ...`` line to stderr and returns 2."""
    args = build_parser().parse_args(argv)
    from dgemma_struct.errors import DgemmaStructError

    try:
        return args.func(args)
    except (DgemmaStructError, OSError) as err:
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
