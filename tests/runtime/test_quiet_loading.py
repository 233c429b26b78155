"""A first call loads the model quietly: no transformers "Loading weights" bar on stderr unless logging
asks for ``dgemma_struct`` at INFO, and transformers' own switch is left as it was."""
import os
import subprocess
import sys

import pytest

from dgemma_struct.testing import embedded_model_available

pytestmark = pytest.mark.skipif(not embedded_model_available(), reason="embedded checkpoint missing")

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


def test_loading_is_quiet_by_default_and_shows_the_bar_when_logging_asks():
    quiet, asked = _load("default"), _load("info")
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "True\n", "")   # the switch is restored
    assert asked.returncode == 0 and "Loading weights" in asked.stderr
