"""``compile_constraint``: turn a spec (pydantic model, JSON Schema, Regex, Grammar, Choice, Literal,
Enum, plain python type, Outlines type) into a :class:`Constraint` bound to a tokenizer."""
from __future__ import annotations

import enum
import hashlib
import json
import os
import re
import threading
import typing
from collections import OrderedDict, namedtuple
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import llguidance as llg

from dgemma_struct.errors import (ChoiceError, ConstraintCompileTimeout, ConstraintError, GrammarError,
                                  RegexError, SchemaError)

from .safety import MAX_SPEC_BYTES, check_schema_input, clip, engine_guard

from .json_schema import JsonPlan, iter_issues, make_validator, prepare_json_schema
from .specs import Choice, Grammar, JsonSchema, Regex
from .tokenizer import TokenizerInfo, get_tokenizer_info

__all__ = ["Constraint", "ValidationIssue", "ValidationOutcome", "compile_constraint", "cache_info",
           "cache_clear", "builtin_grammars"]

_LIMITS_KW = dict(max_grammar_size=500_000, initial_lexer_fuel=2_000_000, max_lexer_states=250_000)


def _limits() -> Any:
    return llg.LLParserLimits(**_LIMITS_KW)


@dataclass(frozen=True)
class ValidationIssue:
    path: tuple
    message: str

    def __str__(self) -> str:
        loc = "/".join(str(p) for p in self.path)
        return f"{loc or '<root>'}: {self.message}"


@dataclass
class ValidationOutcome:
    ok: bool
    value: Any = None
    errors: list[ValidationIssue] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.ok


class Constraint:
    """A compiled output constraint bound to one tokenizer.

    Attributes: ``kind`` ("json" | "regex" | "grammar" | "choice"), ``schema`` (json kinds),
    ``semantic_keywords`` (enforced by validation only), ``grammar`` (llguidance grammar string),
    ``vocab_size``, ``stop_token_ids``, ``tokenizer_info``.
    """

    def __init__(self, kind: str, grammar: str, info: TokenizerInfo, *, schema: Any = None,
                 semantic_keywords: Sequence[str] = (), validator: Any = None, pydantic_adapter: Any = None,
                 may_allow_specials: bool = False, description: str = "", template: Any = None):
        self.kind = kind
        self.grammar = grammar
        self.tokenizer_info = info
        self.schema = schema
        self.semantic_keywords = list(semantic_keywords)
        self._validator = validator
        self._adapter = pydantic_adapter
        self.description = description
        with engine_guard(f"compiling the {kind} constraint"):
            # ``template``: the matcher the compile step already built for this grammar (compiled once)
            self._template = template if template is not None else \
                llg.LLMatcher(info.lltok, grammar, log_level=0, limits=_limits())
            failed = self._template.is_error()
            err = self._template.get_error() if failed else ""
        if failed:
            exc = ConstraintCompileTimeout if _is_limit(err) else {
                "json": SchemaError, "regex": RegexError, "grammar": GrammarError, "choice": ChoiceError}[kind]
            raise exc(f"cannot compile the {kind} constraint: {clip(err)}")
        # special tokens a grammar could reference (lark ``<[id]>``) but a mask must never allow
        self.may_allow_specials = may_allow_specials

    # -- basic facts -------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.tokenizer_info.vocab_size

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return self.tokenizer_info.stop_token_ids

    @property
    def eos_token_id(self) -> int:
        return self.tokenizer_info.stop_token_ids[0]

    def new_matcher(self) -> Any:
        """A fresh ``llguidance.LLMatcher`` at the start state."""
        with engine_guard("copying a matcher"):
            return self._template.deep_copy()

    def canvas_walker(self) -> "CanvasWalker":
        from .canvas_mask import CanvasWalker
        return CanvasWalker(self)

    def __repr__(self) -> str:
        return f"Constraint(kind={self.kind!r}, {self.description}, semantic_keywords={self.semantic_keywords})"

    # -- checking text -----------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token spellings in it (``"<eos>"``) are encoded as text."""
        return self.tokenizer_info.tokenize(text)

    def grammar_accepts(self, text: str) -> bool:
        """Would the grammar accept exactly ``text`` followed by EOS?"""
        m = self.new_matcher()
        toks = self.tokenize(text)
        with engine_guard("checking a text against the constraint"):
            if not m.consume_tokens(toks):
                return False
            return bool(m.consume_token(self.eos_token_id)) and not m.is_error()

    def validate_text(self, text: str) -> ValidationOutcome:
        """Semantic validation of a finished output (see module docs)."""
        if self.kind == "json":
            try:
                value = json.loads(text, parse_float=_finite_float, parse_constant=_no_constant)
            except (ValueError, RecursionError) as e:
                return ValidationOutcome(False, None, [ValidationIssue((), f"invalid JSON: {clip(e, 300)}")])
            issues = [ValidationIssue(p, msg) for p, msg in iter_issues(self._validator, value)]
            if issues:
                return ValidationOutcome(False, value, issues)
            if self._adapter is not None:
                try:
                    value = self._adapter.validate_json(text)
                except Exception as e:  # pydantic.ValidationError
                    errs = getattr(e, "errors", None)
                    if callable(errs):
                        return ValidationOutcome(False, value, [
                            ValidationIssue(tuple(d.get("loc", ())), d.get("msg", "")) for d in errs()])
                    return ValidationOutcome(False, value, [ValidationIssue((), str(e))])
            return ValidationOutcome(True, value, [])
        if self.kind == "choice":
            ok = text in self._validator
            return ValidationOutcome(ok, text, [] if ok else [ValidationIssue((), f"{text!r} is not one of the choices")])
        ok = self.grammar_accepts(text)
        return ValidationOutcome(ok, text, [] if ok else [ValidationIssue((), f"text does not match the {self.kind}")])

    def matches(self, text: str) -> bool:
        """True iff ``text`` is accepted by the grammar AND passes semantic validation."""
        if self.kind in ("regex", "grammar"):
            return self.grammar_accepts(text)
        return self.grammar_accepts(text) and self.validate_text(text).ok


