"""Schema with grounded fields -> llguidance Lark grammar (see the package docstring). Objects that
hold grounded fields get hand-written rules, every other sub-schema is embedded as ``%json``, a
free grounded string is the source's ``substring_chunks`` lexeme cut to sensible edges, a
constrained one the finite list of its candidates."""
from __future__ import annotations

import json
from typing import Any

import llguidance as llg

from dgemma_struct.constraints.json_locate import schema_property_names
from dgemma_struct.constraints.json_schema import json_options, prepare_json_schema
from dgemma_struct.errors import GroundingError, SchemaError
from dgemma_struct.grounding.candidates import STRING_KWS, constraint_summary, number_candidates, string_candidates
from dgemma_struct.grounding.schema import Leaf, SchemaView
from dgemma_struct.grounding.sources import chunk_offsets, field_labels, value_pieces
from dgemma_struct.grounding.spec import fmt, strip_markers, schema_types

# The plain path's limits, but without precomputing large lexemes and with more lexer fuel per step:
# the span lexeme of a 2,000-word source exhausts the initial lexer fuel when precomputed (0.2 s,
# then an error) and compiles in 0.03 s when it is not; its first mask after ``{"name":"`` then
# needs more than the default 200k step fuel ("too many expressions constructed"), ~10 ms with 10M.
_LIMITS_KW = dict(max_grammar_size=500_000, initial_lexer_fuel=2_000_000, max_lexer_states=250_000,
                  precompute_large_lexemes=False, step_lexer_fuel=10_000_000)


def grammar_limits() -> Any:
    return llg.LLParserLimits(**_LIMITS_KW)


def _esc(s: str) -> str:
    """JSON string body of ``s`` (what goes between the quotes)."""
    return json.dumps(s, ensure_ascii=False)[1:-1]


def _lark_lit(s: str) -> str:
    """A Lark string literal matching exactly ``s`` (``s`` holds no raw control characters)."""
    return json.dumps(s, ensure_ascii=False)


