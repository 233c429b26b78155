"""DiffusionGemma configurations built by this project: the embedded model's and tiny test ones.

A tiny ``DiffusionGemmaConfig`` still builds a 167M-parameter vision tower unless it is given a tiny
``Gemma4VisionConfig``; MoE fields are mandatory; ``global_head_dim`` defaults to 512. These
helpers set all of that once.

Example::

    >>> from dgemma_struct.engine.model_config import tiny_config
    >>> cfg = tiny_config(vocab_size=512, canvas_length=16)
    >>> cfg.canvas_length
    16
"""
from __future__ import annotations

from transformers import DiffusionGemmaConfig, Gemma4VisionConfig

# Special tokens of the embedded tokenizer: Gemma 4's control-token names (ids are fixed: the model
# config and the generation config rely on them). The real checkpoint has the same names at other ids
# (e.g. ``<turn|>`` = 106); code finds them by name, never by these numbers.
SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|turn>", "<turn|>", "<|think|>", "<|channel>",
                  "<channel|>", "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
                  "<tool_response|>", '<|"|>']
(PAD_ID, EOS_ID, BOS_ID, UNK_ID, MASK_ID, TURN_START_ID, TURN_END_ID, THINK_ID, CHANNEL_OPEN_ID, CHANNEL_CLOSE_ID,
 TOOL_OPEN_ID, TOOL_CLOSE_ID, TOOL_CALL_OPEN_ID, TOOL_CALL_CLOSE_ID, TOOL_RESPONSE_OPEN_ID, TOOL_RESPONSE_CLOSE_ID,
 STRING_DELIMITER_ID) = range(len(SPECIAL_TOKENS))
# The generation config's stop set, the same shape as the real one ([<eos>, <turn|>, <|tool_response>]).
STOP_IDS = [EOS_ID, TURN_END_ID, TOOL_RESPONSE_OPEN_ID]


def chat_template() -> str:
    """DiffusionGemma's own chat template (``chat_template.jinja`` beside the embedded model: trl's
    ``diffusion_gemma.jinja``, Apache-2.0), which the embedded tokenizer carries too."""
    from importlib.resources import files

    return files("dgemma_struct.embedded").joinpath("chat_template.jinja").read_text(encoding="utf-8")


def _vision() -> Gemma4VisionConfig:
    return Gemma4VisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=2, head_dim=8)


def make_config(*, vocab_size: int, hidden_size: int, intermediate_size: int, num_layers: int,
                num_heads: int, num_kv_heads: int, head_dim: int, num_experts: int, top_k_experts: int,
                moe_intermediate_size: int, canvas_length: int, sliding_window: int,
                layer_types: list[str] | None = None, max_position_embeddings: int = 4096,
                softcap: float = 30.0) -> DiffusionGemmaConfig:
    """A DiffusionGemma config with a tiny vision tower and the project's special-token ids."""
    text = dict(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        head_dim=head_dim, global_head_dim=head_dim, num_global_key_value_heads=num_kv_heads,
        sliding_window=sliding_window, max_position_embeddings=max_position_embeddings,
        num_experts=num_experts, top_k_experts=top_k_experts, moe_intermediate_size=moe_intermediate_size,
        layer_types=layer_types, pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID,
        final_logit_softcapping=softcap,
    )
    return DiffusionGemmaConfig(text_config=text, vision_config=_vision(), canvas_length=canvas_length)


def embedded_config(vocab_size: int) -> DiffusionGemmaConfig:
    """The embedded model: 5.17M parameters, canvas 32, sliding + full attention layers. The sliding
    window (512) exceeds every training sequence, so training may mask the cache per row."""
    return make_config(vocab_size=vocab_size, hidden_size=256, intermediate_size=512, num_layers=4,
                       num_heads=4, num_kv_heads=2, head_dim=64, num_experts=2, top_k_experts=1,
                       moe_intermediate_size=256, canvas_length=32, sliding_window=512,
                       layer_types=["sliding_attention"] * 3 + ["full_attention"])


def tiny_config(vocab_size: int = 512, canvas_length: int = 16, num_layers: int = 2) -> DiffusionGemmaConfig:
    """A random-weight test config: a few hundred thousand parameters."""
    types = (["sliding_attention"] * (num_layers - 1)) + ["full_attention"]
    return make_config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_layers=num_layers,
                       num_heads=2, num_kv_heads=1, head_dim=32, num_experts=2, top_k_experts=1,
                       moe_intermediate_size=64, canvas_length=canvas_length, sliding_window=64,
                       layer_types=types, max_position_embeddings=2048)


def real_shape_config() -> DiffusionGemmaConfig:
    """The real checkpoint's shape where it matters (5:1 sliding/full layers, canvas 256, vocab
    262,144, softcapping), scaled down in width and depth so it runs on a CPU."""
    types = ["sliding_attention"] * 5 + ["full_attention"]
    return make_config(vocab_size=262_144, hidden_size=32, intermediate_size=64, num_layers=6, num_heads=2,
                       num_kv_heads=1, head_dim=16, num_experts=2, top_k_experts=1, moe_intermediate_size=32,
                       canvas_length=256, sliding_window=512, layer_types=types, max_position_embeddings=8192)
