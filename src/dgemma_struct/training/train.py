"""Train the embedded DiffusionGemma model: tokenizer, diffusion objective and AR objective.

One encoder pass over ``prompt + answer`` serves both objectives: its last hidden state gives the
AR (next-token) loss on the answer, and its KV cache, masked per row to ``prompt + answer[:k*L]``,
is the context of the decoder, which denoises block ``k`` of the answer from uniform-random
corruption (self-conditioning on half of the batches, as at inference).

Run::

    dgemma-struct train --minutes 40 --out src/dgemma_struct/embedded

The generalisation corpus (:mod:`dgemma_struct.training.generalise`) on one GPU, sized for an
H200 run of at most 8 minutes (about 1.5 min to build and encode the corpus, 5.5 min of steps;
the learning-rate schedule follows wall time), then the split evaluation::

    python -m dgemma_struct.training.gpu_run --out runs/generalise --results "$OUT" --minutes 5.5

(:mod:`dgemma_struct.training.gpu_run`: ``train(out, corpus="generalise", corpus_size=60000,
minutes=5.5, batch_size=128, device="auto", dtype="auto")``, then the split evaluation of the new
and the shipped checkpoint.)

Every file a run writes stays under 16 MiB (weights in safetensors shards, the training state
in parts); copy the model files, not ``train_state.pt*``, into ``src/dgemma_struct/embedded``.
"""
from __future__ import annotations

import json
import math
import random
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from dgemma_struct.engine.model_config import (BOS_ID, PAD_ID, SPECIAL_TOKENS, STOP_IDS, TURN_END_ID, chat_template,
                                        embedded_config)
from dgemma_struct.engine.sampler import CHECKPOINT_SETTINGS_FILE
from dgemma_struct.training.corpus import make_corpus
from dgemma_struct.training.generalise import make_generalise_corpus
from dgemma_struct.training.recipe import (DiffusionRecipe, embedded_path, load_init, lr_at, mixed_corpus, pick_blocks,
                                           self_condition_logits)
from dgemma_struct.training.train_state import load_state, save_state

CORPORA = {"default": make_corpus, "generalise": make_generalise_corpus}


def build_tokenizer(texts: list[str], vocab_size: int = 2048):
    """Byte-level BPE trained on ``texts`` with Gemma 4's control tokens (the only special tokens)
    and DiffusionGemma's chat template, wrapped as a ``PreTrainedTokenizerFast``.

    Digits are single tokens, as in Gemma's SentencePiece vocabulary, and a space is a token of its
    own, so a word or number is the same token sequence in the prompt's sentence and in the answer's
    JSON: a 5M-parameter model then learns to copy instead of learning a second spelling of each name."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s"), behavior="isolated"), pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                                 unk_token="<unk>", mask_token="<mask>",
                                 additional_special_tokens=SPECIAL_TOKENS[5:])
    hf.chat_template = chat_template()
    hf.padding_side = "left"
    assert hf.convert_tokens_to_ids(SPECIAL_TOKENS) == list(range(len(SPECIAL_TOKENS)))
    return hf


def tokenizer_texts(corpus: list[dict]) -> list[str]:
    """What the BPE merges are learned from: prompts, answers and the tool declarations as the chat
    template renders them (control tokens dropped: they are never merged)."""
    import re

    from dgemma_struct.training.dialect_corpus import TOOLS

    rendered = build_tokenizer(["x"], 300).apply_chat_template(
        [{"role": "user", "content": "x"}], tools=list(TOOLS.values()), tokenize=False)
    declarations = re.sub(r"<[^>]*\|>|<\|[^>]*>", " ", rendered)
    n_tool = sum(1 for e in corpus if e.get("tools"))
    return [e["prompt"] for e in corpus] + [e["answer"] for e in corpus] + [declarations] * n_tool


def encode_example(tokenizer, ex: dict) -> tuple[list[int], list[int]]:
    """Prompt ids through the chat template (tools, thinking) and answer ids with the stop token the
    model must learn to write: ``<turn|>`` after an answer; a tool-call answer already ends in
    ``<|tool_response>``."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": ex["prompt"]}], tools=ex.get("tools"),
                                           enable_thinking=bool(ex.get("thinking")), add_generation_prompt=True,
                                           tokenize=True)
    if hasattr(prompt, "keys"):
        prompt = prompt["input_ids"]
    answer = tokenizer(ex["answer"], add_special_tokens=False)["input_ids"]
    if ex.get("kind") != "tool":
        answer = answer + [TURN_END_ID]
    return list(prompt), answer


