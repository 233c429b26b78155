"""A training run's resumable state (optimizer, step, seconds, random states) on disk, written in parts
under 16 MiB so that a checkpoint directory stays within the repository's file-size limit."""
from __future__ import annotations

import io
from pathlib import Path

import torch

PART_BYTES = 15 * 2**20  # every file a checkpoint writes stays under 16 MiB


def save_state(state: dict, path: Path) -> None:
    """``torch.save(state)`` written as ``path`` (when it fits in one part) or ``path.000``, ``path.001``, …"""
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    for old in list(path.parent.glob(path.name + ".*")) + ([path] if path.exists() else []):
        old.unlink()
    if len(data) <= PART_BYTES:
        path.write_bytes(data)
        return
    for i in range(0, len(data), PART_BYTES):
        path.with_name(f"{path.name}.{i // PART_BYTES:03d}").write_bytes(data[i:i + PART_BYTES])


def load_state(path: Path) -> dict:
    """What :func:`save_state` wrote."""
    parts = sorted(path.parent.glob(path.name + ".[0-9][0-9][0-9]"))
    data = path.read_bytes() if path.exists() else b"".join(p.read_bytes() for p in parts)
    return torch.load(io.BytesIO(data), weights_only=False, map_location="cpu")
