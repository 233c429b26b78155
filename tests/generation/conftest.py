import pytest
import torch

from dgemma_struct.model_config import tiny_config
from dgemma_struct.runtime import DiffusionRuntime
from dgemma_struct.sampler import DiffusionSettings
from dgemma_struct.training.corpus import make_corpus
from dgemma_struct.training.train import build_tokenizer


@pytest.fixture(scope="session")
def tiny_runtime():
    """A random-weight DiffusionGemma with a small byte-level BPE: the worst case for validity,
    since the model knows nothing and every structure must come from the constraint layer."""
    from transformers import DiffusionGemmaForBlockDiffusion

    corpus = make_corpus(300, seed=5)
    tok = build_tokenizer([e["prompt"] for e in corpus] + [e["answer"] for e in corpus], vocab_size=512)
    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(tiny_config(vocab_size=len(tok), canvas_length=16)).eval()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = [1, 4], 0
    rt = DiffusionRuntime(model, tok, name="tiny")
    rt.settings = DiffusionSettings(max_denoising_steps=8, entropy_bound=0.5, confidence_threshold=0.5)
    return rt
