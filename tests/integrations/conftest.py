import pytest

from dgemma_struct.testing import embedded_runtime, tiny_runtime  # noqa: F401  (embedded_runtime: a fixture)


@pytest.fixture(scope="session")
def rt():
    return tiny_runtime()
