"""Render the tables of measured numbers in docs/ from the committed results in docs/results/.

A generated block in a doc page::

    <!-- results:e2e.md#2 -->          the 2nd markdown table of docs/results/e2e.md (written by its benchmark)
    ...                                 (replaced on every run)
    <!-- /results -->

    <!-- results:model_eval.json -->    a table rendered here from docs/results/model_eval.json

Usage::

    python scripts/render_docs.py            # rewrite the blocks in docs/*.md
    python scripts/render_docs.py --check    # exit 1 and list the pages whose blocks are stale

``tests/test_docs_results.py`` runs the check, so a table that disagrees with its results file fails CI.
Benchmarks write ``docs/results/<name>.{json,md}``; re-run this script after a benchmark.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RESULTS = DOCS / "results"
BLOCK = re.compile(r"(?P<open><!-- results:(?P<src>[^ >]+) -->\n)(?P<body>.*?)(?P<close><!-- /results -->)", re.S)


def md_tables(text: str) -> list[str]:
    """The markdown tables of ``text``, in order, each as its lines joined (no trailing newline)."""
    tables, cur = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            cur.append(line)
        elif cur:
            tables.append("\n".join(cur))
            cur = []
    if cur:
        tables.append("\n".join(cur))
    return tables


def table(header: list[str], align: list[str], rows: list[list[str]]) -> str:
    """A markdown table; ``align`` holds ``---`` or ``--:`` per column."""
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def model_eval(data: dict) -> str:
    """docs/results/model_eval.json (``dgemma-struct eval``): diffusion vs AR, with the dialect issue's floors."""
    d, a = data["diffusion"], data["ar"]
    rows = [("valid JSON (`json.loads`)", "valid_json_rate", _pct, "diffusion ≥ 70%"),
            ("valid against the family schema", "schema_valid_rate", _pct, "—"),
            ("field accuracy (exact value per key)", "field_accuracy", _pct, "AR ≥ 70%, diffusion ≥ 45%"),
            ("short answers, exact match", "short_answer_exact", _pct, "—"),
            (f"tool prompts ({d['tool_prompts']}): calls parse", "tool_calls_parsed", _pct, "—"),
            ("tool names exact (in order)", "tool_names_exact", _pct, "—"),
            ("tool argument accuracy", "tool_argument_accuracy", _pct, "—"),
            (f"thinking prompts ({d['thinking_prompts']}): well-formed thought block", "thought_block_well_formed",
             _pct, "—"),
            ("thinking JSON answers: field accuracy", "thinking_json_field_accuracy", _pct, "—"),
            ("mean tokens per forward (TPF)", "mean_tokens_per_forward", lambda x: f"{x:.2f}", "diffusion ≥ 3"),
            ("mean forward passes per request", "mean_forward_passes", lambda x: f"{x:.2f}", "—")]
    met = {"valid_json_rate": d["valid_json_rate"] >= 0.70,
           "field_accuracy": a["field_accuracy"] >= 0.70 and d["field_accuracy"] >= 0.45,
           "mean_tokens_per_forward": d["mean_tokens_per_forward"] >= 3}
    body = []
    for label, key, fmt, floor in rows:
        if key in met:
            floor += " — **met**" if met[key] else " — **not met**"
        body.append([label, fmt(d[key]), fmt(a[key]), floor])
    return table(["metric", "diffusion", "AR (same weights)", "floor"], ["---", "--:", "--:", "---"], body)


def tool_calls_bfcl(data: dict) -> str:
    """docs/results/tool_calls_bfcl.json (``benchmarks/tool_calls_bfcl.py``)."""
    rows = []
    for name, sub in data["subsets"].items():
        for mode, m in sub["modes"].items():
            errs = ", ".join(f"{n} {k}" for k, n in m["errors"].items())
            rows.append([name, f"{sub['compiled']}/{sub['records']}", f"{sub['compile_ms_p50']:.1f}", mode,
                         m["requests"], m["valid_calls"], errs or m["typed_failures"], m["untyped"],
                         f"{100 * m['valid_share_of_returned']:.0f}%", f"{m['wall_s_median']:.1f}",
                         f"{m['forwards_median']:g}"])
    return table(["subset", "compiled", "compile p50 (ms)", "mode", "requests", "valid calls returned",
                  "typed failures", "untyped", "valid share of returned", "wall median (s)", "forwards median"],
                 ["---", "--:", "--:", "---", "--:", "--:", "---", "--:", "--:", "--:", "--:"], rows)


def install_sizes(data: dict) -> str:
    """docs/results/install_sizes.json: the venv of each Quick-start line."""
    rows = [[f"{r['line']}: `{r['command']}`", r["installs"], r["venv"].replace("G", " GB"), r["packages"], r["note"]]
            for r in data["rows"]]
    return table(["Quick-start line", "installs", "venv size", "packages", "measured in"],
                 ["---", "---", "--:", "--:", "---"], rows)


RENDERERS: dict[str, Callable[[dict], str]] = {"model_eval": model_eval, "tool_calls_bfcl": tool_calls_bfcl,
                                               "install_sizes": install_sizes}


def render_source(src: str) -> str:
    """The rendered content of one ``results:`` source (no trailing newline)."""
    name, _, index = src.partition("#")
    path = RESULTS / name
    if not path.exists():
        raise FileNotFoundError(f"results file {path.relative_to(ROOT)} does not exist")
    if path.suffix == ".md":
        tables = md_tables(path.read_text(encoding="utf-8"))
        i = int(index or 1)
        if not 1 <= i <= len(tables):
            raise IndexError(f"{name} has {len(tables)} tables, not {i}")
        return tables[i - 1]
    if path.suffix == ".json":
        return RENDERERS[path.stem](json.loads(path.read_text(encoding="utf-8")))
    raise ValueError(f"cannot render {name}")


def render(text: str) -> str:
    """``text`` with every results block re-rendered from its source."""
    return BLOCK.sub(lambda m: m["open"] + render_source(m["src"]) + "\n" + m["close"], text)


def sources(text: str) -> list[str]:
    """The results sources a page's blocks name."""
    return [m["src"] for m in BLOCK.finditer(text)]


def pages() -> list[Path]:
    """The doc pages (docs/*.md; the generated api.md aside)."""
    return [p for p in sorted(DOCS.glob("*.md")) if p.name != "api.md"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report stale pages (exit 1 if any)")
    args = ap.parse_args(argv)
    stale = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        new = render(text)
        if new != text:
            stale.append(page.relative_to(ROOT))
            if not args.check:
                page.write_text(new, encoding="utf-8")
    verb = "stale" if args.check else "re-rendered"
    print("\n".join(f"{verb}: {p}" for p in stale) or "all results blocks are up to date")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