def make_batch(encoded: list[tuple[list[int], list[int]]], canvas: int, vocab: int, gen: torch.Generator,
               rng: random.Random, recipe: DiffusionRecipe | None = None):
    """Left-padded full sequences plus, per row, the block(s) to denoise and their corruption
    (``recipe.views`` > 1: ``clean``, ``noisy``, ``noise_mask``, ``dec_mask``, ``dec_pos`` get a leading view axis)."""
    recipe = recipe or DiffusionRecipe()
    B, V = len(encoded), recipe.views
    seqs, ctx_lens, blocks = [], [], []
    for prompt, answer in encoded:
        n_blocks = math.ceil(len(answer) / canvas)
        padded = answer + [PAD_ID] * (n_blocks * canvas - len(answer))
        ks = pick_blocks(n_blocks, V, rng)
        seqs.append(prompt + answer)
        ctx_lens.append([len(prompt) + k * canvas for k in ks])
        blocks.append([padded[k * canvas:(k + 1) * canvas] for k in ks])
    T = max(len(s) for s in seqs)
    ids = torch.full((B, T), PAD_ID, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.bool)
    ar_labels = torch.full((B, T), -100, dtype=torch.long)
    ctx_end = torch.zeros(V, B, dtype=torch.long)
    for i, ((prompt, answer), s, cs) in enumerate(zip(encoded, seqs, ctx_lens)):
        off = T - len(s)
        ids[i, off:] = torch.tensor(s)
        attn[i, off:] = True
        # label at position j predicts token j+1: answer tokens only
        ar_labels[i, off + len(prompt) - 1:T - 1] = torch.tensor(answer)
        ctx_end[:, i] = off + torch.tensor(cs)
    clean = torch.tensor(blocks, dtype=torch.long).transpose(0, 1)  # [V, B, L]
    t = torch.cat([recipe.draw_t(B, gen) for _ in range(V)]).view(V, B, 1)
    noise_mask = recipe.corrupt_mask(t.view(V * B, 1), (V * B, canvas), gen).view(V, B, canvas)
    noisy = torch.where(noise_mask, torch.randint(0, vocab, (V * B, canvas), generator=gen).view(V, B, canvas), clean)
    # the decoder may only see the cache up to each row's context end
    cache_visible = attn[None] & (torch.arange(T)[None, None, :] < ctx_end[..., None])
    dec_mask = torch.cat([cache_visible, torch.ones(V, B, canvas, dtype=torch.bool)], dim=2)
    dec_pos = ctx_end[..., None] + torch.arange(canvas)[None, None, :]
    views = dict(clean=clean, noisy=noisy, dec_mask=dec_mask, dec_pos=dec_pos, noise_mask=noise_mask)
    if V == 1:
        views = {k: v[0] for k, v in views.items()}
    return dict(ids=ids, attn=attn, ar_labels=ar_labels, **views)


def softcapped_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    cap = model.final_logit_softcapping
    logits = model.lm_head(hidden).float()
    return torch.tanh(logits / cap) * cap if cap else logits


def to_device(batch: dict, device: torch.device) -> dict:
    """The batch's tensors on ``device`` (pinned + non-blocking from the CPU to CUDA)."""
    if device.type == "cpu":
        return batch
    return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}


