"""The FastAPI example declares, on every generating route (its own handlers included), the error
response the integrations docs tell users to add: 502 with ``GenerationErrorResponse``."""
import importlib.util
import sys
from pathlib import Path

from dgemma_struct.testing import tiny_runtime

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fastapi_app.py"


def test_every_generating_route_declares_the_502_body():
    spec = importlib.util.spec_from_file_location("fastapi_app_errors_check", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # pydantic resolves the models' postponed annotations through it
    spec.loader.exec_module(mod)
    paths = mod.build_app(tiny_runtime()).openapi()["paths"]
    posts = {path: ops["post"] for path, ops in paths.items() if "post" in ops}
    assert set(posts) == {"/orders", "/contacts", "/phone"}
    for path, op in posts.items():
        body = op["responses"].get("502", {}).get("content", {}).get("application/json", {}).get("schema", {})
        assert body.get("$ref", "").endswith("/GenerationErrorResponse"), (path, op["responses"])
