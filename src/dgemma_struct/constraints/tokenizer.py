"""Build (and cache) the llguidance ``LLTokenizer`` for a Hugging Face tokenizer.

A fast tokenizer (``PreTrainedTokenizerFast``, e.g. Gemma 4's ``GemmaTokenizer``) goes through
``llguidance.hf.from_tokenizer`` itself, so token bytes *and* which ids are special are llguidance's
own, id for id: only tokens flagged ``special`` in the tokenizer are special (Gemma's ``\n``/``\t``
runs and HTML-tag pieces are ordinary text that masks allow). Special tokens can never be produced by
a JSON / regex / choice grammar. Slow (Python) tokenizers fall back to rebuilding the bytes from the
vocabulary (byte-level BPE or SentencePiece pieces) with the same rule for special ids.

The stop ids (EOS plus ``<turn|>`` / ``<end_of_turn>`` when present, or the runtime's
``eos_token_id`` list) are llguidance's EOS set. The scan is cached per tokenizer object (and per
``LLTokenizer``); a cache hit reads no vocabulary. :func:`vocab_scan` reads an ``LLTokenizer``'s
vocabulary once (special ids, closing tokens, single-byte tokens) for every info on it and for budget
closing. Text is encoded as text: added tokens' spellings (special or not) become ordinary pieces.
"""
from __future__ import annotations

import hashlib
import re
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Sequence

import llguidance as llg
from llguidance import TokenizerWrapper

from dgemma_struct.errors import ConstraintError

from .safety import engine_guard

__all__ = ["TokenizerInfo", "VocabScan", "vocab_scan", "get_tokenizer_info", "default_stop_token_ids",
           "tokenizer_from_tiktoken"]

#: turn-end tokens that also stop an answer when present in the vocabulary (Gemma 4, Gemma 3)
TURN_END_TOKENS = ("<turn|>", "<end_of_turn>")


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode   # GPT-2's byte <-> character table
    return {c: b for b, c in bytes_to_unicode().items()}


@dataclass(frozen=True)
class TokenizerInfo:
    """An llguidance tokenizer plus the facts the constraint layer needs about it."""

    lltok: Any  # llguidance.LLTokenizer
    vocab_size: int  # mask width in tokens (>= tokenizer length; model vocab when given)
    stop_token_ids: tuple[int, ...]
    special_token_ids: frozenset[int]  # every special id (including stop ids)
    key: str  # stable cache key (vocab hash + options)
    hf_tokenizer: Any = field(default=None, compare=False, repr=False)  # for encoding text

    def tokenize(self, text: str) -> list[int]:
        """Ids of ``text`` with every added token's spelling (``"<eos>"``, an ordinary ``"<table>"``) as text."""
        hf = self.hf_tokenizer
        if hf is None:
            with engine_guard("tokenizing a text"):
                return self.lltok.tokenize_str(text, parse_special=False)
        backend = getattr(hf, "backend_tokenizer", None)
        if backend is not None and _holds_added_token(hf, text):  # split_special_tokens splits special ones only
            return _encode_without_added(backend, text)
        try:
            return list(hf.encode(text, add_special_tokens=False, split_special_tokens=True))
        except TypeError:  # a tokenizer without split_special_tokens
            return list(hf.encode(text, add_special_tokens=False))

    @property
    def eos_token_id(self) -> int:
        return self.stop_token_ids[0]

    @property
    def forbidden_token_ids(self) -> frozenset[int]:
        """Special ids that a mask must never allow (everything special except stop ids)."""
        return self.special_token_ids - frozenset(self.stop_token_ids)


def _holds_added_token(hf_tokenizer: Any, text: str) -> bool:
    """True when ``text`` spells the content of one of the tokenizer's added tokens (special or not)."""
    facts = _per_object(hf_tokenizer)
    if "added" not in facts:
        contents = sorted(map(str, getattr(hf_tokenizer, "get_added_vocab", dict)()), key=len, reverse=True)
        facts["added"] = re.compile("|".join(map(re.escape, contents))) if contents else None
    return facts["added"] is not None and facts["added"].search(text) is not None


def _encode_without_added(backend: Any, text: str) -> list[int]:
    """Ids of ``text`` through the backend's normalizer, pre-tokenizer and model only (no added-token match)."""
    norm = backend.normalizer.normalize_str(text) if backend.normalizer is not None else text
    pieces = backend.pre_tokenizer.pre_tokenize_str(norm) if backend.pre_tokenizer is not None else [(norm, None)]
    return [t.id for piece, _ in pieces for t in backend.model.tokenize(piece)]