def loss_on_batch(model, batch: dict, self_condition: bool, recipe: DiffusionRecipe | None = None,
                  gen: torch.Generator | None = None):
    """(diffusion loss averaged over the batch's views, AR loss) of one encoder pass."""
    from transformers import DynamicCache

    recipe = recipe or DiffusionRecipe()
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    enc = model.model.encoder(input_ids=batch["ids"], attention_mask=batch["attn"], past_key_values=cache)
    ar_logits = softcapped_logits(model, enc.last_hidden_state)
    ar_loss = F.cross_entropy(ar_logits.flatten(0, 1), batch["ar_labels"].flatten(), ignore_index=-100)
    stacked = batch["clean"].dim() == 3
    losses = []
    for v in range(batch["clean"].shape[0] if stacked else 1):
        view = {k: batch[k][v] if stacked else batch[k] for k in ("clean", "noisy", "dec_mask", "dec_pos", "noise_mask")}
        kwargs = dict(past_key_values=enc.past_key_values, decoder_input_ids=view["noisy"],
                      decoder_attention_mask=view["dec_mask"], decoder_position_ids=view["dec_pos"])
        sc = None
        if self_condition:
            sc = self_condition_logits(model, kwargs, view["noisy"], recipe, model.config.text_config.vocab_size,
                                       gen if gen is not None else torch.Generator().manual_seed(0))
        logits = model(**kwargs, self_conditioning_logits=sc).logits
        loss = F.cross_entropy(logits.flatten(0, 1), view["clean"].flatten())
        if recipe.frontier_weight:
            loss = loss + recipe.frontier_loss(logits, view["clean"], view["noise_mask"])
        losses.append(loss)
    return torch.stack(losses).mean(), ar_loss


