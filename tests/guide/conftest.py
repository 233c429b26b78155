import pytest

from dgemma_struct.testing import tiny_runtime as build_tiny_runtime


@pytest.fixture(scope="session")
def tok_runtime():
    """Only its tokenizer and stop set are used: the guide is driven by hand-built step views."""
    return build_tiny_runtime(corpus_size=300)


from dgemma_struct.testing import embedded_runtime  # noqa: E402,F401  (a session-scoped fixture)
