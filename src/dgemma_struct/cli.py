"""The ``dgemma-struct`` command: ``demo`` (the main job), ``train``, ``eval``, ``serve``."""
from __future__ import annotations

import argparse
import json
import sys


def _cmd_train(args: argparse.Namespace) -> int:
    from dgemma_struct.training.train import train

    meta = train(args.out, minutes=args.minutes, max_steps=args.max_steps, batch_size=args.batch_size,
                 seed=args.seed, threads=args.threads)
    print(json.dumps(meta, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dgemma-struct", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("train", help="train the embedded model (tokenizer + diffusion and AR objectives)")
    p.add_argument("--out", default="runs/embedded")
    p.add_argument("--minutes", type=float, default=45.0)
    p.add_argument("--max-steps", type=int, default=100_000)
    p.add_argument("--batch-size", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=_cmd_train)

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
