"""The dgemma-struct command: demo (the main job), generate (one spec from the shell), train, eval, serve.

Every failure the command can foresee (a bad argument, a missing checkpoint, a device that is not
there, a port in use) ends in one "error: ..." line on stderr and exit status 2, never a traceback;
generate exits 1 when no valid output could be produced."""
from __future__ import annotations

import argparse
import atexit
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
    from dgemma_struct.training.finetune_args import finetune_kwargs
    from dgemma_struct.training.train import train
    meta = train(args.out, minutes=args.minutes, max_steps=args.max_steps, batch_size=args.batch_size,
                 seed=args.seed, threads=args.threads, lr=args.lr, resume=args.resume, device=args.device,
                 dtype=args.dtype, corpus=args.corpus, corpus_size=args.corpus_size, **finetune_kwargs(args))
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


def _cmd_demo(args: argparse.Namespace) -> int:
    """The main job: typed JSON extraction on the embedded model, offline on a CPU."""
    import torch

    from dgemma_struct.runtime import DiffusionRuntime
    from dgemma_struct.training.demo import demo_lines

    torch.set_num_threads(args.threads)
    for line in demo_lines(DiffusionRuntime.default(device=args.device, dtype=args.dtype), seed=args.seed):
        print(line, flush=True)
    return 0


def _spec(args: argparse.Namespace):
    """The one spec the generate flags name (a usage error, exit 2, for none or several)."""
    from dgemma_struct import Choice, Grammar, Regex
    from dgemma_struct.errors import InvalidRequestError

    given = [f for f in ("schema", "model_class", "regex", "choice", "grammar") if getattr(args, f) is not None]
    if len(given) != 1:
        raise InvalidRequestError("give exactly one of --schema, --model-class, --regex, --choice, --grammar")
    if args.schema is not None:
        try:
            return json.loads(_read(args.schema))
        except json.JSONDecodeError as err:
            raise InvalidRequestError(f"--schema {args.schema}: not JSON ({err})") from None
    if args.model_class is not None:
        import importlib

        module, _, name = args.model_class.partition(":")
        sys.path.insert(0, os.getcwd())   # pkg.module is looked up where the command runs, as uvicorn does
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError) as err:
            raise InvalidRequestError(f"--model-class {args.model_class!r}: {_one_line(err)} "
                                      "(expected pkg.module:Class)") from None
        return cls
    if args.regex is not None:
        return Regex(args.regex)
    if args.choice is not None:
        return Choice([c.strip() for c in args.choice.split(",")])
    return Grammar(_read(args.grammar))


def _read(path: str) -> str:
    return sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()


def _prompts(args: argparse.Namespace) -> tuple[list, list]:
    """(prompts, sources): one prompt (the argument, or stdin for '-' or none), or with --json-lines
    one per non-blank stdin line: a JSON string, a JSON object {"prompt": ..., "source": ...}, or text."""
    from dgemma_struct.errors import InvalidRequestError

    source = _read(args.source) if args.source else None
    text = sys.stdin.read() if args.prompt in (None, "-") else args.prompt
    if not args.json_lines:
        return [text.rstrip("\n") if args.prompt in (None, "-") else text], [source]
    prompts, sources = [], []
    for n, line in enumerate(filter(str.strip, text.splitlines()), 1):
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            item = line
        if isinstance(item, dict) and "prompt" in item:
            item, src = item["prompt"], item.get("source", source)
        else:
            src = source
        if not isinstance(item, (str, list)):
            raise InvalidRequestError(f"--json-lines line {n}: expected a prompt, got {type(item).__name__}")
        prompts.append(item)
        sources.append(src)
    if not prompts:
        raise InvalidRequestError("--json-lines: no prompt on stdin")
    return prompts, sources


def _shown(res, args: argparse.Namespace):
    value = res.value.model_dump(mode="json") if hasattr(res.value, "model_dump") else res.value
    if args.verbose and res.stats is not None:
        s = res.stats
        print(f"stats: {s.forward_passes} forward passes, {s.tokens_per_forward:.2f} tokens/forward, {s.repairs} "
              f"repairs, fallback={s.fallback}, {s.wall_s * 1000:.0f} ms, finish={s.finish_reason}", file=sys.stderr)
    extra = {"spans": [sp.to_dict() for sp in res.spans]} if hasattr(res, "spans") and args.regex is None else {}
    if args.confidence:
        extra["confidence"] = getattr(res, "confidence", None)
    return {"value": value, **extra} if extra else value


