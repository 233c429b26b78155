"""``dgemma-struct generate``: one spec from the shell; the value on stdout (JSON for a schema, the
text otherwise); exit 0 ok, 1 no valid output, 2 usage or input error."""
from __future__ import annotations

import argparse
import json
import os
import sys

from dgemma_struct.cli.arguments import NONNEG_INT, POS_INT, add_device, load_runtime, one_line


def add_parser(sub) -> None:
    """Adds the ``generate`` subcommand to ``sub`` (an argparse subparsers object)."""
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
    p.add_argument("--seed", type=NONNEG_INT, default=0)
    p.add_argument("--max-new-tokens", type=POS_INT, default=None, help="token budget (default: the spec's)")
    p.add_argument("--json-lines", action="store_true", help="one prompt per stdin line (a JSON string, "
                   '{"prompt": ..., "source": ...} or text), run as one batch; one JSON line out per prompt')
    p.add_argument("--confidence", action="store_true", help='print {"value": ..., "confidence": {pointer: p}}')
    p.add_argument("--verbose", action="store_true", help="stats on stderr")
    add_device(p)
    p.set_defaults(func=run)


def _spec(args: argparse.Namespace):
    """The one spec the generate flags name (a usage error, exit 2, for none or several)."""
    from dgemma_struct.constraints import Choice, Grammar, Regex
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
            raise InvalidRequestError(f"--model-class {args.model_class!r}: {one_line(err)} "
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


def run(args: argparse.Namespace) -> int:
    """One spec from the shell; the value (JSON for a schema, the text otherwise) on stdout."""
    from dgemma_struct.api import generate_batch
    from dgemma_struct.errors import (DgemmaStructError, GenerationFailed, GenerationTimeout, InvalidRequestError,
                                      LengthError)
    from dgemma_struct.grounding import generate_grounded_batch, has_grounding
    spec = _spec(args)
    prompts, sources = _prompts(args)
    rt = load_runtime(args.model, args.device, args.dtype)
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
            print(f"error: {one_line(res)}", file=sys.stderr)
            status, res = 1, None
        elif isinstance(res, DgemmaStructError):
            raise res
        shown = None if res is None else _shown(res, args)
        if args.json_lines:
            print(json.dumps(shown, ensure_ascii=False))
        elif shown is not None:
            print(shown if isinstance(shown, str) else json.dumps(shown, ensure_ascii=False))
    return status
