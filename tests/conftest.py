"""Shared test set-up: one torch thread (two threads on a loaded 2-core box ran up to 70x
slower), Triton's interpreter on CPU-only machines (must be set before any @triton.jit module is
imported), and no hub access."""
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if not os.environ.get("CUDA_VISIBLE_DEVICES") and not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

torch.set_num_threads(1)


import pytest  # noqa: E402

GEMMA4_DIR = __import__("pathlib").Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gemma4-tokenizer"


@pytest.fixture(scope="session")
def gemma4_tokenizer():
    """The rebuilt Gemma 4 tokenizer from ../shared (in CI a missing copy fails; it never skips there)."""
    if not (GEMMA4_DIR / "tokenizer.json").exists():
        if os.environ.get("CI"):
            pytest.fail(f"{GEMMA4_DIR} is missing in CI")
        pytest.skip("../shared/data/gemma4-tokenizer is not next to this clone")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(GEMMA4_DIR))


@pytest.fixture(scope="session")
def gemma4_random_runtime(gemma4_tokenizer):
    """A random-weight DiffusionGemma of the real shape (vocab 262,144, canvas 256, 5:1 sliding/full
    layers) with the Gemma 4 tokenizer and DiffusionGemma's stop set, 3 denoising steps per canvas."""
    from transformers import DiffusionGemmaForBlockDiffusion

    from dgemma_struct.model_config import real_shape_config
    from dgemma_struct.runtime import DiffusionRuntime

    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(real_shape_config()).eval()
    gc = model.generation_config
    gc.eos_token_id, gc.pad_token_id, gc.max_denoising_steps = [1, 106, 50], 0, 3
    rt = DiffusionRuntime(model, gemma4_tokenizer)
    assert set(rt.eos_token_ids) == {1, 106, 50}
    return rt


@pytest.fixture(scope="session")
def tiny_gemma3_runtime():
    """A random-weight tiny DiffusionGemma with a Gemma-3-style tokenizer: no thought-channel and no
    tool tokens, so thinking and tool requests must be refused with typed errors."""
    from transformers import DiffusionGemmaForBlockDiffusion

    from dgemma_struct.model_config import tiny_config
    from dgemma_struct.runtime import DiffusionRuntime
    from dgemma_struct.testing import gemma3_style_tokenizer

    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(tiny_config(vocab_size=512, canvas_length=16)).eval()
    gc = model.generation_config
    gc.eos_token_id, gc.pad_token_id, gc.max_denoising_steps = [1, 4], 0, 4
    return DiffusionRuntime(model, gemma3_style_tokenizer(), name="tiny-gemma3")
