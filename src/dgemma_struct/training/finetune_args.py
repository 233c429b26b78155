"""The fine-tuning flags of ``dgemma-struct train`` (:mod:`~dgemma_struct.training.recipe`'s knobs),
kept beside the recipe so the command line and :func:`~dgemma_struct.training.train.train` name them once.

    >>> import argparse
    >>> p = argparse.ArgumentParser()
    >>> add_finetune_arguments(p)
    >>> finetune_kwargs(p.parse_args(["--init-from", "embedded", "--mix", "0.3", "--t-dist", "high"]))["mix"]
    0.3
"""
from __future__ import annotations

import argparse
from typing import Any

from dgemma_struct.cli.arguments import bounded
from dgemma_struct.training.recipe import T_DISTS

#: flag dest -> train() keyword (the same names)
FINETUNE_KNOBS = ("init_from", "mix", "fresh_names", "short_records", "tables", "absent", "phrasings", "warmup",
                  "lr_floor", "checkpoint_every", "keep_checkpoints", "diffusion_views", "diffusion_weight", "t_dist",
                  "self_condition", "sc_like_inference", "prefix", "frontier", "frontier_weight", "grow_depth")


_fraction = bounded(float, 0, 1)
_positive = bounded(float, 0, strict=True)
_nonnegative = bounded(float, 0)


def add_finetune_arguments(p: argparse.ArgumentParser) -> None:
    """Adds the fine-tuning flags (start checkpoint, corpus mix, schedule, diffusion objective) to ``p``."""
    g = p.add_argument_group("fine-tuning (docs/model_card.md)")
    g.add_argument("--init-from", default=None,
                   help="start from this checkpoint directory's weights and tokenizer ('embedded': the shipped one)")
    g.add_argument("--mix", type=_fraction, default=0.0,
                   help="share of the corpus drawn from the original families, tools, short answers and thinking")
    g.add_argument("--fresh-names", type=_fraction, default=0.0,
                   help="share of the --mix examples whose people get invented names (default 0)")
    g.add_argument("--short-records", type=_fraction, default=0.0,
                   help="share of the corpus that is short records ending in a number, 'X is 34 years old.' "
                        "(default 0)")
    g.add_argument("--tables", type=_fraction, default=0.0,
                   help="share of the corpus that is extraction records laid out as a Markdown table (default 0)")
    g.add_argument("--absent", type=_fraction, default=0.0,
                   help="share of the corpus that is extraction records asking for optional fields the source "
                        "does not hold (default 0)")
    g.add_argument("--phrasings", type=_fraction, default=0.0,
                   help="share of the corpus that is extraction records asked for by composed instructions, none "
                        "worded like a held-out template (default 0)")
    g.add_argument("--warmup", type=bounded(int, 0), default=150,
                   help="warm-up steps of the learning rate (default 150)")
    g.add_argument("--lr-floor", type=_fraction, default=0.1,
                   help="the cosine decay ends at this fraction of --lr (default 0.1)")
    g.add_argument("--checkpoint-every", type=bounded(int, 1), default=250,
                   help="save model, optimizer and random state every N steps (default 250)")
    g.add_argument("--keep-checkpoints", action="store_true", help="also keep each saved model in step_NNNNN/")
    g.add_argument("--diffusion-views", type=bounded(int, 1), default=1,
                   help="denoised blocks per encoder pass (default 1)")
    g.add_argument("--diffusion-weight", type=_positive, default=1.0, help="weight of the diffusion loss (default 1)")
    g.add_argument("--t-dist", choices=T_DISTS, default="uniform", help="how noise rates are drawn (default uniform)")
    g.add_argument("--self-condition", type=_fraction, default=0.5,
                   help="probability of a self-conditioning pass (default 0.5)")
    g.add_argument("--sc-like-inference", action="store_true",
                   help="self-condition on temperature-scaled logits of a noisier canvas, as inference does")
    g.add_argument("--prefix", type=_fraction, default=0.0,
                   help="share of blocks corrupted after a clean prefix of random length (constrained decoding's pattern)")
    g.add_argument("--frontier", type=_fraction, default=0.0,
                   help="share of blocks with a clean prefix of random length and every later position random")
    g.add_argument("--frontier-weight", type=_nonnegative, default=0.0,
                   help="weight of an extra loss at each block's first random position (default 0)")
    g.add_argument("--grow-depth", type=_fraction, default=None, metavar="SCALE",
                   help="double the --init-from model's layers before training, each copy's residual branches "
                        "scaled by SCALE (0: the same function; 0.1 used for stage 7)")


def finetune_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The :func:`~dgemma_struct.training.train.train` keywords of parsed fine-tuning flags."""
    return {k: getattr(args, k) for k in FINETUNE_KNOBS}