def default_stop_token_ids(hf_tokenizer: Any) -> list[int]:
    """The tokenizer's eos id(s), then ``<turn|>`` (Gemma 4) and ``<end_of_turn>`` (Gemma 3) when
    they are in the vocabulary. A runtime with a generation config passes its own
    ``eos_token_id`` list instead (e.g. ``[1, 106, 50]``)."""
    ids: list[int] = []
    eos = getattr(hf_tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.append(eos)
    elif isinstance(eos, (list, tuple)):
        ids.extend(int(x) for x in eos)
    try:
        vocab = hf_tokenizer.get_vocab()
    except Exception:  # pragma: no cover
        vocab = {}
    for name in TURN_END_TOKENS:
        tid = vocab.get(name)
        if tid is not None and tid not in ids:
            ids.append(int(tid))
    if not ids:
        raise ConstraintError("tokenizer has no eos_token_id; pass stop_token_ids=")
    return ids


def _special_ids(hf_tokenizer: Any) -> set[int]:
    """Ids flagged special: added tokens with ``special=True`` and the named special tokens (never
    the ordinary added pieces such as Gemma's ``\n`` runs)."""
    ids: set[int] = set()
    try:
        for tid, tok in hf_tokenizer.added_tokens_decoder.items():
            if getattr(tok, "special", True):
                ids.add(int(tid))
    except Exception:
        pass
    for tid in getattr(hf_tokenizer, "all_special_ids", []) or []:
        if tid is not None:
            ids.add(int(tid))
    return ids


def _token_bytes(hf_tokenizer: Any, specials: set[int]) -> list[bytes] | None:
    vocab: dict[str, int] = hf_tokenizer.get_vocab()
    n = max(vocab.values()) + 1 if vocab else 0
    n = max(n, len(hf_tokenizer))
    strs: list[str | None] = [None] * n
    for s, i in vocab.items():
        strs[i] = s
    normal = [s for i, s in enumerate(strs) if s is not None and i not in specials]
    bd = _byte_decoder()
    sample = normal[: 5000]
    byte_level = sample and all(all(ch in bd for ch in s) for s in sample)
    sentencepiece = not byte_level and any("▁" in s for s in sample)
    if not byte_level and not sentencepiece:
        return None
    out: list[bytes] = []
    for i, s in enumerate(strs):
        if s is None:
            out.append(b"\xff<unused_%d>" % i)
            specials.add(i)
        elif i in specials:
            out.append(b"\xff" + s.encode("utf-8"))
        elif byte_level:
            try:
                out.append(bytes(bd[ch] for ch in s))
            except KeyError:  # a stray non-byte-level added token
                out.append(s.encode("utf-8"))
        else:
            if len(s) == 6 and s.startswith("<0x") and s.endswith(">"):
                try:
                    out.append(bytes([int(s[3:5], 16)]))
                    continue
                except ValueError:
                    pass
            out.append(s.replace("▁", " ").encode("utf-8"))
    return out


class _Wrapper(TokenizerWrapper):
    """The tokenizer object ``llguidance.LLTokenizer`` accepts, built from raw token bytes."""

    def __init__(self, hf_tokenizer: Any, tokens: list[bytes], specials: Sequence[int], eos: int):
        self.is_tokenizer_wrapper = True
        self._accepts_bytes = False
        self._gtokenizer = self
        self.eos_token_id = eos
        self.bos_token_id = getattr(hf_tokenizer, "bos_token_id", None)
        self.tokens = tokens
        self.special_token_ids = sorted(specials)
        self._hf = hf_tokenizer

    def _encode_string(self, s: Any) -> list[int]:
        if isinstance(s, bytes):
            s = s.decode("utf-8", errors="replace")
        return self._hf.encode(s, add_special_tokens=False)

    __call__ = _encode_string


_lock = threading.Lock()
_by_id: dict[int, tuple[Any, dict]] = {}  # id(hf) -> (weakref, {"hash": vocab hash, "stops": default stop ids})
_infos: "OrderedDict[tuple, TokenizerInfo]" = OrderedDict()


def _per_object(hf_tokenizer: Any) -> dict:
    """Facts cached for one tokenizer *object* (its vocabulary hash, its default stop ids): a cache hit
    never reads the 262k-entry vocabulary again. Dropped when the tokenizer is collected."""
    key = _by_id.get(id(hf_tokenizer))
    if key is not None and key[0]() is hf_tokenizer:
        return key[1]
    try:
        ref = weakref.ref(hf_tokenizer, lambda _r, k=id(hf_tokenizer): _by_id.pop(k, None))
    except TypeError:  # not weak-referenceable: keep a strong reference
        ref = (lambda obj: (lambda: obj))(hf_tokenizer)
    facts: dict = {}
    _by_id[id(hf_tokenizer)] = (ref, facts)
    return facts


def _vocab_hash(hf_tokenizer: Any) -> str:
    facts = _per_object(hf_tokenizer)
    digest = facts.get("hash")
    if digest is None:
        h = hashlib.sha1()
        vocab = hf_tokenizer.get_vocab()
        for s, i in sorted(vocab.items(), key=lambda kv: kv[1]):
            h.update(b"%d:" % i)
            h.update(s.encode("utf-8", "surrogatepass"))
        h.update(repr(sorted(_special_ids(hf_tokenizer))).encode())
        digest = facts["hash"] = h.hexdigest()[:16]
    return digest


def _default_stops(hf_tokenizer: Any) -> list[int]:
    """:func:`default_stop_token_ids`, once per tokenizer object (it reads the whole vocabulary)."""
    facts = _per_object(hf_tokenizer)
    stops = facts.get("stops")
    if stops is None:
        stops = facts["stops"] = default_stop_token_ids(hf_tokenizer)
    return list(stops)


@dataclass(frozen=True)
class VocabScan:
    """What one pass over an ``LLTokenizer``'s vocabulary tells (:func:`vocab_scan`): the ids llguidance
    flags special, the closing tokens (made only of ``"``, ``]``, ``}`` and either led by ``"`` or
    without one: ``(id, length, led by a quote)``, by id) and, per byte value, the non-special ids
    whose bytes are that one byte."""

    specials: frozenset[int]
    closers: tuple[tuple[int, int, bool], ...]
    single_bytes: dict[int, tuple[int, ...]]


_scans: "OrderedDict[int, tuple[Any, VocabScan]]" = OrderedDict()  # id(lltok) -> (lltok kept alive, scan)
_scan_lock = threading.Lock()
_CLOSER_BYTES = b'"]}'


def _scan(lltok: Any) -> VocabScan:
    """The one pass over the vocabulary behind :func:`vocab_scan`."""
    with engine_guard("reading the tokenizer"):
        n = int(lltok.vocab_size)
        is_special, dec = lltok.is_special_token, lltok.decode_bytes
        specials = frozenset(i for i in range(n) if is_special(i))
        closers: list[tuple[int, int, bool]] = []
        single: dict[int, list[int]] = {}
        for t in range(n):
            bs = dec([t])
            if len(bs) == 1:
                if t not in specials:
                    single.setdefault(bs[0], []).append(t)
                    if bs[0] in _CLOSER_BYTES:
                        closers.append((t, 1, bs[0] == 34))
            elif bs and not bs.translate(None, _CLOSER_BYTES) and t not in specials and \
                    (bs[0] == 34 or 34 not in bs):  # `"`-led, or no `"` at all
                closers.append((t, len(bs), bs[0] == 34))
    return VocabScan(specials, tuple(closers), {b: tuple(ids) for b, ids in single.items()})


def vocab_scan(lltok: Any) -> VocabScan:
    """The :class:`VocabScan` of ``lltok``, read once per ``LLTokenizer`` object (about 0.1 s for a
    262k vocabulary) and shared by every :class:`TokenizerInfo` built on it. A tokenizer's info is
    built with it, so budget closing never pays the scan on a request."""
    with _scan_lock:
        hit = _scans.get(id(lltok))
        if hit is not None and hit[0] is lltok:
            _scans.move_to_end(id(lltok))
            return hit[1]
    scan = _scan(lltok)
    with _scan_lock:
        _scans[id(lltok)] = (lltok, scan)
        while len(_scans) > 16:
            _scans.popitem(last=False)
    return scan


def _is_fast(hf_tokenizer: Any) -> bool:
    from transformers import PreTrainedTokenizerFast
    return isinstance(hf_tokenizer, PreTrainedTokenizerFast)


def _check_stops(stops: tuple[int, ...], n: int) -> None:
    if not stops:
        raise ConstraintError("stop_token_ids must not be empty")
    bad = [t for t in stops if t < 0 or t >= n]
    if bad:
        raise ConstraintError(f"stop token id {bad[0]} is outside the vocabulary (0..{n - 1})")


def get_tokenizer_info(hf_tokenizer: Any, stop_token_ids: Sequence[int] | None = None,
                       vocab_size: int | None = None) -> TokenizerInfo:
    """Return the (cached) :class:`TokenizerInfo` for ``hf_tokenizer``.

    ``hf_tokenizer`` may also be a :class:`TokenizerInfo` (returned as is) or an
    ``llguidance.LLTokenizer`` (wrapped; its EOS set is used as the stop ids)."""
    if isinstance(hf_tokenizer, TokenizerInfo):
        return hf_tokenizer
    if isinstance(hf_tokenizer, llg.LLTokenizer):
        return _info_from_lltok(hf_tokenizer, stop_token_ids)
    if not hasattr(hf_tokenizer, "get_vocab"):
        raise ConstraintError(f"not a tokenizer: {type(hf_tokenizer).__name__} (pass a Hugging Face tokenizer, "
                              f"an llguidance.LLTokenizer or a TokenizerInfo)")
    if vocab_size is not None and (isinstance(vocab_size, bool) or not isinstance(vocab_size, int)
                                   or vocab_size <= 0):
        raise ConstraintError(f"vocab_size must be a positive int, not {vocab_size!r}")
    with _lock:
        try:
            stops = tuple(int(x) for x in (stop_token_ids if stop_token_ids is not None
                                           else _default_stops(hf_tokenizer)))
        except (TypeError, ValueError) as e:
            raise ConstraintError(f"stop_token_ids must be a list of ints: {e}") from None
        vh = _vocab_hash(hf_tokenizer)
        ck = (vh, stops, vocab_size)
        info = _infos.get(ck)
        if info is not None:
            _infos.move_to_end(ck)
            if info.hf_tokenizer is not hf_tokenizer:  # an equal tokenizer: encode with this one
                info = TokenizerInfo(info.lltok, info.vocab_size, info.stop_token_ids, info.special_token_ids,
                                     info.key, hf_tokenizer)
            return info
        n_tok = max(len(hf_tokenizer), max(hf_tokenizer.get_vocab().values(), default=-1) + 1)
        _check_stops(stops, max(n_tok, vocab_size or 0))
        if _is_fast(hf_tokenizer):
            from llguidance.hf import from_tokenizer
            with engine_guard("reading the tokenizer"):
                lltok = from_tokenizer(hf_tokenizer, n_vocab=max(vocab_size or 0, n_tok), eos_token=list(stops))
            specials = set(vocab_scan(lltok).specials) | set(stops)
        else:
            specials = _special_ids(hf_tokenizer)
            tokens = _token_bytes(hf_tokenizer, specials)
            if tokens is None:
                raise ConstraintError(f"unsupported tokenizer {type(hf_tokenizer).__name__}: use a fast tokenizer")
            specials |= set(stops)
            n = len(tokens)
            if vocab_size is not None and vocab_size > n:
                tokens = tokens + [b"\xff<pad_vocab_%d>" % i for i in range(n, vocab_size)]
                specials |= set(range(n, vocab_size))
            with engine_guard("reading the tokenizer"):
                lltok = llg.LLTokenizer(_Wrapper(hf_tokenizer, tokens, sorted(specials), stops[0]),
                                        eos_token=list(stops))
            vocab_scan(lltok)  # the closing candidates, read once now (never on a request)
        info = TokenizerInfo(lltok=lltok, vocab_size=int(lltok.vocab_size), stop_token_ids=stops,
                             special_token_ids=frozenset(specials), key=f"{vh}:{stops}:{vocab_size}",
                             hf_tokenizer=hf_tokenizer)
        if len(_infos) >= 16:
            _infos.popitem(last=False)
        _infos[ck] = info
        return info


_by_lltok: "OrderedDict[tuple, TokenizerInfo]" = OrderedDict()  # (id(lltok), stops) -> info (lltok kept alive)


def _info_from_lltok(lltok: Any, stop_token_ids: Sequence[int] | None) -> TokenizerInfo:
    stops = tuple(int(x) for x in (stop_token_ids or lltok.eos_tokens or [lltok.eos_token]))
    with _lock:
        ck = (id(lltok), stops)
        info = _by_lltok.get(ck)
        if info is not None and info.lltok is lltok:
            _by_lltok.move_to_end(ck)
            return info
    if set(stops) != set(lltok.eos_tokens):
        raise ConstraintError("for an LLTokenizer, stop_token_ids must equal its eos_tokens")
    specials = vocab_scan(lltok).specials | set(stops)
    info = TokenizerInfo(lltok=lltok, vocab_size=int(lltok.vocab_size), stop_token_ids=stops,
                         special_token_ids=frozenset(specials), key=f"lltok:{id(lltok)}:{stops}")
    with _lock:
        if len(_by_lltok) >= 16:
            _by_lltok.popitem(last=False)
        _by_lltok[ck] = info
    return info


def tokenizer_from_tiktoken(encoding: Any, stop_token_ids: Sequence[int] | None = None) -> TokenizerInfo:
    """A :class:`TokenizerInfo` from a ``tiktoken.Encoding`` (used by the benchmarks)."""
    from llguidance.tiktoken import lltokenizer_from_encoding
    stops = list(stop_token_ids) if stop_token_ids else [encoding.eot_token]
    lltok = lltokenizer_from_encoding(encoding, eos_token=stops)
    return _info_from_lltok(lltok, stops)
