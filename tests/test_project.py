"""Project-level promises: the README's two commands, CI running exactly the second, the
embedded checkpoint shipped as package data."""
import re
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    return [line[2:] for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("$ ")]


def test_readme_has_exactly_two_quick_start_commands():
    cmds = _readme_commands()
    assert len(cmds) == 2
    install_demo, tests = cmds
    assert install_demo.startswith("pip install torch==2.13.0") and "dgemma-struct demo" in install_demo
    assert tests.startswith("pip install torch==2.13.0") and "pytest" in tests


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "sed -n 2p" in ci and "README.md" in ci and "set -euo pipefail" in ci


def test_torch_is_pinned():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'"torch==2\.13\.0"', pyproject)


def test_embedded_checkpoint_is_package_data():
    files = {p.name for p in resources.files("dgemma_struct.embedded").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= files
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"dgemma_struct.embedded" = ["*.json", "*.safetensors"' in pyproject
