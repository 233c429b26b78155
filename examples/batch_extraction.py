"""Batch extraction: many texts, one schema, one batched canvas loop (plus per-row repairs).

Run::

    python examples/batch_extraction.py --n 16
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Literal

from pydantic import BaseModel, Field

from dgemma_struct import DgemmaStructError, DiffusionRuntime, generate_batch


class Order(BaseModel):
    order_id: str = Field(pattern=r"^ORD-\d{5}$")
    product: str = Field(max_length=40)
    quantity: int = Field(ge=0)
    price: float = Field(ge=0)
    status: Literal["pending", "shipped", "delivered", "cancelled"]


PRODUCTS = ["desk", "lamp", "phone", "kettle", "chair", "monitor"]
STATUSES = ["pending", "shipped", "delivered", "cancelled"]


def texts(n: int, seed: int = 0) -> list[str]:
    r = random.Random(seed)
    return [f"ORD-{r.randint(10000, 99999)} is {r.choice(STATUSES)}: {r.randint(1, 30)} {r.choice(PRODUCTS)} "
            f"for {r.randint(1, 900)}.{r.randint(10, 99)} per unit." for _ in range(n)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--model", default=None, help="a local checkpoint dir (default: the embedded model)")
    args = ap.parse_args(argv)
    rt = (DiffusionRuntime.from_pretrained(args.model, local_files_only=True) if args.model
          else DiffusionRuntime.default())
    prompts = [f"Extract the order_id, product, quantity, price and status as JSON.\n{t}" for t in texts(args.n)]
    t0 = time.perf_counter()
    ok = failed = 0
    for i in range(0, len(prompts), args.batch_size):
        chunk = prompts[i:i + args.batch_size]
        for res in generate_batch(chunk, Order, runtime=rt, max_new_tokens=96, return_exceptions=True):
            if isinstance(res, DgemmaStructError):
                failed += 1
                print(json.dumps({"error": type(res).__name__, "message": str(res)[:200]}))
            else:
                ok += 1
                assert isinstance(res.value, Order)
                print(json.dumps({"order": res.value.model_dump(), "forward_passes": res.stats.forward_passes}))
    wall = time.perf_counter() - t0
    print(json.dumps({"summary": {"n": len(prompts), "ok": ok, "failed": failed, "wall_s": round(wall, 3)}}),
          file=sys.stderr)
    return 0 if ok else 1  # every row either validated or failed with a typed error; none validated = failure


if __name__ == "__main__":
    sys.exit(main())
