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

from dgemma_struct.cli.arguments import NONNEG_INT, POS_FLOAT, POS_INT, THREADS, add_device, load_runtime, one_line


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (no usage block): ``error: PROG: MESSAGE``."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def _cmd_train(args: argparse.Namespace) -> int:
    from dgemma_struct.training.finetune_args import finetune_kwargs
    from dgemma_struct.training.train import train
    meta = train(args.out, minutes=args.minutes, max_steps=args.max_steps, batch_size=args.batch_size,
                 seed=args.seed, threads=args.threads, lr=args.lr, resume=args.resume, device=args.device,
                 dtype=args.dtype, corpus=args.corpus, corpus_size=args.corpus_size, **finetune_kwargs(args))
    print(json.dumps(meta, indent=1))
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from dgemma_struct.training.evaluate import evaluate

    rt = load_runtime(args.model, args.device, args.dtype)
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


def build_parser() -> argparse.ArgumentParser:
    """The command's argument parser (every subcommand, with range checks on its numbers)."""
    from dgemma_struct.cli import generate, serve
    from dgemma_struct.training.finetune_args import add_finetune_arguments

    parser = _Parser(prog="dgemma-struct", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("train", help="train the embedded model (tokenizer + diffusion and AR objectives)")
    p.add_argument("--out", default="runs/embedded")
    p.add_argument("--minutes", type=POS_FLOAT, default=45.0)
    p.add_argument("--max-steps", type=POS_INT, default=None,
                   help="step budget; makes the LR schedule (and the run) deterministic")
    p.add_argument("--batch-size", type=POS_INT, default=24)
    p.add_argument("--seed", type=NONNEG_INT, default=0)
    p.add_argument("--threads", type=THREADS, default=2)
    p.add_argument("--lr", type=POS_FLOAT, default=2e-3)
    p.add_argument("--resume", action="store_true", help="continue training the checkpoint in --out")
    p.add_argument("--corpus", choices=("default", "generalise"), default="default",
                   help="default: the eight record families the shipped model was trained on; generalise: random "
                        "record schemas and phrasings with held-out families and phrasings (docs/model_card.md)")
    p.add_argument("--corpus-size", type=POS_INT, default=60_000, help="training examples built (default 60000)")
    add_finetune_arguments(p)
    add_device(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("eval", help="held-out evaluation of a checkpoint (unconstrained)")
    p.add_argument("--model", default=None, help="local checkpoint dir (default: the embedded model)")
    p.add_argument("--n", type=POS_INT, default=200)
    p.add_argument("--splits-n", type=NONNEG_INT, default=8,
                   help="prompts per generalisation split (in-distribution, held-out families, held-out "
                        "phrasings; 0: skip them)")
    p.add_argument("--out", default=None)
    add_device(p)
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("demo", help="the main job: typed extraction with the embedded model")
    p.add_argument("--seed", type=NONNEG_INT, default=0)
    p.add_argument("--threads", type=THREADS, default=1)
    add_device(p)
    p.set_defaults(func=_cmd_demo)

    generate.add_parser(sub)
    serve.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the command; a foreseen failure prints one ``error: ...`` line and returns 2, a Ctrl-C exits 130."""
    from dgemma_struct.errors import DgemmaStructError
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except (DgemmaStructError, OSError) as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # exit without the finaliser: its C++ destructors aborted (-6) a serve stopped mid-load
        print("error: interrupted", file=sys.stderr, flush=True)
        try:
            sys.stdout.flush()
            atexit._run_exitfuncs()   # stops the compile workers
        finally:
            os._exit(130)
