"""``DiffusionRuntime``: a DiffusionGemma checkpoint, its tokenizer, and our own generation loops.

Example::

    >>> from dgemma_struct import DiffusionRuntime
    >>> rt = DiffusionRuntime.default()                         # the embedded model, offline
    >>> out = rt.generate("Give the phone number.\\nCall me on 555-123-4567.", max_new_tokens=32, seed=0)
    >>> out.stats.forward_passes > 0
    True
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import logging.handlers
import numbers
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from dgemma_struct.engine.autoregressive import autoregressive_loop
from dgemma_struct.engine.canvas import LoopOutput, diffusion_loop
from dgemma_struct.errors import InvalidRequestError, ModelLoadError, PromptTooLongError
from dgemma_struct.engine.devices import DTYPES, resolve_device, resolve_dtype  # noqa: F401 - re-exported
from dgemma_struct.engine.hooks import StepHook
from dgemma_struct.engine.token_logprobs import MAX_TOP_LOGPROBS, FreeTextLogprobs, kept_entries, named
from dgemma_struct.prompts import (MODES, Prompt, chat_messages, check_max_new_tokens,
                                   check_prompt_ids, check_sampling, check_seed)
from dgemma_struct.results import CanvasEvent, GenerationResult, GenerationStats
from dgemma_struct.engine.sampler import CHECKPOINT_SETTINGS_FILE, DiffusionSettings

EMBEDDED_DIR = Path(__file__).parent / "embedded"

_default_lock = threading.Lock()
_default_runtimes: "dict[tuple[str, torch.dtype], DiffusionRuntime]" = {}



def _line(err: BaseException) -> str:
    """An exception's message on one line (transformers' load errors span several), at most 500 chars."""
    text = " ".join(str(err).split())
    return text if len(text) <= 500 else text[:497] + "..."


@contextlib.contextmanager
def _quiet_loading() -> Iterator[None]:
    """transformers' output while it loads weights. The "Loading weights" bar only when logging asks
    for it (``dgemma_struct`` at INFO); its log records held and emitted only when the load returns:
    transformers logs its multi-line load report in a ``finally``, so a Ctrl-C (or a failed load) would
    print it before the one-line error (tests/runtime/test_quiet_loading.py)."""
    from transformers.utils import logging as hf_logging

    quiet = hf_logging.is_progress_bar_enabled() and not logging.getLogger("dgemma_struct").isEnabledFor(logging.INFO)
    hf = logging.getLogger("transformers")
    handlers, propagate, held = hf.handlers[:], hf.propagate, logging.handlers.BufferingHandler(1 << 30)
    for h in handlers:
        hf.removeHandler(h)
    hf.addHandler(held)
    hf.propagate = False
    if quiet:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if quiet:
            hf_logging.enable_progress_bar()
        hf.removeHandler(held)
        for h in handlers:
            hf.addHandler(h)
        hf.propagate = propagate
    for record in held.buffer:   # reached only when the load returned
        hf.handle(record)


ENCODE_CACHE_SIZE = 256   # a server counts a prompt's tokens, then generates from it: one template run


def _prompt_key(prompt: Any) -> str | None:
    """A JSON text that gives ``prompt`` back (str or a list of messages), or None: not memoised."""
    try:
        key = json.dumps(prompt, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None
    return key if isinstance(prompt, (str, list)) and len(key) <= 64 * 1024 else None


class DiffusionRuntime:
    """A loaded DiffusionGemma model plus tokenizer. ``model`` is the transformers
    ``DiffusionGemmaForBlockDiffusion``; ``tokenizer`` the HF tokenizer."""

    def __init__(self, model, tokenizer, *, name: str = "model"):
        from transformers import DiffusionGemmaForBlockDiffusion

        if not isinstance(model, DiffusionGemmaForBlockDiffusion):
            raise ModelLoadError(f"expected a DiffusionGemmaForBlockDiffusion, got {type(model).__name__}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        gc = model.generation_config
        eos = gc.eos_token_id if gc.eos_token_id is not None else model.config.text_config.eos_token_id
        self.eos_token_ids: list[int] = list(eos) if isinstance(eos, (list, tuple)) else [int(eos)]
        pad = gc.pad_token_id if gc.pad_token_id is not None else model.config.text_config.pad_token_id
        self.pad_token_id: int | None = pad
        self.settings = DiffusionSettings.from_generation_config(gc)
        self.max_context = int(model.config.text_config.max_position_embeddings)
        self.lock = threading.Lock()   # one generation at a time per model (servers batch instead)
        self._encoded = functools.lru_cache(maxsize=ENCODE_CACHE_SIZE)(self._encode_key)

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, path_or_id: str | Path, *, device: str | torch.device = "auto",
                        dtype: str | torch.dtype | None = "auto",
                        local_files_only: bool | None = None) -> "DiffusionRuntime":
        """Loads a ``DiffusionGemmaForBlockDiffusion`` checkpoint and its tokenizer from a local
        directory, or a hub id when the machine has network. ``device``: ``"auto"`` (CUDA when
        available), ``"cpu"``, ``"cuda"``, ``"cuda:N"``; ``dtype``: ``"auto"`` (bf16 on CUDA, fp32 on
        CPU), ``"bf16"``, ``"fp16"``, ``"fp32"`` (or torch objects) -- see :func:`resolve_device`."""
        from transformers import AutoConfig, AutoTokenizer, DiffusionGemmaForBlockDiffusion

        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        path = Path(path_or_id)
        local = path.is_dir()
        lfo = local if local_files_only is None else local_files_only
        try:
            config = AutoConfig.from_pretrained(str(path_or_id), local_files_only=lfo)
        except Exception as err:  # noqa: BLE001 - transformers raises several types here
            raise ModelLoadError(f"cannot load a config from {path_or_id!r}: {_line(err)}") from err
        if getattr(config, "model_type", None) != "diffusion_gemma":
            raise ModelLoadError(f"{path_or_id!r} is a {getattr(config, 'model_type', '?')!r} checkpoint, "
                                 "not a DiffusionGemma one (model_type 'diffusion_gemma')")
        try:
            with _quiet_loading():
                model = DiffusionGemmaForBlockDiffusion.from_pretrained(str(path_or_id), dtype=dt, local_files_only=lfo)
            tokenizer = AutoTokenizer.from_pretrained(str(path_or_id), local_files_only=lfo)
            model = model.to(dev)
        except Exception as err:  # noqa: BLE001
            raise ModelLoadError(f"cannot load {path_or_id!r} on {dev} as {dt}: {_line(err)}") from err
        rt = cls(model, tokenizer, name=path.name if local else str(path_or_id))
        own = path / CHECKPOINT_SETTINGS_FILE
        if local and own.exists():
            try:
                rt.settings = rt.settings.with_checkpoint_file(json.loads(own.read_text(encoding="utf-8")))
            except (ValueError, AttributeError, TypeError) as err:
                raise ModelLoadError(f"{str(own)!r}: {_line(err)}") from err
        return rt

    @classmethod
    def default(cls, device: str | torch.device = "auto", dtype: str | torch.dtype | None = "auto") -> "DiffusionRuntime":
        """The embedded model shipped in the package, loaded once per process and per (device,
        dtype); ``device`` / ``dtype`` as in :meth:`from_pretrained` (``"auto"``: CUDA + bf16 when
        a GPU is present, else CPU + fp32)."""
        dev = resolve_device(device)
        key = (str(dev), resolve_dtype(dtype, dev))
        with _default_lock:
            if key not in _default_runtimes:
                if not (EMBEDDED_DIR / "model.safetensors").exists():
                    raise ModelLoadError(f"the embedded checkpoint is missing from {EMBEDDED_DIR}")
                rt = cls.from_pretrained(EMBEDDED_DIR, local_files_only=True, device=dev, dtype=key[1])
                rt.name = "dgemma-struct-embedded"
                _default_runtimes[key] = rt
            return _default_runtimes[key]

    # ------------------------------------------------------------------ prompts
    def encode_prompt(self, prompt: Prompt) -> list[int]:
        """Chat-template a prompt (a user string, a list of chat messages or a :class:`ChatPrompt`)
        into token ids. Strings and message lists (up to 64 KB as JSON) are memoised per runtime, the
        last :data:`ENCODE_CACHE_SIZE` of them."""
        key = _prompt_key(prompt)
        return self._encode(prompt) if key is None else list(self._encoded(key))

    def _encode_key(self, key: str) -> tuple[int, ...]:
        return tuple(self._encode(json.loads(key)))

    def _encode(self, prompt: Prompt) -> list[int]:
        messages, extra = chat_messages(prompt, has_template=bool(getattr(self.tokenizer, "chat_template", None)),
                                        max_context=self.max_context)
        try:
            if getattr(self.tokenizer, "chat_template", None):
                ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                         **extra)
                if hasattr(ids, "keys"):
                    ids = ids["input_ids"]
                return list(ids)
            text = "\n".join(m.get("content") or "" for m in messages)
            return self.tokenizer(text)["input_ids"]
        except Exception as err:  # noqa: BLE001 - a template or tokenizer refusing this input
            raise InvalidRequestError(f"the prompt could not be encoded: {type(err).__name__}: {err}"[:500]) from err

    def check_fits(self, encoded: Sequence[Sequence[int]], max_new_tokens: int) -> None:
        """Raises :class:`PromptTooLongError` when the longest encoded prompt plus
        ``max_new_tokens`` exceeds the model's context."""
        longest = max(len(e) for e in encoded)
        if longest + max_new_tokens > self.max_context:
            raise PromptTooLongError(f"prompt of {longest} tokens plus max_new_tokens={max_new_tokens} exceeds "
                                     f"the model's context of {self.max_context} tokens")

    def _batch(self, encoded: Sequence[Sequence[int]], max_new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.check_fits(encoded, max_new_tokens)
        longest = max(len(e) for e in encoded)
        pad = self.pad_token_id if self.pad_token_id is not None else 0
        ids = torch.full((len(encoded), longest), pad, dtype=torch.long)
        mask = torch.zeros((len(encoded), longest), dtype=torch.long)
        for i, e in enumerate(encoded):
            ids[i, longest - len(e):] = torch.tensor(list(e), dtype=torch.long)
            mask[i, longest - len(e):] = 1
        return ids.to(self.model.device), mask.to(self.model.device)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def split_output(self, row: torch.Tensor | Sequence[int], max_new_tokens: int) -> tuple[list[int], str]:
        """Generated ids up to (excluding) the first stop token, without pad, at most
        ``max_new_tokens`` of them; and the finish reason: ``"stop"`` when a stop token, or pad to the
        end of the row, ends the output within the budget (the stop token counts as one of the
        ``max_new_tokens``, as in vLLM), ``"length"`` when the budget is reached first (the canvas holds
        whole blocks, so the loop may have produced more: it is cut)."""
        ids = row.tolist() if isinstance(row, torch.Tensor) else list(row)
        ends = {self.pad_token_id, *self.eos_token_ids}
        last = max((i for i, t in enumerate(ids) if t not in ends), default=-1)   # past it: pad/stop only
        out: list[int] = []
        for i, t in enumerate(ids):
            if len(out) >= max_new_tokens:
                return out, "length"
            if t in self.eos_token_ids or i > last:
                return out, "stop"
            if t != self.pad_token_id:
                out.append(t)
        return out, "length"

    # ------------------------------------------------------------------ generation
    def generate(self, prompt: Prompt, *, max_new_tokens: int = 128, seed: int | None = None,
                 mode: str = "diffusion", hook: StepHook | None = None, temperature: float | None = None,
                 top_p: float = 1.0, settings: DiffusionSettings | None = None) -> GenerationResult:
        """One prompt; see :meth:`generate_batch`."""
        return self.generate_batch([prompt], max_new_tokens=max_new_tokens, seed=seed, mode=mode, hook=hook,
                                   temperature=temperature, top_p=top_p, settings=settings)[0]

    def generate_batch(self, prompts: Sequence[Prompt], *, max_new_tokens: int = 128,
                       seed: int | Sequence[int] | None = None, mode: str = "diffusion",
                       hook: StepHook | None = None, temperature: float | None = None, top_p: float = 1.0,
                       settings: DiffusionSettings | None = None,
                       on_canvas=None, on_draft=None) -> list[GenerationResult]:
        """Generates for a batch of prompts (left-padded). ``mode="diffusion"`` runs block
        diffusion, ``mode="ar"`` the same weights left to right.

        Sampling: ``temperature=None`` is each mode's default (diffusion: the checkpoint's
        temperature schedule, greedy on the rows a guide commits when ``settings.guided_greedy``;
        AR: greedy); ``0`` is greedy in both; ``t > 0`` scales the diffusion
        schedule by ``t`` and is the softmax temperature in AR. ``top_p`` < 1: nucleus sampling.

        ``seed``: an int seeds torch's global RNG, as ``model.generate`` uses it (an unconstrained
        run then reproduces ``model.generate``); ``None`` draws from the global RNG as it stands.
        A list (one seed per row), or any run with a ``hook``, gives every row its own generator:
        a row's output is then the same in any batch (see :func:`~dgemma_struct.engine.canvas.diffusion_loop`)."""
        if not prompts:
            raise InvalidRequestError("no prompts given")
        return self.generate_ids([self.encode_prompt(p) for p in prompts], max_new_tokens=max_new_tokens,
                                 seed=seed, mode=mode, hook=hook, temperature=temperature, top_p=top_p,
                                 settings=settings, on_canvas=on_canvas, on_draft=on_draft)

    def _row_seeds(self, seed: int | Sequence[int] | None, n: int) -> list[int]:
        if seed is None:  # from the global RNG: reproducible under torch.manual_seed, as before
            return [int(x) for x in torch.randint(0, 2**62, (n,))]
        if isinstance(seed, numbers.Integral):
            return [int(seed)] * n
        seeds = list(seed)
        if len(seeds) != n:
            raise InvalidRequestError(f"{n} rows but {len(seeds)} seeds")
        for s in seeds:
            check_seed(s)
        return [int(s) for s in seeds]

    def generate_ids(self, encoded: Sequence[Sequence[int]], *, max_new_tokens: int = 128,
                     seed: int | Sequence[int] | None = None, mode: str = "diffusion",
                     hook: StepHook | None = None, temperature: float | None = None, top_p: float = 1.0,
                     settings: DiffusionSettings | None = None, on_canvas=None,
                     on_draft=None, logprobs: int | None = None) -> list[GenerationResult]:
        """Like :meth:`generate_batch` on already-encoded prompts (token ids, template applied).
        ``logprobs=k`` (no ``hook``): each result's ``logprobs`` holds one entry per token (the last
        denoising step's distribution at its position; :mod:`dgemma_struct.engine.token_logprobs`); the run then
        has a recording hook, so every row draws from its own generator."""
        if mode not in MODES:
            raise InvalidRequestError(f"unknown mode {mode!r}; expected one of {MODES}")
        check_max_new_tokens(max_new_tokens)
        if not isinstance(seed, (list, tuple)):
            check_seed(seed)
        check_sampling(temperature, top_p)
        if settings is not None and not isinstance(settings, DiffusionSettings):
            raise InvalidRequestError(f"settings must be a DiffusionSettings, got {type(settings).__name__}")
        check_prompt_ids(encoded, self.model.config.text_config.vocab_size)
        recorder = None
        if logprobs is not None:
            if isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= MAX_TOP_LOGPROBS:
                raise InvalidRequestError(f"logprobs must be None or an integer in [0, {MAX_TOP_LOGPROBS}]")
            if hook is not None:
                raise InvalidRequestError("logprobs= records free text only; a guide records its own")
            hook = recorder = FreeTextLogprobs(len(encoded), logprobs, temperature if mode == "ar" else None)
        per_row = hook is not None or isinstance(seed, (list, tuple))
        ids, mask = self._batch(encoded, max_new_tokens)
        with self.lock:
            row_seeds: list[int | None] = [None] * len(encoded)
            generators = None
            if per_row:
                row_seeds = self._row_seeds(seed, len(encoded))
                generators = [torch.Generator(device=self.model.device).manual_seed(s) for s in row_seeds]
            elif seed is not None:
                torch.manual_seed(seed)
                row_seeds = [int(seed)] * len(encoded)
            t0 = time.perf_counter()
            if mode == "diffusion":
                out: LoopOutput = diffusion_loop(
                    self.model, ids, mask, max_new_tokens=max_new_tokens, settings=settings or self.settings,
                    eos_token_ids=self.eos_token_ids, pad_token_id=self.pad_token_id, hook=hook,
                    on_canvas=on_canvas, on_draft=on_draft, temperature_scale=temperature, top_p=top_p,
                    generators=generators)
            else:
                out = autoregressive_loop(self.model, ids, mask, max_new_tokens=max_new_tokens,
                                          eos_token_ids=self.eos_token_ids, pad_token_id=self.pad_token_id,
                                          temperature=temperature, hook=hook, top_p=top_p, generators=generators)
            wall = time.perf_counter() - t0
        results, table = [], torch.cat([out.sequences[:, ids.shape[1]:], out.forward_passes[:, None].long()], 1).tolist()
        for b, (*new, passes) in enumerate(table):   # every row's tokens and passes: one host read, then sliced
            res = self._result(new, passes, max_new_tokens, mode=mode, canvases=out.canvases,
                               denoising_steps=out.steps, wall_s=wall, model_s=out.model_s,
                               mask_s=out.hook_s, seed=row_seeds[b])
            if recorder is not None:
                res.logprobs = named(kept_entries(recorder.rows[b], new, self.pad_token_id, len(res.token_ids)),
                                     self.tokenizer)
            results.append(res)
        return results

    def row_result(self, row: torch.Tensor, passes: int, max_new_tokens: int, **stats: Any) -> GenerationResult:
        """One row's result from its generated columns (pad after a stop token): the ids before the
        stop token, at most ``max_new_tokens`` (:meth:`split_output`), and ``tokens_per_forward`` as
        transformers counts it (non-pad tokens / decoder passes). ``stats``: the other
        :class:`GenerationStats` fields (``other_s`` is derived from ``wall_s``)."""
        return self._result(row.tolist(), passes, max_new_tokens, **stats)

    def _result(self, row: list[int], passes: int, max_new_tokens: int, **stats: Any) -> GenerationResult:
        token_ids, reason = self.split_output(row, max_new_tokens)
        non_pad = sum(t != self.pad_token_id for t in row) if self.pad_token_id is not None else len(row)
        wall = stats.pop("wall_s", 0.0)
        s = GenerationStats(forward_passes=passes, generated_tokens=len(token_ids),
                            tokens_per_forward=non_pad / passes if passes else 0.0, finish_reason=reason, **stats)
        s.set_wall(wall)
        return GenerationResult(text=self.decode(token_ids), token_ids=token_ids, stats=s)

    def stream(self, prompt: Prompt | None = None, *, prompt_ids: Sequence[int] | None = None,
               max_new_tokens: int = 128, seed: int | Sequence[int] | None = None, drafts: bool = False,
               hook: StepHook | None = None, temperature: float | None = None,
               top_p: float = 1.0) -> Iterator[CanvasEvent]:
        """Yields each committed canvas (and, with ``drafts=True``, each step's draft, marked
        ``draft=True``) as it is produced, its text capped at ``max_new_tokens`` tokens; the last
        event has ``done=True``, the ``finish_reason`` (``"stop"`` or ``"length"``) and the stats.
        Runs the loop in a worker thread."""
        import queue

        check_max_new_tokens(max_new_tokens)
        if not isinstance(seed, (list, tuple)):
            check_seed(seed)
        check_sampling(temperature, top_p)
        q: "queue.Queue[Any]" = queue.Queue()
        committed: list[int] = []
        encoded = list(prompt_ids) if prompt_ids is not None else self.encode_prompt(prompt)

        def on_canvas(i: int, tokens: torch.Tensor) -> None:
            committed.extend(t for t in tokens[0].tolist())
            ids, _ = self.split_output(torch.tensor(committed), max_new_tokens)
            q.put(CanvasEvent(row=0, canvas_index=i, token_ids=ids, text=self.decode(ids)))

        def on_draft(i: int, argmax: torch.Tensor) -> None:
            ids = committed + argmax[0].tolist()
            ids, _ = self.split_output(torch.tensor(ids), max_new_tokens)
            q.put(CanvasEvent(row=0, canvas_index=i, token_ids=ids, text=self.decode(ids), draft=True))

        def work() -> None:
            try:
                res = self.generate_ids([encoded], max_new_tokens=max_new_tokens, seed=seed, hook=hook,
                                        on_canvas=on_canvas, on_draft=on_draft if drafts else None,
                                        temperature=temperature, top_p=top_p)[0]
                q.put(CanvasEvent.final(res, validated=False))
            except BaseException as err:  # noqa: BLE001 - re-raised in the consumer
                q.put(err)

        threading.Thread(target=work, daemon=True).start()
        while True:
            item = q.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.done:
                return
