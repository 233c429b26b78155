"""The compiled grounded constraint: the grammar built over the source, validation against the
original schema plus "every grounded value occurs in the source", the offsets of every grounded
value, and a cache of compiled constraints."""
from __future__ import annotations

import hashlib
import json
from typing import Any, Sequence

import llguidance as llg

from dgemma_struct.constraints import Constraint, ValidationIssue, ValidationOutcome, get_tokenizer_info
from dgemma_struct.constraints.json_schema import make_validator, prepare_json_schema
from dgemma_struct.constraints.lru import BoundedLRU
from dgemma_struct.constraints.safety import clip, engine_guard
from dgemma_struct.errors import ConstraintCompileTimeout, DgemmaStructError, GroundingError, SchemaError
from dgemma_struct.grounding.grammar import GrammarBuilder, grammar_limits
from dgemma_struct.grounding.schema import SchemaView
from dgemma_struct.grounding.sources import GroundedSpan, Doc, grounded_sources
from dgemma_struct.grounding.spec import GRANULARITIES, GROUND_LEVELS, schema_of, strip_markers


class GroundedConstraint(Constraint):
    """A JSON constraint whose grounded fields are spans of ``sources``. Validates against the
    original schema (and pydantic model) and checks every grounded value against the source."""

    def __init__(self, grammar: str, info: Any, *, schema: Any, sources: tuple[str, ...], ground: str | None,
                 granularity: str, semantic_keywords: Sequence[str] = (), pydantic_adapter: Any = None,
                 lark: str = "", n_grounded: int = 0):
        # compiled here with the grounded limits (large lexemes not precomputed, see _LIMITS_KW) and
        # handed to the base class as its template
        with engine_guard("compiling the grounded constraint"):
            template = llg.LLMatcher(info.lltok, grammar, log_level=0, limits=grammar_limits())
            err = template.get_error() if template.is_error() else ""
        if err:
            raise _compile_error(err)
        super().__init__("json", grammar, info, schema=schema, semantic_keywords=semantic_keywords,
                         validator=make_validator(strip_markers(schema)), pydantic_adapter=pydantic_adapter,
                         description=f"grounded json ({n_grounded} grounded fields, {len(sources)} documents)",
                         template=template)
        self.sources = sources
        self.ground = ground
        self.granularity = granularity
        self.lark = lark
        self._docs = [Doc(d) for d in sources]
        self._view = SchemaView(schema, sources, ground=ground, granularity=granularity)

    def locate(self, value: Any) -> tuple[list[GroundedSpan], list[ValidationIssue]]:
        """Spans of every grounded value in ``value`` (a JSON value), and issues for those not found.

        The items of an array copy distinct places: the n-th item holding the same string is the n-th
        place the source writes it, and one more than the source holds is an issue (``superfluous``:
        a repair may close the array there) unless its field says ``repeat``."""
        spans: list[GroundedSpan] = []
        issues: list[ValidationIssue] = []
        uses: dict[tuple, int] = {}
        for path, v, leaf in self._view.leaves(value, self.schema, ()):
            occ: list[tuple[int, int, int]] = []
            for di, d in enumerate(self._docs):
                found = d.find_string(v, leaf.granularity) if leaf.kind == "string" else d.find_number(v)
                occ.extend((di, s, e) for s, e in found)
            if not occ:
                issues.append(ValidationIssue(path, f"{v!r} is not {'a span' if leaf.kind == 'string' else 'a number'}"
                                                    " of the source"))
                continue
            n = 0
            if leaf.kind == "string" and not leaf.repeat and path and isinstance(path[-1], int):
                n = uses.get((path[:-1], v), 0)
                uses[(path[:-1], v)] = n + 1
                if n >= len(occ):
                    issues.append(ValidationIssue(
                        path, f"{v!r} is item {n + 1} of this array with that text, but the source writes it "
                              f"{len(occ)} time{'s' if len(occ) > 1 else ''}", superfluous=True))
                    continue
            di, s, e = occ[n]
            spans.append(GroundedSpan(path, v, di, s, e, self.sources[di][s:e], tuple(occ)))
        return spans, issues

    def validate_text(self, text: str) -> ValidationOutcome:
        out = super().validate_text(text)
        if not out.ok:
            return out
        try:
            raw = json.loads(text)
        except ValueError:  # pragma: no cover - validated above
            return out
        _, issues = self.locate(raw)
        if issues:
            return ValidationOutcome(False, out.value, issues)
        return out


def _compile_error(err: str) -> DgemmaStructError:
    low = err.lower()
    if any(w in low for w in ("limit", "fuel", "too many", "too complex", "too large")):
        return ConstraintCompileTimeout(f"the grounded grammar exceeds the compile limits (source too large?): "
                                        f"{clip(err)}")
    return SchemaError(f"cannot compile the grounded grammar: {clip(err)}")


_cache = BoundedLRU(max_items=64)   # the compile cache's class (constraints/lru.py), bounded by count


def compile_grounded(schema: Any, tokenizer: Any, *, source: str | Sequence[str], ground: str | None = None,
                     granularity: str = "words", stop_token_ids: Sequence[int] | None = None,
                     vocab_size: int | None = None, strict: bool = False,
                     use_cache: bool = True) -> GroundedConstraint:
    """Compile ``schema`` (pydantic model or JSON Schema) so that its grounded fields can only take
    spans (strings) and number literals (numbers) of ``source`` (one text or a list of texts).

    ``ground``: None (only fields marked ``x-grounded`` / ``Grounded()``), ``"strings"`` (also every
    free string field), ``"numbers"`` or ``"all"``. ``granularity``: default for fields without an
    explicit mode, ``"words"`` or ``"chars"``. Raises :class:`GroundingError` for an empty source,
    an unsatisfiable grounded field or grounding on a non-string, non-number field."""
    if ground not in GROUND_LEVELS:
        raise GroundingError(f"ground must be one of {GROUND_LEVELS}, not {ground!r}")
    if granularity not in GRANULARITIES:
        raise GroundingError(f"granularity must be one of {GRANULARITIES}, not {granularity!r}")
    docs = grounded_sources(None, source)
    info = get_tokenizer_info(tokenizer, stop_token_ids, vocab_size)
    js, adapter = schema_of(schema)
    key = None
    if use_cache:
        h = hashlib.sha256("\x00".join(docs).encode("utf-8", "surrogatepass")).hexdigest()
        skey = f"pydantic:{id(schema)}" if adapter is not None else json.dumps(js, sort_keys=True)
        key = (skey, h, len(docs), ground, granularity, info.key, strict)
        c = _cache.get(key)
        if c is not None:
            return c
    # schema checks (metaschema, refs, bounds) and the keywords the grammar leaves to validation
    plan = prepare_json_schema(strip_markers(js), info.lltok, strict=strict, limits=grammar_limits())
    builder = GrammarBuilder(js, docs, ground=ground, granularity=granularity, lltok=info.lltok)
    lark = builder.build()
    with engine_guard("building the grounded grammar"):
        grammar = llg.LLMatcher.grammar_from_lark(lark)
    c = GroundedConstraint(grammar, info, schema=js, sources=docs, ground=ground, granularity=granularity,
                           semantic_keywords=plan.semantic_keywords, pydantic_adapter=adapter, lark=lark,
                           n_grounded=builder.grounded_count)
    if use_cache and key is not None:
        _cache.put(key, c)
    return c