def _cmd_generate(args: argparse.Namespace) -> int:
    """One spec from the shell; the value (JSON for a schema, the text otherwise) on stdout."""
    from dgemma_struct import generate_batch
    from dgemma_struct.errors import (DgemmaStructError, GenerationFailed, GenerationTimeout, InvalidRequestError,
                                      LengthError)
    from dgemma_struct.grounding import generate_grounded_batch, has_grounding
    spec = _spec(args)
    prompts, sources = _prompts(args)
    rt = _load(args.model, args.device, args.dtype)
    knobs = dict(runtime=rt, seed=args.seed, mode=args.mode)
    if args.max_new_tokens is not None:
        knobs["max_new_tokens"] = args.max_new_tokens
    if args.grounded or args.source or any(sources):
        if args.choice is not None or args.grammar is not None:
            raise InvalidRequestError("grounded output needs --schema, --model-class or --regex")
        if args.regex is not None:   # a grounded string that matches the regex: a span of the document
            spec = {"type": "string", "pattern": f"^(?:{args.regex})$"}
        out = generate_grounded_batch(prompts, spec, sources=sources, ground=None if has_grounding(spec) else
                                      "strings", return_exceptions=True, **knobs)
    else:
        out = generate_batch(prompts, spec, return_exceptions=True, confidence=args.confidence, **knobs)
    status = 0
    for res in out:
        if isinstance(res, (GenerationFailed, GenerationTimeout, LengthError)):
            print(f"error: {_one_line(res)}", file=sys.stderr)
            status, res = 1, None
        elif isinstance(res, DgemmaStructError):
            raise res
        shown = None if res is None else _shown(res, args)
        if args.json_lines:
            print(json.dumps(shown, ensure_ascii=False))
        elif shown is not None:
            print(shown if isinstance(shown, str) else json.dumps(shown, ensure_ascii=False))
    return status


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
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 2
    return 0


def _add_device(p: argparse.ArgumentParser, default: str | None = "auto", env: str = "") -> None:
    p.add_argument("--device", default=default, help=f"{DEVICE_HELP}{env} (default auto)")
    p.add_argument("--dtype", default=default, help=f"{DTYPE_HELP}{env} (default auto)")


def build_parser() -> argparse.ArgumentParser:
    """The command's argument parser (every subcommand, with range checks on its numbers)."""
    from dgemma_struct.training.finetune_args import add_finetune_arguments
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
    add_finetune_arguments(p)
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

    p = sub.add_parser("generate", help="one constrained generation from the shell (exit 0 ok, 1 no valid "
                       "output, 2 usage)", description="Generates output that matches one spec. The value goes to "
                       "stdout: JSON for --schema / --model-class, the text for the others. Exit status: 0 ok, "
                       "1 no valid output (repairs exhausted, budget too small, timeout), 2 usage or input error.")
    p.add_argument("prompt", nargs="?", default=None, help="the prompt; '-' or none: read it from stdin")
    p.add_argument("--schema", metavar="FILE.json", help="a JSON Schema file ('-': stdin)")
    p.add_argument("--model-class", metavar="pkg.module:Class", help="a pydantic model, imported from the current dir")
    p.add_argument("--regex", help="a regular expression the whole output matches")
    p.add_argument("--choice", metavar="a,b,c", help="comma-separated options; the output is one of them")
    p.add_argument("--grammar", metavar="FILE.lark", help="a Lark grammar file")
    p.add_argument("--grounded", action="store_true", help="grounded output: every string (a --regex match too) is "
                   "a verbatim span of the prompt's document (the text after its first line, or the one-line prompt)")
    p.add_argument("--source", metavar="FILE", help="grounded output with FILE as the document; with --schema or "
                   "--model-class prints {value, spans}")
    p.add_argument("--model", default=None, help="local checkpoint dir (default: the embedded model)")
    p.add_argument("--mode", choices=("diffusion", "ar"), default="diffusion")
    p.add_argument("--seed", type=_NONNEG_INT, default=0)
    p.add_argument("--max-new-tokens", type=_POS_INT, default=None, help="token budget (default: the spec's)")
    p.add_argument("--json-lines", action="store_true", help="one prompt per stdin line (a JSON string, "
                   '{"prompt": ..., "source": ...} or text), run as one batch; one JSON line out per prompt')
    p.add_argument("--confidence", action="store_true", help='print {"value": ..., "confidence": {pointer: p}}')
    p.add_argument("--verbose", action="store_true", help="stats on stderr")
    _add_device(p)
    p.set_defaults(func=_cmd_generate)

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
    """Runs the command; a foreseen failure prints one ``error: ...`` line and returns 2, a Ctrl-C exits 130."""
    from dgemma_struct.errors import DgemmaStructError
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except (DgemmaStructError, OSError) as err:
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # exit without the finaliser: its C++ destructors aborted (-6) a serve stopped mid-load
        print("error: interrupted", file=sys.stderr, flush=True)
        try:
            sys.stdout.flush()
            atexit._run_exitfuncs()   # stops the compile workers
        finally:
            os._exit(130)


if __name__ == "__main__":
    sys.exit(main())
