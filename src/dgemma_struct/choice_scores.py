"""Probabilities of every option of a choice constraint, from one batched pass of the model.

:func:`choice_probabilities` returns ``{option: probability}`` (summing to 1) for a prompt and a
list of options; :func:`score_choices` also returns the per-option log scores. Two estimators:

``estimator="canvas"`` (default) -- a **masked pseudo-likelihood on one denoising pass**. Each
option is written on the canvas after the encoded prompt as its *path*: the option's tokens
(``constraint.tokenize(option)``, the tokenization the grammar walks) followed by one stop token,
and pad after it (how the model was trained to see a finished answer). Each position of the path
is scored in its own batch row in which that one position is renoised (replaced by a fixed noise
token that the option's path does not use, :func:`noise_token`), the rest of the option's canvas
staying visible; one decoder forward runs over all the rows, self-conditioning off (as at the
first denoising step). A position's score is the log-softmax of the model's logits **restricted
to the tokens the grammar allows there** given the option's tokens before it (the exact masks of
a :class:`~dgemma_struct.constraints.walker.CanvasWalker` walking the path); at the stop position
it is the log of the masked probability of *any* stop token. The option's score is the sum over
its path; the probabilities are the softmax of the scores over the options.

What it is: ``sum_i log p_mask(x_i | prompt, x_{-i})``, the pseudo-log-likelihood (as used to
score sentences with masked language models) of the option's canvas under the denoiser, with the
grammar's masks applied. What it is **not**: the probability that
:func:`~dgemma_struct.api.generate_choice` returns the option. Generation samples over many
steps with a temperature schedule and an entropy-bound acceptance rule; this estimator uses the
raw logits (temperature 1) of one pass. It conditions on the option's length (the pad after the
stop token is visible), and a pseudo-likelihood is not a normalised sequence probability: only
its softmax over the given options is reported. Options longer than one canvas take one more
decoder pass per further canvas (the earlier canvases' tokens are encoded as committed context,
as in generation).

``estimator="ar"`` -- the exact chain-rule likelihood ``sum_i log p(x_i | prompt, x_{<i})`` of
the path under the same weights read left to right (the causal encoder and the tied head, as
``mode="ar"`` generates), with the same grammar masks at every position: one encoder pass over
the batch of ``prompt + path`` sequences. Its softmax over the options is the probability that
masked AR sampling at temperature 1 produces each option, renormalised over the options listed
(exactly that when every tokenization the grammar allows is the listed one; other tokenizations
of the same strings are not counted).

Memory: the rows run in chunks sized so one forward stays within :data:`CHUNK_BYTES` (256 MiB;
:func:`rows_per_forward`), only the scored position of a row gets logits, and the grammar masks stay
packed, so the extra memory of a call is bounded whatever the number of options; a list is capped
at :data:`MAX_OPTIONS` (4,096). A short list is one chunk: one encoder and one decoder pass per canvas.

Errors (all before any forward pass): an empty list, more than :data:`MAX_OPTIONS` options, a
non-string or empty option, a duplicate option, or an option whose tokens plus a stop token the
grammar does not accept (the tokenizer cannot end it) raise :class:`~dgemma_struct.errors.ChoiceError`.

Example::

    >>> from dgemma_struct.testing import tiny_runtime
    >>> rt = tiny_runtime(corpus_size=60)
    >>> p = choice_probabilities("Is it raining?", ["yes", "no"], runtime=rt)
    >>> sorted(p), abs(sum(p.values()) - 1) < 1e-6
    (['no', 'yes'], True)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from dgemma_struct.constraints import Choice, Constraint
from dgemma_struct.constraints.bitmask_np import bitmask_to_bool
from dgemma_struct.errors import ChoiceError, InvalidRequestError
from dgemma_struct.engine.forward import encode, softcapped_logits
from dgemma_struct.prompts import Prompt
from dgemma_struct.repair.preparation import constraint_for, resolve_runtime
from dgemma_struct.runtime import DiffusionRuntime

__all__ = ["ESTIMATORS", "MAX_OPTIONS", "CHUNK_BYTES", "ChoiceScores", "OptionPath", "option_paths", "noise_token",
           "stop_ids_of", "rows_per_forward", "path_scores", "score_choices", "choice_probabilities"]

ESTIMATORS = ("canvas", "ar")
#: the most options one call scores (more is a :class:`ChoiceError`): each option costs one model
#: row per token (canvas) or a sequence (AR), so the work grows with the list
MAX_OPTIONS = 4096
#: the memory one scoring forward may take for its rows; longer lists run in chunks of rows
#: (:func:`rows_per_forward`), so a call's extra memory stays bounded whatever the option count
CHUNK_BYTES = 256 * 2**20


@dataclass(frozen=True)
class ChoiceScores:
    """Per-option log scores (``scores``, in the order given) and their softmax
    (``probabilities``); ``forward_passes``: model passes the estimate took (encoder + decoder)."""

    options: tuple[str, ...]
    scores: tuple[float, ...]
    probabilities: dict[str, float]
    estimator: str
    forward_passes: int

    @property
    def best(self) -> str:
        """The option with the highest probability (the first one on a tie)."""
        return self.options[int(np.argmax(self.scores))]


@dataclass(frozen=True)
class OptionPath:
    """One option as the grammar walks it: ``tokens`` (the option's, then one stop token) and the
    allowed-token mask at each of them, kept packed (``bitmask``: int32 ``[len(tokens), ceil(V/32)]``,
    32 times smaller than bools: 2,000 options of the real 262,144-token vocabulary stay in MBs);
    ``allowed`` unpacks it (bool ``[len(tokens), V]``)."""

    option: str
    tokens: tuple[int, ...]
    bitmask: np.ndarray
    vocab_size: int

    @property
    def allowed(self) -> torch.Tensor:
        """The allowed-token mask at each position, bool ``[len(tokens), V]``."""
        return torch.from_numpy(bitmask_to_bool(self.bitmask, self.vocab_size))


def _check_options(choices: Sequence[str]) -> list[str]:
    if choices is None or isinstance(choices, (str, bytes, dict)) or not isinstance(choices, (list, tuple)):
        raise ChoiceError(f"choices must be a list of strings, got {type(choices).__name__}")
    options = list(choices)
    if not options:
        raise ChoiceError("choice list is empty")
    if len(options) > MAX_OPTIONS:
        raise ChoiceError(f"{len(options)} options: scoring takes at most {MAX_OPTIONS} (each option costs a model "
                          f"row per token; split the list or narrow it first)")
    for c in options:
        if not isinstance(c, str) or not c:
            raise ChoiceError(f"choices must be non-empty strings; got {c!r}")
    seen: set[str] = set()
    for c in options:
        if c in seen:
            raise ChoiceError(f"duplicate option {c!r}: each option gets one probability")
        seen.add(c)
    return options


def option_paths(constraint: Constraint, options: Sequence[str], stop_token: int) -> list[OptionPath]:
    """Each option's tokens plus ``stop_token`` with the grammar's exact mask at every position
    (one :class:`CanvasWalker`, reused: options sharing a prefix share its rows). Raises
    :class:`ChoiceError` when the grammar does not accept an option's tokens followed by the stop."""
    walker = constraint.canvas_walker()
    V = constraint.vocab_size
    paths = []
    for option in options:
        toks = [*constraint.tokenize(option), stop_token]
        res = walker.walk(toks)
        if not res.stopped or res.n_valid != len(toks):
            raise ChoiceError(f"option {option!r} cannot be ended: its tokens {toks[:-1]} followed by a stop "
                              f"token are not a complete output of the choice grammar")
        paths.append(OptionPath(option, tuple(toks), np.array(res.bitmasks[:len(toks)], dtype=np.int32), V))
    return paths


def _position_logprobs(logits: torch.Tensor, masks: np.ndarray, targets: Sequence[int], at_stop: Sequence[bool],
                       stops: torch.Tensor, V: int) -> list[float]:
    """Row ``r``: the masked log-softmax of ``logits[r]`` (``masks[r]``: packed allowed set) at
    ``targets[r]``, or, where ``at_stop[r]``, the masked probability of any stop token."""
    lg = logits[:, :V].float().masked_fill(~torch.from_numpy(bitmask_to_bool(masks, V)).to(logits.device),
                                           float("-inf"))
    logp = torch.log_softmax(lg, dim=-1)
    dev = logp.device
    tok = logp.gather(1, torch.tensor(list(targets), dtype=torch.long, device=dev)[:, None])[:, 0]
    end = torch.logsumexp(logp[:, stops.to(dev)], dim=-1)
    return torch.where(torch.tensor(list(at_stop), device=dev), end, tok).tolist()


def noise_token(rt: DiffusionRuntime, path: OptionPath) -> int:
    """The fixed renoising token of ``path``: the highest id that is none of its tokens, no stop
    token and not pad (it depends on this option only, so an option scores the same in any list)."""
    used = set(path.tokens) | set(rt.eos_token_ids) | {rt.pad_token_id}
    V = rt.model.config.text_config.vocab_size
    return next(t for t in range(V - 1, -1, -1) if t not in used)


def rows_per_forward(rt: DiffusionRuntime, context: int, width: int) -> int:
    """How many rows one scoring forward takes so that it stays within :data:`CHUNK_BYTES`: a
    row's key/value cache over ``context + width`` tokens, its activations and attention scores over
    ``width`` tokens, and one position's logits (with the log-softmax and the mask).

    >>> from dgemma_struct.testing import tiny_runtime
    >>> rows_per_forward(tiny_runtime(corpus_size=60), 40, 16) >= 1
    True
    """
    c = rt.model.config.text_config
    elt = torch.empty((), dtype=rt.model.dtype).element_size()
    layers = getattr(c, "num_hidden_layers", 1)
    heads = getattr(c, "num_attention_heads", 1)
    kv = getattr(c, "num_key_value_heads", heads) * (getattr(c, "head_dim", None) or c.hidden_size // heads)
    wide = max(c.hidden_size, getattr(c, "intermediate_size", 0) or 0)
    per_row = (elt * (2 * layers * kv * (context + width) + 6 * width * wide)
               + 4 * heads * width * (context + width) + 4 * 4 * c.vocab_size)
    return max(1, CHUNK_BYTES // per_row)


def _chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


@torch.no_grad()
def _canvas_scores(rt: DiffusionRuntime, prompt_ids: list[int], paths: Sequence[OptionPath],
                   stops: torch.Tensor) -> tuple[list[float], int]:
    from transformers import DynamicCache

    model, device = rt.model, rt.model.device
    L = model.config.canvas_length
    V = paths[0].vocab_size
    pad = rt.pad_token_id if rt.pad_token_id is not None else 0
    noises = [noise_token(rt, p) for p in paths]
    totals = [0.0] * len(paths)
    passes = 0
    for k in range(-(-max(len(p.tokens) for p in paths) // L)):   # the canvases, one after the other
        live = [j for j, p in enumerate(paths) if len(p.tokens) > k * L]
        # the rows: one per (option, position of its path in this canvas), that position renoised;
        # run in chunks of bounded memory, each one encoder pass (its contexts) and one decoder pass
        rows = [(j, i) for j in live for i in range(min(L, len(paths[j].tokens) - k * L))]
        C = len(prompt_ids) + k * L
        for chunk in _chunks(rows, rows_per_forward(rt, C, L)):
            # each context (the prompt, plus the option's earlier canvases) is encoded once, then its
            # cache rows are repeated for the rows that read it
            owners = [0] if k == 0 else list(dict.fromkeys(j for j, _ in chunk))
            ctx = torch.tensor([prompt_ids + list(paths[j].tokens[:k * L]) for j in owners], dtype=torch.long,
                               device=device)
            index = torch.tensor([0 if k == 0 else owners.index(j) for j, _ in chunk], dtype=torch.long,
                                 device=device)
            canvas = torch.full((len(chunk), L), pad, dtype=torch.long, device=device)
            for r, (j, i) in enumerate(chunk):
                part = paths[j].tokens[k * L:(k + 1) * L]
                canvas[r, :len(part)] = torch.tensor(part, dtype=torch.long)
                canvas[r, i] = noises[j]
            cache = DynamicCache(config=model.config.get_text_config(decoder=True))
            attn = torch.ones(ctx.shape, dtype=torch.bool, device=device)
            cache = encode(model, ctx, attn, cache,
                           torch.arange(C, dtype=torch.int32, device=device)[None]).past_key_values
            cache.batch_select_indices(index)
            dec_attn = torch.ones((len(chunk), C + L), dtype=torch.bool, device=device)
            masks = model.model.decoder.create_diffusion_decoder_attention_mask(
                config=model.config, inputs_embeds=canvas.unsqueeze(-1), past_key_values=cache,
                decoder_attention_mask=dec_attn)
            hidden = model.model(decoder_input_ids=canvas, self_conditioning_logits=None, decoder_attention_mask=masks,
                                 past_key_values=cache,
                                 decoder_position_ids=torch.arange(C, C + L, dtype=torch.int32, device=device)[None]
                                 ).last_hidden_state
            passes += 2
            at = torch.tensor([i for _, i in chunk], dtype=torch.long, device=device)
            # only the renoised position of each row is read: its logits alone are computed
            logits = softcapped_logits(model, hidden[torch.arange(len(chunk), device=device), at])
            pos = [k * L + i for j, i in chunk]
            got = _position_logprobs(logits, np.stack([paths[j].bitmask[p] for (j, _), p in zip(chunk, pos)]),
                                     [paths[j].tokens[p] for (j, _), p in zip(chunk, pos)],
                                     [p == len(paths[j].tokens) - 1 for (j, _), p in zip(chunk, pos)], stops, V)
            for (j, _), x in zip(chunk, got):
                totals[j] += x
    return totals, passes


@torch.no_grad()
def _ar_scores(rt: DiffusionRuntime, prompt_ids: list[int], paths: Sequence[OptionPath],
               stops: torch.Tensor) -> tuple[list[float], int]:
    from transformers import DynamicCache

    model, device = rt.model, rt.model.device
    pad = rt.pad_token_id if rt.pad_token_id is not None else 0
    V = paths[0].vocab_size
    T = len(prompt_ids)
    # the stop token is only predicted, never read: each sequence is the prompt plus the option
    S = T + max(len(p.tokens) for p in paths) - 1
    scores: list[float] = []
    passes = 0
    for chunk in _chunks(list(paths), rows_per_forward(rt, 0, S)):   # bounded memory: options in chunks
        ids = torch.full((len(chunk), S), pad, dtype=torch.long, device=device)
        attn = torch.zeros((len(chunk), S), dtype=torch.bool, device=device)
        for j, p in enumerate(chunk):
            seq = prompt_ids + list(p.tokens[:-1])
            ids[j, :len(seq)] = torch.tensor(seq, dtype=torch.long)
            attn[j, :len(seq)] = True
        cache = DynamicCache(config=model.config.get_text_config(decoder=True))
        hidden = encode(model, ids, attn, cache, torch.arange(S, dtype=torch.int32, device=device)[None]).last_hidden_state
        passes += 1
        for j, p in enumerate(chunk):
            # the hidden state at position T - 1 + i predicts the path's token i
            n = len(p.tokens)
            logits = softcapped_logits(model, hidden[j, T - 1:T - 1 + n])
            scores.append(sum(_position_logprobs(logits, p.bitmask, p.tokens, [False] * (n - 1) + [True], stops, V)))
    return scores, passes


def stop_ids_of(constraint: Constraint) -> list[int]:
    """The constraint's stop tokens; the last one is written on the canvas after each option (the
    generation config lists the end-of-turn token a chat model writes after its answer last: the
    embedded model's EOT). It is only ever read as context, never scored as itself."""
    return [t for t in constraint.stop_token_ids if t < constraint.vocab_size]


def path_scores(rt: DiffusionRuntime, prompt_ids: Sequence[int], paths: Sequence[OptionPath], *,
                estimator: str = "canvas") -> tuple[list[float], int]:
    """The log score of each path after the encoded prompt, and the model passes it took. A path's
    score does not depend on the other paths in the batch (up to float rounding)."""
    if estimator not in ESTIMATORS:
        raise InvalidRequestError(f"unknown estimator {estimator!r}; expected one of {ESTIMATORS}")
    # the stop event: any of the runtime's stop tokens (the constraint's stop set is the same)
    V = paths[0].allowed.shape[1]
    stops = torch.tensor([t for t in rt.eos_token_ids if t < V], dtype=torch.long)
    fn = _canvas_scores if estimator == "canvas" else _ar_scores
    with rt.lock:
        return fn(rt, list(prompt_ids), paths, stops)


def score_choices(prompt: Prompt, choices: Sequence[str], *, runtime: DiffusionRuntime | None = None,
                  estimator: str = "canvas") -> ChoiceScores:
    """Scores every option of ``choices`` for ``prompt`` (see the module docstring for the two
    estimators); deterministic (no sampling)."""
    if estimator not in ESTIMATORS:
        raise InvalidRequestError(f"unknown estimator {estimator!r}; expected one of {ESTIMATORS}")
    options = _check_options(choices)
    rt = resolve_runtime(runtime)
    constraint = constraint_for(Choice(options), rt)
    paths = option_paths(constraint, options, stop_ids_of(constraint)[-1])
    prompt_ids = rt.encode_prompt(prompt)
    rt.check_fits([prompt_ids], max(len(p.tokens) for p in paths))
    scores, passes = path_scores(rt, prompt_ids, paths, estimator=estimator)
    probs = torch.softmax(torch.tensor(scores, dtype=torch.float64), dim=0).tolist()
    if not all(math.isfinite(s) for s in probs):  # pragma: no cover - every path is grammar-valid
        raise ChoiceError("the option scores are not finite")
    return ChoiceScores(tuple(options), tuple(scores), dict(zip(options, probs)), estimator, passes)


def choice_probabilities(prompt: Prompt, choices: Sequence[str], *, runtime: DiffusionRuntime | None = None,
                         estimator: str = "canvas") -> dict[str, float]:
    """``{option: probability}`` for every option of ``choices`` (in their order; the values sum
    to 1). ``estimator``: ``"canvas"`` (a masked pseudo-likelihood on one denoising pass) or
    ``"ar"`` (the exact masked left-to-right likelihood); see the module docstring."""
    return score_choices(prompt, choices, runtime=runtime, estimator=estimator).probabilities
