"""The scheduling wing's tests: continuous batching (rows joining and leaving, repairs as rows,
statuses, failure containment) and the mode chooser, on a tiny random-weight model."""
import pytest

from dgemma_struct.testing import tiny_runtime as build_tiny_runtime


@pytest.fixture(scope="session")
def tiny_runtime():
    """The same tiny runtime as ``tests/generation`` (so batch outputs compare across the two)."""
    return build_tiny_runtime(max_denoising_steps=8, corpus_size=300)


from dgemma_struct.testing import embedded_runtime  # noqa: E402,F401  (a session-scoped fixture)
