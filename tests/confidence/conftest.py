import pytest

from dgemma_struct.testing import tiny_runtime as build_tiny_runtime


@pytest.fixture(scope="session")
def tiny_runtime():
    """A random-weight DiffusionGemma with a small byte-level BPE: its outputs are far from certain,
    so confidences spread over (0, 1)."""
    return build_tiny_runtime(max_denoising_steps=8, corpus_size=300)


from dgemma_struct.testing import embedded_runtime  # noqa: E402,F401  (a session-scoped fixture)