def _finite_float(s: str) -> float:
    """JSON number -> float, refusing numbers beyond the IEEE double range (``3e616`` would become inf)."""
    f = float(s)
    if f != f or f in (float("inf"), float("-inf")):
        raise ValueError(f"number {clip(s, 60)} is outside the IEEE double range")
    return f


def _no_constant(s: str) -> Any:
    raise ValueError(f"{s} is not JSON")


def _is_limit(msg: str) -> bool:
    low = msg.lower()
    return any(w in low for w in ("limit", "fuel", "too many", "too complex", "too large"))


# ----------------------------------------------------------------------------------------------
# spec normalisation
# ----------------------------------------------------------------------------------------------
_GRAMMAR_DIR = Path(__file__).resolve().parents[3] / "grammars"


def builtin_grammars() -> dict[str, Path]:
    """Name -> path of the built-in ``.lark`` grammars shipped in :mod:`dgemma_struct.grammars`."""
    dirs = []
    try:
        import dgemma_struct.grammars as gpkg  # type: ignore
        dirs.extend(Path(p) for p in getattr(gpkg, "__path__", []))
    except Exception:
        pass
    dirs.append(_GRAMMAR_DIR)
    out: dict[str, Path] = {}
    for d in dirs:
        if d.is_dir():
            for p in sorted(d.glob("*.lark")):
                out.setdefault(p.stem, p)
    return out


def _is_pydantic_model(spec: Any) -> bool:
    try:
        from pydantic import BaseModel
    except ImportError:  # pragma: no cover
        return False
    return isinstance(spec, type) and issubclass(spec, BaseModel)


def _outlines_to_spec(spec: Any) -> Any:
    """Map Outlines output types (when outlines is importable) to our specs; None if not one."""
    try:
        import outlines  # noqa: F401
    except ImportError:
        return None
    try:  # outlines >= 1.0
        from outlines.types import CFG, JsonSchema as OJsonSchema, Regex as ORegex  # type: ignore
        from outlines.types.dsl import Term, to_regex  # type: ignore
    except Exception:  # pragma: no cover
        return None
    if isinstance(spec, ORegex):
        return Regex(spec.pattern)
    if isinstance(spec, OJsonSchema):
        return JsonSchema(spec.schema)
    if isinstance(spec, CFG):
        return Grammar(spec.definition)
    if isinstance(spec, Term):
        return Regex(to_regex(spec))
    return None


