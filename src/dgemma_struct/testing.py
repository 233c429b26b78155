"""Testing helpers: Hypothesis strategies for schemas, pydantic models and constrained-decoding
outputs, a tiny random runtime for fast tests, and pytest fixtures.

Property-test your own prompts (every output validates, every failure is typed)::

    # conftest.py
    from dgemma_struct.testing import embedded_runtime  # noqa: F401  (a session-scoped fixture)

    # test_my_prompts.py
    from hypothesis import given, settings
    from dgemma_struct.testing import constrained_values
    from myapp import Invoice

    @settings(max_examples=10, deadline=None)
    @given(constrained_values(Invoice, prompts=["Extract the invoice: ..."]))
    def test_invoices_are_valid(invoice):
        assert invoice.total >= 0

Strategies: :func:`json_schemas` (simple, always-compilable object schemas), :func:`pydantic_models`
(pydantic classes built from those schemas), :func:`schema_instances` (valid instances, via
hypothesis-jsonschema), :func:`constrained_values` (values from constrained decoding).
Runtimes: :func:`tiny_runtime` (random weights, builds in ~1 s); fixtures ``embedded_runtime`` and
``tiny_random_runtime``.
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Literal, Optional, Sequence

from hypothesis import strategies as st

from dgemma_struct.errors import DgemmaStructError, ModelLoadError

__all__ = ["json_schemas", "pydantic_models", "model_from_schema", "schema_instances", "constrained_values",
           "tiny_runtime", "embedded_runtime", "tiny_random_runtime", "embedded_model_available",
           "write_gemma4_shaped_tokenizer", "gemma4_shaped_tokenizer_dir"]

WORDS = ("red", "green", "blue", "cat", "dog", "yes", "no", "alpha", "beta", "low", "high", "ok")
KEYS = ("name", "age", "color", "tags", "ok", "size", "kind", "level", "count", "label")


# ---------------------------------------------------------------------------- schemas
def _enum_values(max_size: int = 4) -> st.SearchStrategy[list[str]]:
    return st.lists(st.sampled_from(WORDS), min_size=1, max_size=max_size, unique=True)


def _leaf_schemas(max_string_length: int) -> st.SearchStrategy[dict]:
    return st.one_of(
        _enum_values().map(lambda e: {"type": "string", "enum": e}),
        st.integers(1, max_string_length).map(lambda n: {"type": "string", "maxLength": n}),
        st.tuples(st.integers(-50, 50), st.integers(0, 100)).map(
            lambda t: {"type": "integer", "minimum": t[0], "maximum": t[0] + t[1]}),
        st.just({"type": "boolean"}),
        st.tuples(_enum_values(3), st.integers(0, 3)).map(
            lambda t: {"type": "array", "items": {"type": "string", "enum": t[0]}, "maxItems": t[1]}),
    )


def _object(props: st.SearchStrategy[dict], max_properties: int) -> st.SearchStrategy[dict]:
    @st.composite
    def build(draw: Any) -> dict:
        keys = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=max_properties, unique=True))
        properties = {k: draw(props) for k in keys}
        required = [k for k in keys if draw(st.booleans())] if draw(st.booleans()) else list(keys)
        return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return build()


def json_schemas(*, max_depth: int = 2, max_properties: int = 4, max_string_length: int = 8
                 ) -> st.SearchStrategy[dict]:
    """Small object schemas that every constraint backend here compiles: strings with ``enum`` or
    ``maxLength``, bounded integers, booleans, arrays of enums (``maxItems`` <= 3), and nested
    objects up to ``max_depth`` levels; ``additionalProperties: false``, some properties optional."""
    leaf = _leaf_schemas(max_string_length)
    level = _object(leaf, max_properties)
    for _ in range(max_depth - 1):
        level = _object(st.one_of(leaf, leaf, level), max_properties)
    return level


_names = itertools.count()


def model_from_schema(schema: dict, name: str | None = None) -> type:
    """A pydantic model for a schema drawn from :func:`json_schemas` (``Literal`` for enums,
    ``Field`` bounds for lengths and ranges, nested models for objects)."""
    from typing import Annotated

    from pydantic import ConfigDict, Field, create_model

    def typ(s: dict, field_name: str) -> Any:
        t = s.get("type")
        if "enum" in s:
            return Literal[tuple(s["enum"])]
        if t == "string":
            return Annotated[str, Field(max_length=s["maxLength"])] if "maxLength" in s else str
        if t == "integer":
            return Annotated[int, Field(ge=s.get("minimum"), le=s.get("maximum"))]
        if t == "boolean":
            return bool
        if t == "array":
            return Annotated[list[typ(s["items"], field_name)], Field(max_length=s.get("maxItems"))]
        if t == "object":
            return model_from_schema(s, f"{field_name.title()}{next(_names)}")
        raise ValueError(f"unsupported schema {s!r}")

    required = set(schema.get("required", []))
    fields: dict[str, Any] = {}
    for key, sub in schema["properties"].items():
        t = typ(sub, key)
        fields[key] = (t, ...) if key in required else (Optional[t], None)
    return create_model(name or f"Model{next(_names)}", __config__=ConfigDict(extra="forbid"), **fields)


def pydantic_models(**schema_opts: Any) -> st.SearchStrategy[type]:
    """pydantic classes built with ``pydantic.create_model`` from :func:`json_schemas`."""
    return json_schemas(**schema_opts).map(model_from_schema)


def schema_instances(schema: Any) -> st.SearchStrategy[Any]:
    """Valid instances of a JSON Schema (a dict or a pydantic class), via hypothesis-jsonschema."""
    from hypothesis_jsonschema import from_schema

    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        schema = schema.model_json_schema()
    return from_schema(schema)


# ---------------------------------------------------------------------------- decoding
def constrained_values(spec: Any, *, runtime: Any = None, prompts: Sequence[Any] = ("Answer as JSON.",),
                       seeds: st.SearchStrategy[int] | None = None, on_error: str = "raise",
                       return_details: bool = False, **generate_opts: Any) -> st.SearchStrategy[Any]:
    """Values produced by constrained decoding of ``spec`` (a pydantic class, JSON Schema, Regex,
    Grammar, Choice, ...) for a prompt drawn from ``prompts`` and a drawn seed.

    ``runtime`` defaults to the embedded model (loaded on first draw). ``on_error``: ``"raise"``
    (a typed :class:`~dgemma_struct.errors.DgemmaStructError` fails the test), ``"skip"``
    (the example is rejected) or ``"return"`` (the error object is the drawn value, to assert on
    it). ``generate_opts`` go to :func:`dgemma_struct.generate` (``max_new_tokens``, ...)."""
    if on_error not in ("raise", "skip", "return"):
        raise ValueError("on_error must be 'raise', 'skip' or 'return'")
    if not prompts:
        raise ValueError("give at least one prompt")
    seeds = seeds if seeds is not None else st.integers(0, 2 ** 16)

    @st.composite
    def values(draw: Any) -> Any:
        from hypothesis import reject

        from dgemma_struct.api import generate

        prompt = draw(st.sampled_from(list(prompts)))
        seed = draw(seeds)
        try:
            return generate(prompt, spec, runtime=runtime, seed=seed, return_details=return_details,
                            **generate_opts)
        except DgemmaStructError as err:
            if on_error == "skip":
                reject()
            if on_error == "return":
                return err
            raise
    return values()


# ---------------------------------------------------------------------------- runtimes
def tiny_runtime(*, seed: int = 0, vocab_size: int = 512, canvas_length: int = 16, max_denoising_steps: int = 6,
                 corpus_size: int = 200):
    """A random-weight DiffusionGemma (a few hundred thousand parameters) with a byte-level BPE
    tokenizer trained on the project's synthetic corpus: fast, offline, outputs are noise but
    constrained outputs are still valid. For tests of plumbing, not quality."""
    import torch
    from transformers import DiffusionGemmaForBlockDiffusion

    from dgemma_struct.engine.model_config import PAD_ID, STOP_IDS, tiny_config
    from dgemma_struct.runtime import DiffusionRuntime
    from dgemma_struct.engine.sampler import DiffusionSettings
    from dgemma_struct.training.corpus import make_corpus
    from dgemma_struct.training.train import build_tokenizer

    corpus = make_corpus(corpus_size, seed=5)  # the tokenizer's training text
    tok = build_tokenizer([e["prompt"] for e in corpus] + [e["answer"] for e in corpus], vocab_size=vocab_size)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = DiffusionGemmaForBlockDiffusion(tiny_config(vocab_size=vocab_size, canvas_length=canvas_length)).eval()
    finally:
        torch.random.set_rng_state(state)
    gc = model.generation_config
    gc.eos_token_id, gc.pad_token_id = list(STOP_IDS), PAD_ID
    rt = DiffusionRuntime(model, tok, name="tiny-random")
    rt.settings = DiffusionSettings(max_denoising_steps=max_denoising_steps, entropy_bound=0.5,
                                    confidence_threshold=0.5)
    return rt


def gemma3_style_tokenizer(vocab_size: int = 400, texts: Sequence[str] | None = None):
    """A small byte-level BPE with Gemma 3's turn tokens (``<start_of_turn>``/``<end_of_turn>``) and
    none of Gemma 4's control tokens: what an older checkpoint brings. Thinking and tool calls
    must be refused with a typed error on it. ``texts``: what the merges are learned from (default:
    the project's corpus without tool or thinking examples)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from dgemma_struct.training.corpus import make_corpus

    if texts is None:
        texts = [e["prompt"] + " " + e["answer"]
                 for e in make_corpus(200, seed=5, tool_fraction=0.0, thinking_fraction=0.0)]
    specials = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<unk>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                       show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                                   unk_token="<unk>", additional_special_tokens=specials[3:5])


