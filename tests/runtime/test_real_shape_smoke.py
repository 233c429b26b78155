"""The real checkpoint's shape where it matters: 5:1 sliding/full layers, canvas 256, vocab 262,144."""
import torch

from dgemma_struct.engine.canvas import diffusion_loop
from dgemma_struct.engine.model_config import real_shape_config
from dgemma_struct.engine.sampler import DiffusionSettings


def test_real_shape_denoises_one_canvas():
    from transformers import DiffusionGemmaForBlockDiffusion

    torch.manual_seed(0)
    cfg = real_shape_config()
    model = DiffusionGemmaForBlockDiffusion(cfg).eval()
    assert cfg.text_config.layer_types.count("full_attention") == 1 and cfg.canvas_length == 256
    ids = torch.randint(10, 262_144, (1, 12))
    out = diffusion_loop(model, ids, torch.ones_like(ids), max_new_tokens=256,
                         settings=DiffusionSettings(max_denoising_steps=2), eos_token_ids=[1], pad_token_id=0)
    assert out.sequences.shape == (1, 12 + 256)
    assert int(out.forward_passes) <= 2
    assert out.sequences.max() < 262_144
