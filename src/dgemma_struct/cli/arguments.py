"""Argument types with range checks and the flags several commands share (``--device`` /
``--dtype``, ``--model``), and the one-line form of an error the command prints.

    >>> POS_INT("3"), NONNEG_INT("0")
    (3, 0)
    >>> bounded(float, 0, 1)("2")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be in [0, 1], got 2
"""
from __future__ import annotations

import argparse
import os

DEVICE_HELP = "'auto' (CUDA when available, else CPU), 'cpu', 'cuda' or 'cuda:N'"
DTYPE_HELP = "'auto' (bf16 on CUDA, fp32 on CPU), 'bf16', 'fp16' or 'fp32'"


def bounded(kind: type, low: float | None = None, high: float | None = None, *, strict: bool = False):
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


POS_INT, POS_FLOAT, NONNEG_INT = bounded(int, 1), bounded(float, 0, strict=True), bounded(int, 0)
THREADS = bounded(int, 1, 1024)


def add_device(p: argparse.ArgumentParser, default: str | None = "auto", env: str = "") -> None:
    """Adds ``--device`` and ``--dtype`` to ``p``."""
    p.add_argument("--device", default=default, help=f"{DEVICE_HELP}{env} (default auto)")
    p.add_argument("--dtype", default=default, help=f"{DTYPE_HELP}{env} (default auto)")


def one_line(err: BaseException) -> str:
    """``err`` as one line of at most 600 characters."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 600 else text[:597] + "..."


def load_runtime(model: str | None, device: str, dtype: str):
    """The checkpoint in the local directory ``model`` (never the hub), or the embedded model."""
    from dgemma_struct.errors import ModelLoadError
    from dgemma_struct.runtime import DiffusionRuntime
    if not model:
        return DiffusionRuntime.default(device=device, dtype=dtype)
    if not os.path.isdir(model):
        raise ModelLoadError(f"--model must be a local checkpoint directory; {model!r} is not one")
    return DiffusionRuntime.from_pretrained(model, local_files_only=True, device=device, dtype=dtype)
