"""Which device and dtype a model runs on: ``"auto"`` and the names the command line accepts, each
refusal one :class:`~dgemma_struct.errors.ModelLoadError` line."""
from __future__ import annotations

import torch

from dgemma_struct.errors import ModelLoadError

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
          "half": torch.float16, "fp32": torch.float32, "float32": torch.float32, "float": torch.float32}


def resolve_device(device: "str | torch.device | None" = "auto") -> torch.device:
    """``"auto"`` (or None): CUDA when available, else the CPU; ``"cpu"``, ``"cuda"``, ``"cuda:1"``
    or a :class:`torch.device`. Raises :class:`ModelLoadError` (one line) for an unknown device, CUDA
    on a machine without it, or an index past the last GPU.

    >>> resolve_device("cpu")
    device(type='cpu')
    """
    if device is None or (isinstance(device, str) and device.strip().lower() == "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = device if isinstance(device, torch.device) else torch.device(str(device).strip().lower())
    except (RuntimeError, ValueError, TypeError) as err:
        raise ModelLoadError(f"unknown device {device!r}; expected 'auto', 'cpu', 'cuda' or 'cuda:N'") from err
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type != "cuda":
        raise ModelLoadError(f"unsupported device {str(dev)!r}; expected 'auto', 'cpu', 'cuda' or 'cuda:N'")
    if not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise ModelLoadError(f"device {str(dev)!r} requested but CUDA is not available ({why}); use --device cpu")
    count = torch.cuda.device_count()
    if dev.index is not None and not 0 <= dev.index < count:
        raise ModelLoadError(f"device {str(dev)!r} does not exist: this machine has {count} CUDA device(s)")
    return torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())


def resolve_dtype(dtype: "str | torch.dtype | None", device: torch.device) -> torch.dtype:
    """``"auto"`` (or None): bfloat16 on CUDA, float32 elsewhere; ``"bf16"``/``"bfloat16"``,
    ``"fp16"``/``"float16"``, ``"fp32"``/``"float32"`` or one of those torch dtypes. Anything else
    raises :class:`ModelLoadError` (one line).

    >>> resolve_dtype("auto", torch.device("cpu")), resolve_dtype("bf16", torch.device("cpu"))
    (torch.float32, torch.bfloat16)
    """
    if dtype is None or (isinstance(dtype, str) and dtype.strip().lower() == "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype) and dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ModelLoadError(f"unsupported dtype {dtype}; expected bf16, fp16 or fp32")
    if isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).strip().lower().removeprefix("torch.")
    if key not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; expected 'auto', 'bf16', 'fp16' or 'fp32'")
    return DTYPES[key]
