"""Compilers for the text kinds: regex, Lark / GBNF grammars (built-in ones by name) and choice lists.

Each checks its spec, compiles it with llguidance once (the matcher becomes the constraint's
template) and words the engine's refusals as the kind's typed error (:class:`RegexError`,
:class:`GrammarError`, :class:`ChoiceError`, or :class:`ConstraintCompileTimeout` for a limit).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

import llguidance as llg

from dgemma_struct.errors import ChoiceError, ConstraintCompileTimeout, GrammarError, RegexError

from .constraint import ChoiceValidator, Constraint, ConstraintKind
from .literals import lone_surrogate, regex_dialect_error, screen_lark_json
from .regex_ascii import ascii_classes
from .safety import MAX_SPEC_BYTES, clip, engine_guard, is_limit_error, parser_limits
from .specs import Choice, Grammar
from .tokenizer import TokenizerInfo

__all__ = ["builtin_grammars", "compile_regex", "compile_grammar", "compile_choice", "llg_only_syntax"]

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


def _screen_text(text: str, what: str, error: type[Exception], by_line: bool = False) -> None:
    """Refuse a regex / grammar text (``what``) over :data:`MAX_SPEC_BYTES`, with a NUL or a lone
    surrogate (placed by index, or ``by_line``) with ``error``."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        raise error(f"{what} too long: more than {MAX_SPEC_BYTES} bytes")
    if "\x00" in text:
        raise error(f"{what} contains a NUL character")
    bad = lone_surrogate(text)
    if bad is not None:
        at = f"line {text.count(chr(10), 0, bad) + 1}" if by_line else f"index {bad}"
        raise error(f"{what} is not valid Unicode: lone surrogate at {at}")


def _matcher(grammar: Callable[[], str], info: TokenizerInfo, doing: str) -> tuple[str, Any, str]:
    """(grammar, its llguidance matcher, the engine's error or ""), both built under one engine guard."""
    with engine_guard(doing):
        g = grammar()
        m = llg.LLMatcher(info.lltok, g, log_level=0, limits=parser_limits())
        return g, m, (m.get_error() if m.is_error() else "")


def _refuse_limit(err: str, what: str) -> None:
    """:class:`ConstraintCompileTimeout` when the engine's ``err`` is a compile limit (``what``: "regex exceeds")."""
    if is_limit_error(err):
        raise ConstraintCompileTimeout(f"{what} the compile limits: {clip(err)}")


def compile_regex(pattern: str, info: TokenizerInfo) -> Constraint:
    """A regex (Rust ``regex`` syntax, whole output must match); ``\\d \\w \\s`` and their negations
    are ASCII classes (:func:`~.regex_ascii.ascii_classes`), the rest is Rust's Unicode-aware syntax."""
    if not isinstance(pattern, str):
        raise RegexError(f"a regex must be a string, not {type(pattern).__name__}")
    _screen_text(pattern, "regex", RegexError)
    dialect_err = regex_dialect_error(pattern)
    if dialect_err is not None:  # llguidance reads some of these (a**, a trailing \\) as something else
        raise RegexError(f"invalid regex {clip(repr(pattern), 200)}: {clip(dialect_err, 300)}")
    # \d \w \s (and negations) as vLLM / xgrammar, Outlines and ECMA-262 read them: ASCII
    g, m, err = _matcher(lambda: llg.LLMatcher.grammar_from_regex(ascii_classes(pattern)), info, "compiling a regex")
    if err:
        _refuse_limit(err, "regex exceeds")
        raise RegexError(f"invalid regex {clip(repr(pattern), 200)}: {clip(err.strip())}")
    return Constraint(ConstraintKind.REGEX, g, info, description=f"regex={clip(repr(pattern), 200)}", template=m)


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
        return _regroup_stacked_quantifiers(gbnf_to_lark(text))
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


def _skip(lark: str, i: int) -> tuple[str, int] | None:
    """("comment", its end) for a ``//`` comment at ``i`` (to the end of the line), ("literal", its end)
    for a string or regex literal there (to its closing quote / slash, or the line's end); else None."""
    if lark.startswith("//", i):
        j = lark.find("\n", i)
        return "comment", len(lark) if j < 0 else j
    if lark[i] in "\"/":
        j, n = i + 1, len(lark)
        while j < n and lark[j] != lark[i] and lark[j] != "\n":
            j += 2 if lark[j] == "\\" else 1
        return "literal", j + 1
    return None


def _regroup_stacked_quantifiers(lark: str) -> str:
    """Put back the parentheses ``gbnf_to_lark`` (llguidance 1.9.1) drops around a quantified atom:
    ``root ::= ( [x]* )*`` comes out as ``/[x]/**``, which is not Lark; it becomes ``(/[x]/*)*``.
    String and regex literals are skipped, so a lazy ``*?`` inside a regex is left alone.

    >>> _regroup_stacked_quantifiers('start: /[x]/** "a+"?')
    'start: (/[x]/*)* "a+"?'
    """
    out: list[str] = []
    atom = -1  # index in ``out`` where the last atom starts
    stack: list[int] = []  # where the open groups start
    i, n = 0, len(lark)
    while i < n:
        ch = lark[i]
        skip = _skip(lark, i)
        if skip is not None:  # a comment (no atom) or a string / regex literal (an atom)
            atom = len(out) if skip[0] == "literal" else -1
            out.append(lark[i:skip[1]])
            i = skip[1]
            continue
        if ch in "*+?" and out and out[-1] in ("*", "+", "?") and atom >= 0:
            out.insert(atom, "(")
            out.append(")")
            atom = -1
        elif ch.isalnum() or ch == "_":
            if not (out and (out[-1][-1:].isalnum() or out[-1][-1:] == "_")):
                atom = len(out)
        elif ch == "(":
            stack.append(len(out))
        elif ch == ")":
            atom = stack.pop() if stack else -1
        elif ch not in "*+?":
            atom = -1
        out.append(ch)
        i += 1
    return "".join(out)