def train(out_dir: str | Path, *, minutes: float = 40.0, max_steps: int | None = None, batch_size: int = 24,
          lr: float = 2e-3, seed: int = 0, corpus_size: int = 60_000, vocab_size: int = 2048,
          threads: int = 2, log_every: int = 25, resume: bool = False, device: str | torch.device = "auto",
          dtype: str | torch.dtype | None = "auto", corpus: str = "default", init_from: str | Path | None = None,
          mix: float = 0.0, fresh_names: float = 0.0, short_records: float = 0.0, tables: float = 0.0,
          absent: float = 0.0, phrasings: float = 0.0, warmup: int = 150, lr_floor: float = 0.1,
          checkpoint_every: int = 250, keep_checkpoints: bool = False, diffusion_views: int = 1,
          diffusion_weight: float = 1.0, t_dist: str = "uniform", self_condition: float = 0.5,
          sc_like_inference: bool = False, prefix: float = 0.0, frontier: float = 0.0, frontier_weight: float = 0.0,
          grow_depth: float | None = None) -> dict:
    """Builds the corpus and tokenizer, trains until ``minutes`` or ``max_steps``, saves the
    checkpoint (model, tokenizer, generation config) into ``out_dir`` and the log beside it.

    With ``max_steps`` the learning-rate schedule follows steps, so a run is deterministic for a
    seed and thread count (``minutes`` is then only a cap on this call); without it the schedule
    follows wall time and ``minutes`` is the whole run's, resumed parts included. Every
    ``checkpoint_every`` steps the model, the optimizer and the random states are saved
    (``train_state.pt``), so ``resume=True`` continues the same run, schedule included, where it stopped.

    ``device``: ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda[:N]"``; the weights stay float32
    and ``dtype`` is the autocast dtype of the forward (``"auto"``: bf16 on CUDA, none on CPU).
    Batches are built on the CPU (same random streams on every device) and copied over.

    ``corpus``: ``"default"`` (:func:`~dgemma_struct.training.corpus.make_corpus`, what the shipped
    checkpoint was trained on) or ``"generalise"``
    (:func:`~dgemma_struct.training.generalise.make_generalise_corpus`: random schemas, many
    layouts and phrasings, held-out families and templates left out). Weights are saved in
    safetensors shards under 16 MiB, the training state in parts under 16 MiB.

    Fine-tuning (:mod:`~dgemma_struct.training.recipe`): ``init_from`` a checkpoint directory (or
    ``"embedded"``, the shipped one) starts from its weights and tokenizer; ``mix`` is the share of
    the corpus drawn from the original one, ``fresh_names`` the share of those whose people get
    invented names, ``short_records`` the share of two- or three-field records in one sentence
    ending in a number, ``tables`` the share of extraction records laid out as a Markdown table, ``absent`` the share
    asking for optional fields the source does not hold, ``phrasings`` the share asked for by composed instructions; the
    learning rate warms up over ``warmup`` steps, then decays by a cosine to ``lr_floor * lr``; a
    checkpoint every ``checkpoint_every`` steps (with ``keep_checkpoints`` also the model alone in
    ``step_NNNNN/``). The diffusion objective:
    ``diffusion_views``, ``diffusion_weight``, ``t_dist``, ``self_condition``, ``sc_like_inference``,
    ``prefix``, ``frontier``, ``frontier_weight`` (see :class:`~dgemma_struct.training.recipe.DiffusionRecipe`).
    ``grow_depth``: a ``branch_scale`` doubles the ``init_from`` model's layers before training
    (:func:`~dgemma_struct.training.grow.grow_depth`)."""
    from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion

    from dgemma_struct.errors import InvalidRequestError, ModelLoadError
    from dgemma_struct.runtime import resolve_device, resolve_dtype

    recipe = DiffusionRecipe(views=diffusion_views, weight=diffusion_weight, t_dist=t_dist,
                             self_condition=self_condition, sc_like_inference=sc_like_inference, prefix=prefix,
                             frontier=frontier, frontier_weight=frontier_weight)
    if corpus not in CORPORA:
        raise InvalidRequestError(f"corpus must be one of {sorted(CORPORA)}, got {corpus!r}")
    if grow_depth is not None and init_from is None and not resume:
        raise InvalidRequestError("grow_depth needs init_from: it doubles the layers of a trained checkpoint")
    dev = resolve_device(device)
    amp = resolve_dtype(dtype, dev)
    if amp == torch.float16:
        raise InvalidRequestError("fp16 training needs loss scaling, which train() does not do; use bf16 or fp32")
    out_dir = Path(out_dir)
    state_path = out_dir / "train_state.pt"
    if resume and not (state_path.exists() or state_path.with_name(state_path.name + ".000").exists()):
        raise ModelLoadError(f"--resume: {str(out_dir)!r} holds no saved training state ({state_path.name}); "
                             "train without --resume first")
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    out_dir.mkdir(parents=True, exist_ok=True)

    parent = None   # the checkpoint fine-tuned: its guided decoding settings go with the new weights
    if init_from is not None and not resume:
        init_from = parent = embedded_path() if str(init_from) == "embedded" else Path(init_from)
        tokenizer, model = load_init(init_from)
        if grow_depth is not None:
            from dgemma_struct.training.grow import grow_depth as grow

            model = grow(model, grow_depth)
    corpus_name, corpus = corpus, mixed_corpus(CORPORA, corpus, corpus_size, seed, mix, fresh_names,
                                                      short_records, tables, absent, phrasings)
    log: list[dict] = []
    if resume:
        tokenizer = AutoTokenizer.from_pretrained(out_dir)
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(out_dir)
        log = json.loads((out_dir / "training_log.json").read_text())
    elif init_from is None:
        tokenizer = build_tokenizer(tokenizer_texts(corpus), vocab_size)
        model = DiffusionGemmaForBlockDiffusion(embedded_config(len(tokenizer)))
    config = model.config
    model.to(dev)
    encoded = [encode_example(tokenizer, e) for e in corpus]
    # Tool prompts carry declarations (~4x longer): a batch holds one kind, so short rows are not
    # padded to a tool prompt's length.
    groups = ([i for i, e in enumerate(corpus) if not e.get("tools")], [i for i, e in enumerate(corpus) if e.get("tools")])
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    step, seconds_before = 0, 0.0
    if resume:
        state = load_state(state_path)  # the optimizer moves its own
        if state.get("corpus", "default") != corpus_name:
            raise InvalidRequestError(f"--resume: this run was trained on the {state.get('corpus', 'default')!r} "
                                      f"corpus, not {corpus_name!r}")
        opt.load_state_dict(state["optimizer"])
        step, seconds_before = state["step"], state["seconds"]
        rng.setstate(state["rng"])
        gen.set_state(state["gen"])
        torch.set_rng_state(state["torch_rng"])
    start = time.time()
    step_budget = max_steps if max_steps is not None else 10**9
    bar = tqdm(total=max_steps, initial=step, desc="train", unit="step", mininterval=5)

    def checkpoint() -> None:
        save(model, tokenizer, out_dir, settings_from=parent)
        save_state({"optimizer": opt.state_dict(), "step": step, "seconds": seconds_before + time.time() - start,
                    "rng": rng.getstate(), "gen": gen.get_state(), "torch_rng": torch.get_rng_state(),
                    "corpus": corpus_name}, state_path)
        (out_dir / "training_log.json").write_text(json.dumps(log))

    while step < step_budget:
        elapsed = time.time() - start
        # a wall-time run's minutes are the whole run's, resumed parts included; with max_steps, this call's
        if (elapsed if max_steps is not None else seconds_before + elapsed) > minutes * 60:
            break
        if max_steps is not None:
            cur_lr = lr_at(step, max_steps, lr=lr, warmup=warmup, floor=lr_floor)
        else:
            # a resumed wall-time run goes on along the same schedule: its earlier seconds count
            done_s = seconds_before + elapsed
            cur_lr = lr_at(step, step * minutes * 60 / max(done_s, 1e-9), lr=lr, warmup=warmup, floor=lr_floor)
        for g in opt.param_groups:
            g["lr"] = cur_lr
        group = groups[0] if rng.random() < len(groups[0]) / len(encoded) else groups[1]
        batch = make_batch([encoded[group[rng.randrange(len(group))]] for _ in range(batch_size)],
                           config.canvas_length, config.text_config.vocab_size, gen, rng, recipe)
        with torch.autocast(dev.type, dtype=amp, enabled=amp != torch.float32):
            diff_loss, ar_loss = loss_on_batch(model, to_device(batch, dev), rng.random() < recipe.self_condition,
                                               recipe, gen)
        loss = recipe.weight * diff_loss + ar_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        bar.update(1)
        if step % log_every == 0 or step == 1:
            rec = {"step": step, "s": round(seconds_before + time.time() - start, 1), "lr": cur_lr,
                   "diffusion_loss": round(diff_loss.item(), 4), "ar_loss": round(ar_loss.item(), 4)}
            log.append(rec)
            bar.set_postfix(diff=rec["diffusion_loss"], ar=rec["ar_loss"])
            (out_dir / "training_log.json").write_text(json.dumps(log))
        if step % checkpoint_every == 0:
            checkpoint()
            if keep_checkpoints:
                save(model, tokenizer, out_dir / f"step_{step:05d}", settings_from=out_dir)
    bar.close()
    model.eval()
    checkpoint()
    total_s = seconds_before + time.time() - start
    meta = {"steps": step, "minutes": round(total_s / 60, 2), "batch_size": batch_size, "lr": lr,
            "seed": seed, "corpus": corpus_name, "corpus_size": corpus_size, "vocab_size": len(tokenizer), "parameters": n_params,
            "canvas_length": config.canvas_length, "threads": threads, "device": str(dev),
            "autocast": None if amp == torch.float32 else str(amp).removeprefix("torch."),
            "schedule": "steps" if max_steps is not None else "wall-time", "init_from": str(init_from or "") or None,
            "mix": mix, "fresh_names": fresh_names, "short_records": short_records, "tables": tables, "absent": absent,
            "phrasings": phrasings, "warmup": warmup, "lr_floor": lr_floor, "layers": config.get_text_config().num_hidden_layers,
            "grow_depth": grow_depth, "diffusion": recipe.as_dict()}
    (out_dir / "training_meta.json").write_text(json.dumps(meta, indent=1))
    return meta


