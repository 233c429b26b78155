"""The command starts without torch: ``import dgemma_struct`` and the parser are light (the package
root imports its public names on first use), so ``--help`` is quick and a Ctrl-C while torch loads is
the command's one line and exit 130, never an import traceback."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest


def test_the_root_and_the_parser_load_without_torch():
    code = ("import sys, dgemma_struct, dgemma_struct.cli as c; c.build_parser(); "
            "print('torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["False", "False"], out.stdout + out.stderr


def test_every_public_name_resolves_and_is_listed():
    import dgemma_struct

    names = set(dgemma_struct.__all__) - {"__version__"}
    assert names == set(dgemma_struct._EXPORTS)
    assert all(getattr(dgemma_struct, n) is not None for n in names) and names <= set(dir(dgemma_struct))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        dgemma_struct.nope  # noqa: B018


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGINT to a child is POSIX; /proc is Linux")
def test_ctrl_c_while_torch_loads_is_one_line(mapped):
    code = "import sys; from dgemma_struct.cli import main; sys.exit(main(['generate', '--regex', '[0-9]+', 'hi']))"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # once torch's library is mapped the command runs (torch is imported inside it) and takes seconds
    # more; a fixed sleep sent the signal before main() on a loaded machine (Python's own traceback)
    deadline = time.monotonic() + 120
    while not mapped(proc.pid, "libtorch") and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err, err[-3000:]
    assert proc.returncode == 130 and [ln for ln in err.splitlines() if ln.strip()] == ["error: interrupted"], err