_TypeSpec = namedtuple("_TypeSpec", "schema adapter")


def _type_spec(spec: Any) -> Any:
    """Literal / Enum / python types -> Choice or (schema, TypeAdapter)."""
    origin = typing.get_origin(spec)
    if origin is typing.Literal:
        args = typing.get_args(spec)
        if args and all(isinstance(a, str) for a in args):
            return Choice(list(args))
    if isinstance(spec, type) and issubclass(spec, enum.Enum):
        vals = [m.value for m in spec]
        if vals and all(isinstance(v, str) for v in vals):
            return Choice(vals)
    from pydantic import TypeAdapter
    try:
        ad = TypeAdapter(spec)
        schema = ad.json_schema()
    except Exception as e:
        raise SchemaError(f"cannot derive a JSON Schema from {spec!r}: {e}") from None
    return _TypeSpec(schema, ad)


def _canon(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=repr)


# ----------------------------------------------------------------------------------------------
# compile
# ----------------------------------------------------------------------------------------------
def _compile_regex(pattern: str, info: TokenizerInfo) -> Constraint:
    if not isinstance(pattern, str):
        raise RegexError(f"a regex must be a string, not {type(pattern).__name__}")
    if len(pattern.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        raise RegexError(f"regex too long: more than {MAX_SPEC_BYTES} bytes")
    if "\x00" in pattern:
        raise RegexError("regex contains a NUL character")
    with engine_guard("compiling a regex"):
        g = llg.LLMatcher.grammar_from_regex(pattern)
        m = llg.LLMatcher(info.lltok, g, log_level=0, limits=_limits())
        err = m.get_error() if m.is_error() else ""
    if err:
        if _is_limit(err):
            raise ConstraintCompileTimeout(f"regex exceeds the compile limits: {clip(err)}")
        raise RegexError(f"invalid regex {clip(repr(pattern), 200)}: {clip(err.strip())}")
    return Constraint("regex", g, info, description=f"regex={clip(repr(pattern), 200)}", template=m)


def _lark_error(e: Exception) -> str:
    line = getattr(e, "line", None)
    col = getattr(e, "column", None)
    loc = f" (line {line}, column {col})" if line not in (None, -1) else ""
    return f"{type(e).__name__}{loc}: {clip(str(e).strip())}"


_IMPORT = re.compile(r"(?m)^[ \t]*%import[ \t]+(\S*)")


def _check_imports(text: str) -> None:
    """``%import`` may name Lark's bundled ``common`` terminals only: anything else would make the Lark
    parser read files from disk (relative paths, import paths) and echo their lines in errors."""
    for m in _IMPORT.finditer(text):
        mod = m.group(1)
        if not mod.startswith("common."):
            line = text.count("\n", 0, m.start()) + 1
            raise GrammarError(f"%import of {clip(mod, 80)!r} at line {line} is not allowed: grammars may import "
                               f"only Lark's common terminals (%import common.NAME); inline the rules instead")


_GBNF_RULE = re.compile(r"(?m)^[ \t]*[A-Za-z_][\w-]*[ \t]*::=")


_LARK_RULE = re.compile(r"(?m)^[ \t]*(%llguidance\b|[?!]?[A-Za-z_][\w.]*(\.\d+)?[ \t]*:(?!:=))")


def _is_gbnf(text: str) -> bool:
    """GBNF / EBNF (llama.cpp, vLLM's ``grammar``): rules written ``name ::= ...`` and no Lark rule."""
    return bool(_GBNF_RULE.search(text)) and not _LARK_RULE.search(text)


def _gbnf_to_lark(text: str) -> str:
    """llguidance's own GBNF converter; its errors become :class:`GrammarError` with line/column."""
    from llguidance.gbnf_to_lark import GbnfToLarkError, gbnf_to_lark
    try:
        return gbnf_to_lark(text)
    except GbnfToLarkError as e:
        pos = getattr(getattr(e, "pos", None), "pos", None)
        msg = str(e.args[0]) if e.args else str(e)
        msg = msg.split(" at line ", 1)[0]
        if isinstance(pos, int):
            line = text.count("\n", 0, pos) + 1
            col = pos - (text.rfind("\n", 0, pos) + 1) + 1
            near = text[pos: pos + 20]
            raise GrammarError(f"invalid GBNF grammar (line {line}, column {col}): {clip(msg, 200)} "
                               f"near {clip(repr(near), 60)}") from None
        raise GrammarError(f"invalid GBNF grammar: {clip(msg)}") from None
    except RecursionError:
        raise GrammarError("invalid GBNF grammar: nested too deeply") from None
    except Exception as e:  # noqa: BLE001 - the converter raises bare Exception for unknown rules / no root
        raise GrammarError(f"invalid GBNF grammar: {clip(e)}") from None


_LLG_DIALECT = re.compile(r'%json|%llguidance|%regex|%lark|<\[|<[A-Za-z_|]+>|max_tokens|""|\[lazy|stop\s*=')


def _compile_grammar(spec: Grammar, info: TokenizerInfo) -> Constraint:
    src = spec.source
    text: str
    if isinstance(src, Path) or (isinstance(src, str) and src.endswith((".lark", ".gbnf", ".ebnf"))
                                 and "\n" not in src):
        p = Path(src)
        if not p.is_file():
            raise GrammarError(f"grammar file not found: {clip(str(p), 200)}")
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise GrammarError(f"cannot read the grammar file {clip(str(p), 200)}: {clip(e, 200)}") from None
    elif isinstance(src, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", src.strip()) and \
            src.strip() in builtin_grammars():
        text = builtin_grammars()[src.strip()].read_text()
    elif isinstance(src, str):
        text = src
    else:
        raise GrammarError(f"Grammar source must be text or a path, not {type(src).__name__}")
    if not text.strip():
        raise GrammarError("empty grammar")
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        raise GrammarError(f"grammar too long: more than {MAX_SPEC_BYTES} bytes")
    if "\x00" in text:
        raise GrammarError("grammar contains a NUL character")
    gbnf = _is_gbnf(text)
    if gbnf:
        text = _gbnf_to_lark(text)
    else:
        _check_imports(text)
    start = spec.start or "start"
    import lark
    lark_err: Exception | None = None
    try:
        lark.Lark(text, start=start, parser="earley")
    except Exception as e:  # lark.exceptions.GrammarError / UnexpectedInput / ...
        lark_err = e
    lltext = text
    if start != "start" and not re.search(r"(?m)^\s*start\s*:", text):
        lltext = f"start: {start}\n" + text
    with engine_guard("compiling a grammar"):
        g = llg.LLMatcher.grammar_from_lark(lltext)
        m = llg.LLMatcher(info.lltok, g, log_level=0, limits=_limits())
        err = m.get_error() if m.is_error() else ""
    if lark_err is not None and (err or not _LLG_DIALECT.search(text)):
        # stock lark rejects it and it uses no llguidance-only syntax: report lark's line/column
        raise GrammarError(f"invalid Lark grammar: {_lark_error(lark_err)}")
    if err:
        if _is_limit(err):
            raise ConstraintCompileTimeout(f"grammar exceeds the compile limits: {clip(err)}")
        what = "GBNF grammar (converted to Lark)" if gbnf else "Lark grammar"
        raise GrammarError(f"{what} not supported by the constrained decoder: {clip(err.strip())}")
    # lark_err but llguidance accepted: llguidance dialect (e.g. %json, <[id]>, lazy "" terminals)
    may_specials = "<" in text
    return Constraint("grammar", g, info, may_allow_specials=may_specials,
                      description="gbnf grammar" if gbnf else "lark grammar", template=m)


def _compile_choice(spec: Choice, info: TokenizerInfo) -> Constraint:
    ch = spec.choices
    if not isinstance(ch, (list, tuple)):
        raise ChoiceError(f"choices must be a list of strings, not {type(ch).__name__}")
    if not ch:
        raise ChoiceError("choice list is empty")
    for c in ch:
        if not isinstance(c, str):
            raise ChoiceError(f"choices must be strings; got {c!r} ({type(c).__name__})")
        if not c:
            raise ChoiceError("choices must be non-empty strings")
    if sum(len(c.encode("utf-8", "surrogatepass")) for c in ch) > MAX_SPEC_BYTES:
        raise ChoiceError(f"choices too long: more than {MAX_SPEC_BYTES} bytes in all")
    for c in ch:
        try:
            c.encode("utf-8")
        except UnicodeEncodeError:
            raise ChoiceError(f"choice {clip(repr(c), 80)} is not valid Unicode (lone surrogate)") from None
    uniq = list(dict.fromkeys(ch))
    lark_text = "start: " + " | ".join(json.dumps(c) for c in uniq)
    with engine_guard("compiling the choices"):
        g = llg.LLMatcher.grammar_from_lark(lark_text)
        m = llg.LLMatcher(info.lltok, g, log_level=0, limits=_limits())
        err = m.get_error() if m.is_error() else ""
    if err:
        if _is_limit(err):
            raise ConstraintCompileTimeout(f"choices exceed the compile limits: {clip(err)}")
        raise ChoiceError(f"cannot compile the choices: {clip(err.strip())}")
    c = Constraint("choice", g, info, validator=frozenset(uniq), description=f"{len(uniq)} choices", template=m)
    c.choices = uniq
    return c


def _compile_json(schema: Any, info: TokenizerInfo, *, strict: bool, whitespace: str,
                  separators: tuple[str, str] | None, adapter: Any = None, desc: str = "json schema",
                  checked: bool = False) -> Constraint:
    plan: JsonPlan = prepare_json_schema(schema, info.lltok, strict=strict, whitespace=whitespace,
                                         separators=separators, limits=_limits(), checked=checked)
    return Constraint("json", plan.grammar, info, schema=plan.schema, semantic_keywords=plan.semantic_keywords,
                      validator=make_validator(plan.schema), pydantic_adapter=adapter, description=desc,
                      template=plan.matcher)


def _normalise(spec: Any) -> tuple[str, Any, Any, str]:
    """-> (kind, payload, adapter, cache-key)."""
    if isinstance(spec, Regex):
        return "regex", spec.pattern, None, "regex:" + repr(spec.pattern)
    if isinstance(spec, Grammar):
        src = spec.source
        key = str(src) if isinstance(src, str) else f"path:{src}"
        if isinstance(src, Path) or (isinstance(src, str) and src.endswith(".lark") and Path(src).exists()):
            try:
                key = "path:" + hashlib.sha1(Path(src).read_bytes()).hexdigest()
            except OSError:
                pass
        return "grammar", spec, None, f"grammar:{spec.start}:{key}"
    if isinstance(spec, Choice):
        return "choice", spec, None, "choice:" + _canon(list(spec.choices) if isinstance(spec.choices, (list, tuple))
                                                         else repr(spec.choices))
    if isinstance(spec, JsonSchema):
        d = spec.as_dict() if not isinstance(spec.schema, (str, bytes)) else spec.schema
        if isinstance(d, (str, bytes)):
            try:
                d = json.loads(d)
            except (ValueError, RecursionError) as e:
                raise SchemaError(f"schema is not valid JSON: {clip(e, 300)}") from None
        check_schema_input(d)
        return "json", d, None, "json:" + _canon(d)
    if isinstance(spec, (dict, bool)) and not isinstance(spec, type):
        check_schema_input(spec)
        return "json", spec, None, "json:" + _canon(spec)
    if isinstance(spec, (str, bytes)):
        raise ConstraintError("a bare string is ambiguous: wrap it as Regex(...), Grammar(...) or JsonSchema(...)")
    if isinstance(spec, (list, tuple)):
        return _normalise(Choice(list(spec)))
    if _is_pydantic_model(spec):
        from pydantic import TypeAdapter
        try:
            schema = spec.model_json_schema()
        except Exception as e:
            raise SchemaError(f"cannot derive a JSON Schema from {spec.__name__}: {e}") from None
        return "json", schema, TypeAdapter(spec), f"pydantic:{spec.__module__}.{spec.__qualname__}:{id(spec)}"
    o = _outlines_to_spec(spec)
    if o is not None:
        return _normalise(o)
    t = _type_spec(spec)
    if isinstance(t, Choice):
        return _normalise(t)
    return "json", t.schema, t.adapter, f"type:{spec!r}:{id(spec)}"


_cache: "OrderedDict[tuple, tuple[Constraint, int]]" = OrderedDict()  # key -> (constraint, estimated bytes)
_cache_lock = threading.Lock()
_CACHE_MAX = 128
#: the compile cache's memory bound (estimated bytes of the cached matchers); env DGEMMA_COMPILE_CACHE_BYTES
_CACHE_MAX_BYTES = int(os.environ.get("DGEMMA_COMPILE_CACHE_BYTES", str(512 * 2 ** 20)))
_stats = {"hits": 0, "misses": 0, "bytes": 0}
CacheInfo = namedtuple("CacheInfo", "hits misses maxsize currsize currbytes maxbytes")


def _estimate_bytes(c: Constraint) -> int:
    """Estimated memory of a compiled constraint: its llguidance grammar (lexer automata, parser
    tables) grows with the grammar text -- measured 12-140x its length for 300-500 KB schemas -- plus
    a fixed part."""
    return 256 * 1024 + 64 * len(c.grammar)


def cache_info() -> CacheInfo:
    return CacheInfo(_stats["hits"], _stats["misses"], _CACHE_MAX, len(_cache), _stats["bytes"], _CACHE_MAX_BYTES)


def cache_clear() -> None:
    with _cache_lock:
        _cache.clear()
        _stats["hits"] = _stats["misses"] = _stats["bytes"] = 0


def compile_constraint(spec: Any, tokenizer: Any = None, *, strict: bool = False, whitespace: str = "compact",
                       stop_token_ids: Sequence[int] | None = None, separators: tuple[str, str] | None = None,
                       vocab_size: int | None = None, use_cache: bool = True) -> Constraint:
    """Compile ``spec`` for ``tokenizer`` (a HF fast tokenizer, an ``LLTokenizer`` or a
    :class:`TokenizerInfo`).

    ``whitespace``: ``"compact"`` (default: no whitespace between JSON tokens) or ``"model"`` /
    ``"flexible"`` (JSON whitespace allowed where JSON allows it). ``separators``: override the
    ``(item, key)`` separators, e.g. ``(", ", ": ")``. ``vocab_size``: mask width when the model's
    embedding is larger than the tokenizer (extra ids are never allowed). Results are cached
    (LRU bounded by count and by estimated bytes, ``compile_constraint.cache_info()``)."""
    if tokenizer is None:
        raise ConstraintError("compile_constraint needs a tokenizer")
    info = get_tokenizer_info(tokenizer, stop_token_ids, vocab_size)
    kind, payload, adapter, key = _normalise(spec)
    ck = (key, info.key, strict, whitespace, tuple(separators) if separators else None)
    if use_cache:
        with _cache_lock:
            hit = _cache.get(ck)
            if hit is not None:
                _cache.move_to_end(ck)
                _stats["hits"] += 1
                return hit[0]
            _stats["misses"] += 1
    if kind == "regex":
        c = _compile_regex(payload, info)
    elif kind == "grammar":
        c = _compile_grammar(payload, info)
    elif kind == "choice":
        c = _compile_choice(payload, info)
    else:
        desc = getattr(spec, "__name__", "json schema")
        c = _compile_json(payload, info, strict=strict, whitespace=whitespace, separators=separators,
                          adapter=adapter, desc=desc, checked=adapter is None)  # _normalise checked dicts
    if use_cache:
        size = _estimate_bytes(c)
        if size <= _CACHE_MAX_BYTES:  # an entry larger than the whole cache is not kept
            with _cache_lock:
                old = _cache.pop(ck, None)
                if old is not None:
                    _stats["bytes"] -= old[1]
                _cache[ck] = (c, size)
                _stats["bytes"] += size
                while len(_cache) > _CACHE_MAX or _stats["bytes"] > _CACHE_MAX_BYTES:
                    _, (_, sz) = _cache.popitem(last=False)
                    _stats["bytes"] -= sz
    return c


compile_constraint.cache_info = cache_info  # type: ignore[attr-defined]
compile_constraint.cache_clear = cache_clear  # type: ignore[attr-defined]
