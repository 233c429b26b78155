"""Project-level promises: the README's two commands, CI running exactly the second, the
embedded checkpoint shipped as package data."""
import fnmatch
import re
import subprocess
try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
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
    # the first installs only the package and its locked dependencies; the second adds the test extras
    assert "-c constraints.txt -e . " in install_demo and "[" not in install_demo
    assert '-c constraints.txt -e ".[dev]"' in tests


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "set -euo pipefail" in ci
    # run the script's own extraction line and compare with the README's second command
    extract = next(line for line in ci.splitlines() if line.startswith("cmd="))
    out = subprocess.run(["bash", "-c", f'{extract}; printf %s "$cmd"'], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out == _readme_commands()[1]
    # ... inside a brand-new venv without system site-packages, created before the command runs
    body = ci[ci.index("python3 -m venv"):]
    assert "--system-site-packages" not in ci and body.index("activate") < body.index('bash -c "$cmd"')
    # ... first in a bare clone with no ../shared beside it, then in this checkout
    runs = [line.strip() for line in body.splitlines() if 'bash -c "$cmd"' in line and not line.startswith("#")]
    assert runs == ['(cd "$tmp/bare" && test ! -e ../shared && bash -c "$cmd")', 'bash -c "$cmd"']
    assert body.index('git clone -q . "$tmp/bare"') < body.index(runs[0])
    assert 'tmp="$(mktemp -d)"' in ci   # a fresh folder: $tmp/shared does not exist


def _lock() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        assert version, f"constraints.txt: {line!r} is not an exact pin"
        pins[_canonical(name)] = version.split(";")[0].strip()
    return pins


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_lock_pins_every_dependency_exactly():
    pins = _lock()
    assert pins["torch"] == "2.13.0"  # the same pin as the README and pyproject.toml
    for direct in ("transformers", "llguidance", "pydantic", "pytest", "hypothesis", "hypothesis-jsonschema",
                   "schemathesis", "fastapi", "uvicorn", "openai", "outlines", "ray", "triton"):
        assert direct in pins, f"{direct} is not locked"
    # transitive dependencies are locked too (huggingface-hub comes only through transformers)
    assert "huggingface-hub" in pins and "pydantic-core" in pins
    assert "setuptools" in pins  # a runtime dependency of torch that `pip freeze` hides without --all


def test_installed_versions_match_the_lock():
    """Drift: every pinned package is installed at exactly its pinned version (local labels such as
    torch's ``+cpu`` aside). Fails in an environment not installed with ``-c constraints.txt``, or
    when the lock no longer describes the tested environment; see docs/install.md."""
    from importlib import metadata

    drift = []
    for name, version in sorted(_lock().items()):
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            drift.append(f"{name}: pinned {version}, not installed")
            continue
        if installed.split("+")[0] != version:
            drift.append(f"{name}: pinned {version}, installed {installed}")
    assert not drift, "installed packages differ from constraints.txt:\n" + "\n".join(drift)


def test_lock_respects_the_known_upper_bounds():
    from packaging.version import Version

    pins = _lock()
    assert Version(pins["hypothesis"]) < Version("6.170.10")  # hypothesis-jsonschema 0.23.1
    assert Version(pins["pytest"]) < Version("9.2")            # schemathesis <= 4.32.5


def test_torch_is_pinned():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'"torch==2\.13\.0"', pyproject)


def _package_data(package: str) -> list[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return data["tool"]["setuptools"]["package-data"][package]


def test_embedded_checkpoint_is_package_data():
    files = {p.name for p in resources.files("dgemma_struct.embedded").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json", "chat_template.jinja"} <= files
    # every checkpoint file ships in the wheel (a missing chat template once fell back silently)
    patterns = _package_data("dgemma_struct.embedded")
    for name in files - {"__init__.py", "__pycache__"}:
        assert any(fnmatch.fnmatch(name, pat) for pat in patterns), f"{name} is not package data"


def test_builtin_grammars_are_package_data():
    patterns = _package_data("dgemma_struct.grammars")
    for p in (ROOT / "grammars").iterdir():
        if p.suffix not in (".py", ".pyc") and p.is_file():
            assert any(fnmatch.fnmatch(p.name, pat) for pat in patterns), f"{p.name} is not package data"


def test_api_reference_is_regenerated():
    """docs/api.md is exactly what scripts/gen_api_docs.py writes from today's docstrings (no drift)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_api_docs", ROOT / "scripts" / "gen_api_docs.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.render_all() == (ROOT / "docs" / "api.md").read_text(), \
        "docs/api.md is stale: run `python scripts/gen_api_docs.py` and commit it"