# ---------------------------------------------------------------------------- a Gemma-4-shaped tokenizer
GEMMA4_CONTROL_IDS = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 4: "<mask>", 46: "<|tool>", 47: "<tool|>",
                      48: "<|tool_call>", 49: "<tool_call|>", 50: "<|tool_response>", 51: "<tool_response|>",
                      52: '<|"|>', 98: "<|think|>", 100: "<|channel>", 101: "<channel|>", 105: "<|turn>",
                      106: "<turn|>", 255999: "<|image>", 256000: "<|audio>", 258880: "<|image|>",
                      258881: "<|audio|>", 258882: "<image|>", 258883: "<audio|>", 258884: "<|video|>"}
GEMMA4_VOCAB_SIZE = 262_144
_SPACE_ID = 236_743   # "▁", followed by the single characters, as in Gemma 4's vocabulary
_G4_CONFIG = {"backend": "tokenizers", "tokenizer_class": "GemmaTokenizer", "padding_side": "left",
              "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
              "mask_token": "<mask>", "sot_token": "<|turn>", "eot_token": "<turn|>", "soc_token": "<|channel>",
              "eoc_token": "<channel|>", "think_token": "<|think|>", "std_token": "<|tool>", "etd_token": "<tool|>",
              "stc_token": "<|tool_call>", "etc_token": "<tool_call|>", "str_token": "<|tool_response>",
              "etr_token": "<tool_response|>", "escape_token": '<|"|>', "boi_token": "<|image>",
              "eoi_token": "<image|>", "image_token": "<|image|>", "boa_token": "<|audio>", "eoa_token": "<audio|>",
              "audio_token": "<|audio|>", "extra_special_tokens": ["<|video|>"]}