def default_generation_config():
    """Settings under which adaptive early stopping really fires for the embedded model (the
    default confidence threshold, 0.005, never fires on a model this small). Chosen by
    ``benchmarks/settings_sweep.py`` (docs/results/settings_sweep.md): the row with the best
    valid-JSON rate among those with TPF >= 3."""
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
        DiffusionGemmaGenerationConfig, EntropyBoundSamplerConfig)

    return DiffusionGemmaGenerationConfig(
        max_new_tokens=128, max_denoising_steps=32, sampler_config=EntropyBoundSamplerConfig(entropy_bound=1.0),
        t_min=0.3, t_max=0.8, stability_threshold=0, confidence_threshold=0.3,
        eos_token_id=list(STOP_IDS), pad_token_id=PAD_ID, bos_token_id=BOS_ID)


def save(model, tokenizer, out_dir: Path, settings_from: Path | None = None) -> None:
    model.generation_config = default_generation_config()
    for old in out_dir.glob("model*.safetensors*"):
        old.unlink()  # a shard count that changed leaves no stale shard behind
    model.save_pretrained(out_dir, safe_serialization=True, max_shard_size="15MB")
    tokenizer.save_pretrained(out_dir)
    # without them a fine-tuned checkpoint decodes under the generation config alone (23% on the splits, not 57%)
    if settings_from is not None and (settings_from / CHECKPOINT_SETTINGS_FILE).exists():
        shutil.copyfile(settings_from / CHECKPOINT_SETTINGS_FILE, out_dir / CHECKPOINT_SETTINGS_FILE)
