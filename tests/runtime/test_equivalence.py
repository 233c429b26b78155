"""Our loop with no constraint reproduces transformers' ``model.generate`` token for token."""
import pytest
import torch

from dgemma_struct.engine.canvas import diffusion_loop
from dgemma_struct.engine.sampler import DiffusionSettings


def _settings(steps=8, bound=0.5, conf=0.5):
    return DiffusionSettings(max_denoising_steps=steps, entropy_bound=bound, t_min=0.4, t_max=0.8,
                             stability_threshold=1, confidence_threshold=conf)


def _reference(model, ids, mask, s: DiffusionSettings, max_new_tokens, seed):
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

    torch.manual_seed(seed)
    return model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, eos_token_id=[1, 6, 14],
                          pad_token_id=0, max_denoising_steps=s.max_denoising_steps,
                          sampler_config=EntropyBoundSamplerConfig(entropy_bound=s.entropy_bound), t_min=s.t_min,
                          t_max=s.t_max, stability_threshold=s.stability_threshold,
                          confidence_threshold=s.confidence_threshold)


@pytest.mark.parametrize("seed,max_new,batch,left_pad", [(0, 48, 1, False), (3, 32, 3, True), (7, 20, 2, False)])
def test_matches_model_generate(tiny_model, seed, max_new, batch, left_pad):
    s = _settings()
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 512, (batch, 11), generator=g)
    mask = torch.ones_like(ids)
    if left_pad:
        mask[0, :4] = 0
        ids[0, :4] = 0
    ref = _reference(tiny_model, ids, mask, s, max_new, seed)
    torch.manual_seed(seed)
    ours = diffusion_loop(tiny_model, ids, mask, max_new_tokens=max_new, settings=s, eos_token_ids=[1, 6, 14],
                          pad_token_id=0)
    assert torch.equal(ours.sequences, ref.sequences)
    passes = ours.forward_passes
    non_pad = (ours.sequences[:, ids.shape[1]:] != 0).sum(-1)
    assert torch.allclose(non_pad / passes, ref.tokens_per_forward)


def test_adaptive_stop_fires(tiny_model):
    """With the stability window at 0 and a loose confidence bound every canvas stops after one pass."""
    s = DiffusionSettings(max_denoising_steps=8, entropy_bound=0.5, stability_threshold=0, confidence_threshold=100.0)
    ids = torch.randint(5, 512, (1, 6), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    out = diffusion_loop(tiny_model, ids, torch.ones_like(ids), max_new_tokens=32, settings=s,
                         eos_token_ids=[1, 6, 14], pad_token_id=0)
    assert out.forward_passes.item() == out.canvases


def test_eos_pads_rest_of_canvas_and_stops(tiny_model):
    """A hook that forces EOS at position 5 of the first canvas: the rest becomes pad, no 2nd canvas."""
    from dgemma_struct.engine.hooks import NullHook

    class ForceEos(NullHook):
        def mask_logits(self, view):
            view.logits[:, 5, :] = float("-inf")
            view.logits[:, 5, 6] = 0.0  # <turn|>

    ids = torch.randint(5, 512, (2, 6), generator=torch.Generator().manual_seed(2))
    torch.manual_seed(0)
    out = diffusion_loop(tiny_model, ids, torch.ones_like(ids), max_new_tokens=64, settings=_settings(),
                         eos_token_ids=[1, 6, 14], pad_token_id=0, hook=ForceEos())
    new = out.sequences[:, 6:]
    assert out.canvases == 1 and new.shape[1] == 16
    for row in new.tolist():
        first = min(i for i, t in enumerate(row) if t in (1, 6, 14))
        assert first <= 5 and all(t == 0 for t in row[first + 1:])