_G4_WORDS = ("call add GetWeather get_weather weather city Oslo Paris London name age email address phone date "
             "time event guests order items price total count tags skills person employee booking contact "
             "thought model user system declaration description parameters properties required type string "
             "integer number boolean object array enum true false null The quick brown fox jumps over the lazy dog "
             "Return a JSON object with fields Extract Convert answer yes no hello world value result search query")


def _trained_merges(chars: list[str]) -> tuple[list[str], list[list[str]]]:
    """Pieces and merges of a small SentencePiece-style BPE (``▁`` word starts, digits single) learned
    from the project's corpus without control-token spellings: common words become one or two pieces."""
    import json

    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    from dgemma_struct.training.corpus import make_corpus

    texts = [_G4_WORDS] * 20
    for e in make_corpus(1500, seed=5):
        text = e["prompt"] + " " + e["answer"]
        for t in GEMMA4_CONTROL_IDS.values():
            text = text.replace(t, " ")
        texts.append(text)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex("▁"), "merged_with_next"),
                                                 pre_tokenizers.Digits(individual_digits=True)])
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=6000, show_progress=False, initial_alphabet=chars))
    model = json.loads(tok.to_str())["model"]
    merges = [m.split(" ", 1) if isinstance(m, str) else list(m) for m in model["merges"]]
    return sorted(model["vocab"], key=model["vocab"].get), merges


