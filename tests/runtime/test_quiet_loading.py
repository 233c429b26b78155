"""A first call loads the model quietly: no transformers "Loading weights" bar on stderr unless logging
asks for ``dgemma_struct`` at INFO, and transformers' own switch is left as it was."""
import logging
import os
import subprocess
import sys

import pytest

from dgemma_struct.runtime import _quiet_loading
from dgemma_struct.testing import embedded_model_available


CODE = """
import logging, sys
if sys.argv[1] == "info":
    logging.basicConfig(level=logging.INFO)
from transformers.utils import logging as hf_logging
from dgemma_struct.runtime import DiffusionRuntime
DiffusionRuntime.default(device="cpu")
print(hf_logging.is_progress_bar_enabled())
"""


def _load(level: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", CODE, level], capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.skipif(not embedded_model_available(), reason="embedded checkpoint missing")
def test_loading_is_quiet_by_default_and_shows_the_bar_when_logging_asks():
    quiet, asked = _load("default"), _load("info")
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "True\n", "")   # the switch is restored
    assert asked.returncode == 0 and "Loading weights" in asked.stderr


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture()
def transformers_log():
    hf = logging.getLogger("transformers")
    keep = _Keep()
    hf.addHandler(keep)
    yield keep
    hf.removeHandler(keep)


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError])
def test_a_load_that_does_not_return_prints_no_load_report(transformers_log, stop):
    """transformers logs its load report in a ``finally``: a Ctrl-C during the weight loading printed
    the multi-line report before ``error: interrupted``. Held records are dropped when the load raises."""
    hf = logging.getLogger("transformers")
    handlers = hf.handlers[:]
    with pytest.raises(stop):
        with _quiet_loading():
            logging.getLogger("transformers.modeling_utils").warning("LOAD REPORT")
            raise stop()
    assert transformers_log.messages == []
    assert hf.handlers == handlers                      # transformers' own handlers are back


def test_a_load_that_returns_emits_what_it_logged_in_order(transformers_log):
    with _quiet_loading():
        for i in range(3):
            logging.getLogger("transformers.modeling_utils").warning("note %d", i)
        assert transformers_log.messages == []
    assert transformers_log.messages == ["note 0", "note 1", "note 2"]
