"""Shared test set-up: one torch thread (two threads on a loaded 2-core box ran up to 70x
slower), Triton's interpreter on CPU-only machines (must be set before any @triton.jit module is
imported), and no hub access.

Gemma 4 tokenizer: ``gemma4_tokenizer`` is the rebuilt tokenizer from ``../shared`` when it sits next to
the clone, else a synthetic Gemma-4-shaped one (262,144 pieces, the real control-token ids; built in
seconds, see :func:`dgemma_struct.testing.write_gemma4_shaped_tokenizer`), so a bare clone runs every
test that needs only the shape. ``real_gemma4_tokenizer`` is for the few tests that need the real
vocabulary's token splits: it skips, saying so, when ``../shared`` is absent.
``DGEMMA_STRUCT_NO_SHARED=1`` hides ``../shared`` (a bare clone, without cloning)."""
import os
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if not os.environ.get("CUDA_VISIBLE_DEVICES") and not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import signal  # noqa: E402

import torch  # noqa: E402

torch.set_num_threads(1)

# A run started in the background of a non-interactive shell (`cmd &`, nohup) inherits SIGINT ignored, and
# so would every process a test starts (an ignored signal stays ignored across exec): the Ctrl-C tests
# would then measure the launcher, not the CLI. A handled signal is reset to the default on exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


import pytest  # noqa: E402

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
GEMMA4_DIR = SHARED_DATA / "gemma4-tokenizer"
NO_SHARED_REASON = "needs the real Gemma 4 vocabulary in ../shared/data/gemma4-tokenizer, which is not next to this clone"


def shared_available() -> bool:
    """Whether ``../shared/data`` is in view (``DGEMMA_STRUCT_NO_SHARED=1`` hides it)."""
    return SHARED_DATA.is_dir() and os.environ.get("DGEMMA_STRUCT_NO_SHARED", "") in ("", "0")


def gemma4_tokenizer_dir() -> Path:
    """The rebuilt tokenizer's folder in ../shared when in view, else the synthetic one (built once per process)."""
    if shared_available() and (GEMMA4_DIR / "tokenizer.json").exists():
        return GEMMA4_DIR
    from dgemma_struct.testing import gemma4_shaped_tokenizer_dir

    return Path(gemma4_shaped_tokenizer_dir())


@pytest.fixture(scope="session")
def gemma4_tokenizer():
    """A Gemma-4-shaped tokenizer: the real rebuild from ../shared, else the synthetic one."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gemma4_tokenizer_dir()))


@pytest.fixture(scope="session")
def real_gemma4_tokenizer():
    """The rebuilt Gemma 4 tokenizer from ../shared; skips (with the reason) when it is not in view."""
    if not (shared_available() and (GEMMA4_DIR / "tokenizer.json").exists()):
        pytest.skip(NO_SHARED_REASON)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(GEMMA4_DIR))


@pytest.fixture(scope="session")
def gemma4_random_runtime(gemma4_tokenizer):
    """A random-weight DiffusionGemma of the real shape (vocab 262,144, canvas 256, 5:1 sliding/full
    layers) with the Gemma 4 tokenizer and DiffusionGemma's stop set, 3 denoising steps per canvas."""
    from transformers import DiffusionGemmaForBlockDiffusion

    from dgemma_struct.engine.model_config import real_shape_config
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

    from dgemma_struct.engine.model_config import tiny_config
    from dgemma_struct.runtime import DiffusionRuntime
    from dgemma_struct.testing import gemma3_style_tokenizer

    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(tiny_config(vocab_size=512, canvas_length=16)).eval()
    gc = model.generation_config
    gc.eos_token_id, gc.pad_token_id, gc.max_denoising_steps = [1, 4], 0, 4
    return DiffusionRuntime(model, gemma3_style_tokenizer(), name="tiny-gemma3")