def _gemma4_pieces() -> tuple[list[str], list[list[str]]]:
    """Vocabulary (index = id) and merges of the synthetic Gemma 4 tokenizer: control tokens,
    newline and space runs and ``<0xNN>`` byte pieces at Gemma 4's ids, single characters from
    id 236,743 (``▁`` first), learned pieces (:func:`_trained_merges`) and then generated letter
    n-grams (lower merge priority) in between; digits stay single, as in Gemma."""
    import string

    vocab: list = [None] * GEMMA4_VOCAB_SIZE
    for i, t in GEMMA4_CONTROL_IDS.items():
        vocab[i] = t
    vocab[5] = "[multimodal]"
    for k in range(31):
        vocab[107 + k], vocab[138 + k] = "\n" * (k + 1), "▁" * (k + 2)
    for b in range(256):
        vocab[238 + b] = f"<0x{b:02X}>"
    chars = ["▁"] + list(string.ascii_lowercase + string.ascii_uppercase + string.digits + string.punctuation)
    chars += list("\téèàüöäçñ–—’“”…°€£•")
    vocab[_SPACE_ID:_SPACE_ID + len(chars)] = chars
    seen = set(vocab)
    learned, merges = _trained_merges(chars)
    pieces = [p for p in learned if p not in seen]
    merges += [[a, b] for a in '{}[]":,▁' for b in '{}[]":,▁' if a + b not in seen]
    seen.update(pieces)
    pieces += [a + b for a, b in merges if a + b not in seen]
    seen.update(pieces)
    heads, lower = ["▁"] + list(string.ascii_letters), string.ascii_lowercase
    free = sum(1 for i in range(494, _SPACE_ID) if vocab[i] is None)
    level = [a for a in heads]
    while len(pieces) < free:
        nxt = []
        for p in level:
            for c in lower:
                if len(pieces) == free:
                    break
                nxt.append(p + c)
                if p + c not in seen:
                    seen.add(p + c)
                    merges.append([p, c])
                    pieces.append(p + c)
        level = nxt
    slots = iter(i for i in range(494, _SPACE_ID) if vocab[i] is None)
    for piece in pieces:
        vocab[next(slots)] = piece
    unused = itertools.count()
    vocab = [t if t is not None else f"<unused{next(unused)}>" for t in vocab]
    runs = [[c * k, c] for c in ("\n", "▁") for k in range(1, 32) if (c, k) != ("\n", 31)]
    return vocab, list({(a, b): [a, b] for a, b in runs + merges}.values())


def write_gemma4_shaped_tokenizer(out_dir: str | Path) -> Path:
    """Write a synthetic Gemma-4-shaped tokenizer into ``out_dir`` and return the path: 262,144
    SentencePiece-style BPE pieces with ``<0xNN>`` byte fallback (any text encodes), Gemma 4's
    control tokens at their real ids, Gemma 4's ``tokenizer_config.json`` and the DiffusionGemma chat
    template shipped with the embedded model. Enough for shape, stop-set, control-token and mask tests;
    token splits differ from the real vocabulary. Takes a few seconds."""
    import json
    import shutil

    from dgemma_struct.runtime import EMBEDDED_DIR

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab, merges = _gemma4_pieces()
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, t in sorted(GEMMA4_CONTROL_IDS.items())]
    bos = {"SpecialToken": {"id": "<bos>", "type_id": 0}}
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
            "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                              "invert": False},
            "post_processor": {"type": "TemplateProcessing", "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
                               "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, dict(bos, SpecialToken={
                                   "id": "<bos>", "type_id": 1}), {"Sequence": {"id": "B", "type_id": 1}}],
                               "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}},
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
                {"type": "Fuse"}]},
            "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                      "vocab": {t: i for i, t in enumerate(vocab)}, "merges": merges}}
    (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps(_G4_CONFIG, indent=1))
    shutil.copyfile(EMBEDDED_DIR / "chat_template.jinja", out / "chat_template.jinja")
    return out


_G4_DIRS: dict[str, Path] = {}


def gemma4_shaped_tokenizer_dir() -> Path:
    """:func:`write_gemma4_shaped_tokenizer` into a temporary folder, once per process (later calls
    return the same folder)."""
    import tempfile

    if "dir" not in _G4_DIRS:
        _G4_DIRS["dir"] = write_gemma4_shaped_tokenizer(tempfile.mkdtemp(prefix="gemma4-shaped-"))
    return _G4_DIRS["dir"]


def embedded_model_available() -> bool:
    from dgemma_struct.runtime import EMBEDDED_DIR

    return (EMBEDDED_DIR / "model.safetensors").exists()


try:
    import pytest as _pytest
except ImportError:  # pragma: no cover - pytest is optional
    _pytest = None

if _pytest is not None:
    @_pytest.fixture(scope="session")
    def embedded_runtime():
        """The embedded model (session-scoped); skips the test when the checkpoint is missing."""
        from dgemma_struct.runtime import DiffusionRuntime

        if not embedded_model_available():
            _pytest.skip("the embedded checkpoint (dgemma_struct/embedded/model.safetensors) is not installed")
        try:
            return DiffusionRuntime.default()
        except ModelLoadError as err:
            _pytest.skip(f"the embedded model does not load: {err}")

    @_pytest.fixture(scope="session")
    def tiny_random_runtime():
        """A session-scoped :func:`tiny_runtime`."""
        return tiny_runtime()
else:  # pragma: no cover
    embedded_runtime = tiny_random_runtime = None
