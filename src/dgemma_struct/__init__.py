"""dgemma-struct: guaranteed structured outputs from DiffusionGemma text-diffusion models."""
from dgemma_struct.errors import DgemmaStructError

__version__ = "0.1.0"
__all__ = ["DgemmaStructError", "__version__"]