class GrammarBuilder(SchemaView):
    """Writes the Lark grammar of a schema with grounded fields (see the package docstring)."""

    def __init__(self, root: Any, docs: tuple[str, ...], *, ground: str | None, granularity: str, lltok: Any):
        super().__init__(root, docs, ground=ground, granularity=granularity)
        self.lltok = lltok
        self.rules: list[str] = []
        self.n = 0
        self.ref_rules: dict[str, str] = {}
        self.span_terms: dict[str, str] = {}
        self.grounded_count = 0
        self._json_opts = dict(json_options("compact", None), lenient=True, coerce_one_of=True)
        self._edge_rules = False

    def fresh(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    # -- expressions ----------------------------------------------------------------------------
    def json_piece(self, node: Any, path: tuple) -> str:
        """``%json {...}`` for an ungrounded sub-schema (relaxed like the plain JSON path)."""
        sub = strip_markers(node)
        if isinstance(sub, bool):
            sub = {} if sub else {"not": {}}
        sub = dict(sub)
        for k, v in self._defs.items():
            sub.setdefault(k, strip_markers(v))
        try:
            plan = prepare_json_schema(sub, self.lltok, limits=grammar_limits())
        except SchemaError as e:
            raise type(e)(f"{fmt(path)}: {e}") from None
        g = dict(plan.grammar_schema) if isinstance(plan.grammar_schema, dict) else {}
        g["x-guidance"] = self._json_opts
        return "%json " + json.dumps(g, ensure_ascii=False)

    def expr(self, node: Any, path: tuple) -> str:
        if isinstance(node, dict) and isinstance(node.get("$ref"), str) and set(node) <= {"$ref", "description",
                                                                                            "title", "default"}:
            ref = node["$ref"]
            if not self.contains(node, path):
                return self.json_piece(node, path)
            name = self.ref_rules.get(ref)
            if name is None:
                name = self.ref_rules[ref] = self.fresh("ref")
                target, _ = self.resolve(node, path)
                body = self.expr(target, path)
                self.rules.append(f"{name}: {body}")
            return name
        node, _ = self.resolve(node, path)
        if not self.contains(node, path):
            return self.json_piece(node, path)
        leaf = self.leaf(node, path)
        if leaf is not None:
            return self.leaf_expr(node, leaf, path)
        for kw in ("anyOf", "oneOf"):
            if isinstance(node.get(kw), list):
                rest = {k: v for k, v in node.items() if k != kw}
                alts = [self.expr({**rest, **b} if isinstance(b, dict) and rest and "$ref" not in b else b,
                                  path) for b in node[kw]]
                return "(" + " | ".join(alts) + ")"
        if isinstance(node.get("allOf"), list):
            parts = node["allOf"]
            rest = {k: v for k, v in node.items() if k != "allOf"}
            if len(parts) == 1:
                merged = parts[0] if not rest else {**(self.resolve(parts[0], path)[0] or {}), **rest}
                return self.expr(merged, path)
            raise GroundingError(f"{fmt(path)}: grounded fields inside an allOf of several schemas are not "
                                 "supported; merge them into one schema", path=path)
        types = schema_types(node)
        if len(types) > 1:
            alts = [self.expr({**node, "type": t}, path) for t in types]
            return "(" + " | ".join(alts) + ")"
        t = types[0] if types else None
        if t == "object":
            return self.object_expr(node, path)
        if t == "array":
            return self.array_expr(node, path)
        raise GroundingError(f"{fmt(path)}: cannot place grounded fields under this schema "
                             f"({', '.join(sorted(node)) or 'empty'})", path=path)

    def object_expr(self, node: dict, path: tuple) -> str:
        props = node.get("properties") or {}
        required = set(node.get("required") or [])
        names = list(props)
        missing = [r for r in required if r not in props]
        if missing:
            raise GroundingError(f"{fmt(path)}: required properties {missing} have no schema; a grounded object "
                                 "needs every required property declared", path=path)
        items, kept = [], []
        for k in names:
            mark = (len(self.rules), self.grounded_count, dict(self.span_terms), self._edge_rules, dict(self.ref_rules))
            try:
                items.append(f'{_lark_lit(json.dumps(k, ensure_ascii=False) + ":")} {self.expr(props[k], path + (k,))}')
                kept.append(k)
            except GroundingError:
                if k in required:
                    raise
                # an optional field that nothing in the source can fill is left out, as a reader would
                del self.rules[mark[0]:]
                self.grounded_count, self.span_terms, self._edge_rules, self.ref_rules = mark[1:]
        names = kept
        if not names:
            return '"{}"'
        base = self.fresh("obj")
        # first_i: properties i.. with nothing written yet; rest_i: after at least one
        n = len(names)
        first = [f"{base}_f{i}" for i in range(n + 1)]
        rest = [f"{base}_r{i}" for i in range(n + 1)]
        can_be_empty = not (required & set(names))
        for i in range(n - 1, -1, -1):
            req = names[i] in required
            r_alts = [f'"," {items[i]} {rest[i + 1]}']
            if not req:
                r_alts.append(rest[i + 1])
            self.rules.append(f"{rest[i]}: " + " | ".join(r_alts))
            f_alts = [f"{items[i]} {rest[i + 1]}"]
            if not req and not (i == n - 1):
                f_alts.append(first[i + 1])
            self.rules.append(f"{first[i]}: " + " | ".join(f_alts))
        self.rules.append(f'{rest[n]}: ""')
        return f'"{{" {first[0]}{"?" if can_be_empty else ""} "}}"'

    def array_expr(self, node: dict, path: tuple) -> str:
        if node.get("prefixItems") is not None or isinstance(node.get("items"), list):
            raise GroundingError(f"{fmt(path)}: grounded fields in tuple arrays (prefixItems) are not supported",
                                 path=path)
        items = node.get("items", {})
        item = self.expr(items, path + ("items",))
        lo = int(node.get("minItems", 0) or 0)
        hi = node.get("maxItems")
        if hi is not None and int(hi) < lo:
            raise SchemaError(f"{fmt(path)}: maxItems < minItems")
        name = self.fresh("arr")
        self.rules.append(f"{name}_i: {item}")
        more_lo = max(lo - 1, 0)
        more = f'("," {name}_i){{{more_lo},{"" if hi is None else max(int(hi) - 1, 0)}}}'
        if hi is not None and int(hi) == 0:
            return '"[]"'
        body = f"{name}_i {more}"
        return f'"[" {body} "]"' if lo >= 1 else f'"[" ({body})? "]"'

    # -- leaves ---------------------------------------------------------------------------------
    def leaf_expr(self, node: dict, leaf: Leaf, path: tuple) -> str:
        self.grounded_count += 1
        check = strip_markers(node)
        for k, v in self._defs.items():
            check.setdefault(k, v)
        nullable = "null" in schema_types(node)
        if leaf.kind == "number":
            lits = number_candidates(self.docs, check)
            if not lits:
                raise GroundingError(f"{fmt(path)}: no number written in the source satisfies this field "
                                     f"({constraint_summary(node)})", path=path)
            name = self.fresh("GN")
            self.rules.append(f"{name}: " + " | ".join(_lark_lit(x) for x in lits))
        else:
            constrained = any(k in node for k in STRING_KWS)
            cands = string_candidates(self.docs, check, leaf.granularity) if constrained else None
            if cands is not None and not cands:
                raise GroundingError(f"{fmt(path)}: no span of the source satisfies this field "
                                     f"({constraint_summary(node)})", path=path)
            if cands is not None:
                name = self.fresh("GS")
                self.rules.append(f"{name}: " + " | ".join(_lark_lit(json.dumps(c, ensure_ascii=False))
                                                           for c in cands))
            else:
                name = self.span_terminal(leaf.granularity)
        return f'({name} | "null")' if nullable else name

    def span_terminal(self, granularity: str) -> str:
        name = self.span_terms.get(granularity)
        if name is not None:
            return name
        name = self.span_terms[granularity] = f"GSTR_{granularity.upper()}"
        subs = []
        names = sorted(schema_property_names(self.root))
        for i, doc in enumerate(self.docs):
            for j, (ps, pe) in enumerate(value_pieces(doc, names)):
                piece = doc[ps:pe]
                chunks = [_esc(piece[s:e]) for s, e in chunk_offsets(piece, granularity)]
                if not chunks or not any(c.isalnum() for c in piece):
                    continue
                sub = f"SRC_{granularity.upper()}_{i}_{j}"
                self.rules.append(f"{sub}: %regex " + json.dumps({"substring_chunks": chunks}, ensure_ascii=False))
                subs.append(sub)
        if not subs:
            raise GroundingError("no text of the source can be a value: it holds only field names, separators "
                                 "and table borders")
        if not self._edge_rules:  # shared by every granularity
            self._edge_rules = True
            self.rules += [
                r"EDGE_WS: /[\s\u2028\u2029]/",
                r'EDGE_ESC: "\\n" | "\\t" | "\\r" | "\\f" | "\\b" | /\\u00[01][0-9a-fA-F]/',
                r"EDGE_ANY: /(.|\n)*/",
                r"EDGE_EVEN: /((.|\n)*[^\\])?(\\\\)*/",
                r"EDGE_PUNCT_L: /[,;:.!?)\]}]/",
                r"EDGE_PUNCT_R: /[,;:(\[{]/",
            ]
        # the last rule asks for a letter or digit of the source, not of an escape ("\\n", "\\u0007")
        body = (f"({' | '.join(subs)}) & /(.|\\n)+/ & ~(EDGE_WS EDGE_ANY) & ~(EDGE_ANY EDGE_WS) "
                f"& ~(EDGE_ESC EDGE_ANY) & ~(EDGE_EVEN EDGE_ESC) "
                f"& ~(EDGE_PUNCT_L EDGE_ANY) & ~(EDGE_ANY EDGE_PUNCT_R) "
                f"& ~/([^\\p{{L}}\\p{{N}}\\\\]|\\\\[\"\\\\\\/bfnrt]|\\\\u[0-9a-fA-F]{{4}})+/")
        labels = field_labels(self.docs, names)
        if labels:  # a value is never just the name of a field the request asks for
            body += " & ~(" + " | ".join(_lark_lit(_esc(x)) for x in labels) + ")"
        self.rules.append(f"SPAN_{granularity.upper()}: {body}")
        self.rules.append(f'{name}: "\\"" SPAN_{granularity.upper()} "\\""')
        return name

    def build(self) -> str:
        """The whole grammar (``start`` rule first)."""
        if not self.contains(self.root, ()):
            raise GroundingError("nothing to ground: no field is marked x-grounded / Grounded() and ground= "
                                 "selects none (use ground='strings' or mark fields)")
        top = self.expr(self.root, ())
        return "start: " + top + "\n" + "\n".join(self.rules) + "\n"
