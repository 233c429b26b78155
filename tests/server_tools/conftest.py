"""Fixtures for the server's tool-calling layer: a random-weight real-shape DiffusionGemma checkpoint
written to disk the way a server loads one, with the Gemma 4 tokenizer from ../shared when it sits next
to the clone, else the synthetic Gemma-4-shaped one (same control-token ids; see tests/conftest.py)."""
import os
import shutil
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
GEMMA4_DIR = SHARED_DATA / "gemma4-tokenizer"


def gemma4_tokenizer_dir() -> Path:
    """../shared's rebuilt tokenizer when in view (``DGEMMA_STRUCT_NO_SHARED=1`` hides it), else the
    synthetic one, built once per process."""
    hidden = os.environ.get("DGEMMA_STRUCT_NO_SHARED", "") not in ("", "0")
    if not hidden and (GEMMA4_DIR / "tokenizer.json").exists():
        return GEMMA4_DIR
    from dgemma_struct.testing import gemma4_shaped_tokenizer_dir

    return Path(gemma4_shaped_tokenizer_dir())


def _need_gemma4() -> None:
    """Kept for callers: a Gemma-4-shaped tokenizer is always available now (real or synthetic)."""


def write_real_shape_checkpoint(out: Path, *, seed: int = 0, denoising_steps: int = 3) -> Path:
    """Write a random-weight DiffusionGemma of the real shape (vocab 262,144, canvas 256, 5:1
    sliding/full layers; narrow and shallow) with the Gemma 4 tokenizer (real or synthetic), its chat template and
    DiffusionGemma's generation config (eos ``[1, 106, 50]``) into ``out``: a directory
    ``DiffusionRuntime.from_pretrained`` (and so ``dgemma-struct serve --model``) loads."""
    import torch
    from transformers import DiffusionGemmaForBlockDiffusion

    from dgemma_struct.engine.model_config import real_shape_config

    torch.manual_seed(seed)
    model = DiffusionGemmaForBlockDiffusion(real_shape_config()).eval()
    gc = model.generation_config
    gc.eos_token_id, gc.pad_token_id, gc.bos_token_id = [1, 106, 50], 0, 2
    gc.max_denoising_steps = denoising_steps   # 48 in the real config; 3 keeps a CPU test short
    model.save_pretrained(str(out))
    tok_dir = gemma4_tokenizer_dir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):   # copied: loading is slow
        shutil.copyfile(tok_dir / name, out / name)
    return out


@pytest.fixture(scope="session")
def real_shape_dir(tmp_path_factory) -> Path:
    """A saved random-weight real-shape checkpoint (about 50 MB, about a second to write)."""
    return write_real_shape_checkpoint(tmp_path_factory.mktemp("real_shape_ckpt"))


@pytest.fixture(scope="session")
def real_shape_runtime(real_shape_dir):
    from dgemma_struct.runtime import DiffusionRuntime

    return DiffusionRuntime.from_pretrained(real_shape_dir)