_LLG_DIALECT = re.compile(r'%json|%llguidance|%regex|%lark|<\[|<[A-Za-z_|]+>|max_tokens|""|\[lazy|stop\s*=')
_NEGATION = "~ (negation)"
_REPEAT = re.compile(r"\{\s*\d+\s*(,\s*\d*\s*)?\}")


def llg_only_syntax(text: str) -> list[str]:
    r"""The llguidance-only Lark constructs ``text`` uses outside its literals and comments: ``&``
    (intersection), ``~`` (negation; Lark's own ``x ~ 2..3`` repeat is not one), ``{m,n}`` (a bounded
    repeat of a rule or a terminal), plus the directives and attributes :data:`_LLG_DIALECT` finds.

    >>> llg_only_syntax('start: A\nA: /[a-z]+/ & ~"ab" // & in a comment\nB: "&{1,2}"{2,3}')
    ['& (intersection)', '~ (negation)', '{m,n} (bounded repeat)']
    """
    found: dict[str, None] = {}
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        skip = _skip(text, i)
        if skip is not None:  # a comment or a string / regex literal
            i = skip[1]
            continue
        if ch == "&":
            found["& (intersection)"] = None
        elif ch == "~" and not re.match(r"~\s*\d", text[i:i + 40]):
            found[_NEGATION] = None
        elif ch == "{" and _REPEAT.match(text, i):
            found["{m,n} (bounded repeat)"] = None
        i += 1
    m = _LLG_DIALECT.search(text)
    if m:
        found[m.group(0)] = None
    return list(found)


def compile_grammar(spec: Grammar, info: TokenizerInfo) -> Constraint:
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
    _screen_text(text, "grammar", GrammarError, by_line=True)
    gbnf = _is_gbnf(text)
    if gbnf:
        text = _gbnf_to_lark(text)
    else:
        _check_imports(text)
    screen_lark_json(text)
    start = spec.start or "start"
    if not isinstance(start, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", start):
        raise GrammarError(f"start must be a rule name, not {clip(repr(start), 80)}")
    import lark
    lark_err: Exception | None = None
    try:
        lark.Lark(text, start=start, parser="earley")
    except Exception as e:  # lark.exceptions.GrammarError / UnexpectedInput / ...
        lark_err = e
    lltext = text
    if start != "start" and not re.search(r"(?m)^\s*start\s*:", text):
        lltext = f"start: {start}\n" + text
    g, m, err = _matcher(lambda: llg.LLMatcher.grammar_from_lark(lltext), info, "compiling a grammar")
    dialect = llg_only_syntax(text) if lark_err is not None else []
    if lark_err is not None and not dialect:
        # stock lark rejects it and it uses no llguidance-only syntax: report lark's line/column
        raise GrammarError(f"invalid Lark grammar: {_lark_error(lark_err)}")
    if _NEGATION in dialect:  # llguidance 1.9.1: ~/a+/ then accepts "aa" + EOS (the EOS token's bytes match)
        raise GrammarError(f"Lark grammar using llguidance-only syntax ({_NEGATION}) not supported: a negated "
                           f"terminal also matches the end-of-text token, so its output could not be checked")
    if err:
        _refuse_limit(err, "grammar exceeds")
        what = "GBNF grammar (converted to Lark)" if gbnf else "Lark grammar"
        if dialect:  # name the construct: stock lark has no word for it, llguidance refused this use
            what += f" using llguidance-only syntax ({', '.join(dialect)})"
        raise GrammarError(f"{what} not supported by the constrained decoder: {clip(err.strip())}")
    # lark_err but llguidance accepted: llguidance dialect (e.g. %json, <[id]>, lazy "" terminals)
    may_specials = "<" in text
    return Constraint(ConstraintKind.GRAMMAR, g, info, may_allow_specials=may_specials,
                      description="gbnf grammar" if gbnf else "lark grammar", template=m)


#: choice lists up to this many options compile to one Lark rule; longer ones to one regex lexeme
#: (llguidance's parser refuses a row of more than 2,000 items: "Current row has 2002 items")
CHOICE_RULE_LIMIT = 1000
_RX_META = frozenset("\\.+*?()|[]{}^$#&-~")


def _rx_escape(text: str) -> str:
    """``text`` as a literal in llguidance's (Rust) regex syntax."""
    return "".join("\\" + ch if ch in _RX_META else ch for ch in text)


def compile_choice(spec: Choice, info: TokenizerInfo) -> Constraint:
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

    def grammar() -> str:
        if len(uniq) <= CHOICE_RULE_LIMIT:
            return llg.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in uniq))
        # one lexeme (a regex alternation): the Earley row limit (2,000 items) does not apply
        return llg.LLMatcher.grammar_from_regex("(" + "|".join(_rx_escape(c) for c in uniq) + ")")
    g, m, err = _matcher(grammar, info, "compiling the choices")
    if err:
        _refuse_limit(err, "choices exceed")
        raise ChoiceError(f"cannot compile the choices: {clip(err.strip())}")
    return Constraint(ConstraintKind.CHOICE, g, info, validator=ChoiceValidator(uniq),
                      description=f"{len(uniq)} choices", template=m)
