import pytest
import torch

from dgemma_struct.engine.model_config import PAD_ID, STOP_IDS, tiny_config


@pytest.fixture(scope="session")
def tiny_model():
    """A random-weight DiffusionGemma (canvas 16, vocab 512) with early stopping that fires."""
    from transformers import DiffusionGemmaForBlockDiffusion

    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(tiny_config(vocab_size=512, canvas_length=16)).eval()
    gc = model.generation_config
    gc.eos_token_id, gc.pad_token_id = list(STOP_IDS), PAD_ID  # [<eos>, <turn|>, <|tool_response>]
    return model
