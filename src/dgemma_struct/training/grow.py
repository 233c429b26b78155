"""Depth up-scaling of a checkpoint: twice the layers, starting from (almost) the same function.

The embedded model has 4 layers of width 256 (5.2M parameters); after 8,500 CPU steps its AR head
still gets only 60% of the fields of *training* families right (issue #33), so capacity, not
data, may be the limit. Training a wider or deeper model from scratch costs days on a CPU;
growing the trained one costs nothing: layer ``i`` becomes layers ``2i`` and ``2i+1``, the copy
with its two residual branches (the post-attention and post-feed-forward norms, whose weights
scale each branch's output) multiplied by ``branch_scale``. At 0 the grown model computes exactly
what the old one does (each copy adds zero to the residual stream); a small positive scale
(0.1: AR loss 0.168 → 0.179 on the shipped checkpoint) lets every new weight get a gradient from
the first step instead of waiting for a zero norm weight to grow at the learning rate.

    >>> from dgemma_struct.training.recipe import embedded_path, load_init
    >>> _, small = load_init(embedded_path())
    >>> big = grow_depth(small, 0.0)
    >>> big.config.text_config.num_hidden_layers, big.config.text_config.layer_types[:3]
    (8, ['sliding_attention', 'sliding_attention', 'sliding_attention'])
"""
from __future__ import annotations

import copy
import math
from typing import Any

#: the weights that scale a layer's two residual branches (Gemma's norms multiply by ``weight``)
BRANCH_NORMS = ("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")


def grow_depth(model: Any, branch_scale: float = 0.1) -> Any:
    """A new ``DiffusionGemmaForBlockDiffusion`` with each text layer followed by a copy of
    itself whose residual branches are scaled by ``branch_scale`` (0: the same function).
    The layer types are doubled in place (a sliding layer's copy slides too); the generation
    config, the vision tower and the embeddings are kept."""
    from transformers import DiffusionGemmaForBlockDiffusion

    from dgemma_struct.errors import InvalidRequestError

    if not (isinstance(branch_scale, (int, float)) and math.isfinite(branch_scale) and 0 <= branch_scale <= 1):
        raise InvalidRequestError(f"grow_depth: branch_scale must be in [0, 1], got {branch_scale!r}")
    config = copy.deepcopy(model.config)
    text = config.get_text_config()
    text.layer_types = [t for t in text.layer_types for _ in (0, 1)]
    text.num_hidden_layers = len(text.layer_types)
    grown = DiffusionGemmaForBlockDiffusion(config)
    state: dict[str, Any] = {}
    for key, value in model.state_dict().items():
        if ".layers." not in key or ".vision_tower." in key:
            state[key] = value
            continue
        head, rest = key.split(".layers.", 1)
        index, tail = rest.split(".", 1)
        # load_state_dict copies into the grown model's own parameters: the two layers share nothing
        state[f"{head}.layers.{2 * int(index)}.{tail}"] = value
        state[f"{head}.layers.{2 * int(index) + 1}.{tail}"] = value * branch_scale if tail in BRANCH_NORMS else value
    missing, unexpected = grown.load_state_dict(state, strict=False)
    if unexpected or missing:
        raise InvalidRequestError(f"grow_depth: the checkpoint's weights do not map onto the grown model "
                                  f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    grown.generation_config = copy.deepcopy(model.generation_config)
    return grown.train(model.training)
