"""What the CLI tests share: how a test knows a child process got to a stage (a file it maps)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest


def _mapped(pid: int, name: str) -> bool:
    try:
        return name in Path(f"/proc/{pid}/maps").read_text()
    except OSError:   # the process has exited
        return False


@pytest.fixture
def mapped() -> Callable[[int, str], bool]:
    """``mapped(pid, name)``: whether process ``pid`` has a file whose path contains ``name`` mapped
    (``/proc/PID/maps``; False once it has exited), e.g. libtorch while torch imports."""
    return _mapped
