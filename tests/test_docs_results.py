"""Docs are generated from results: every table of measured numbers in docs/ sits in a
``<!-- results:... -->`` block rendered by scripts/render_docs.py from a committed file in docs/results/,
and a block that disagrees with its file fails here (fix: ``python scripts/render_docs.py``)."""
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("render_docs", ROOT / "scripts" / "render_docs.py")
render_docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render_docs)

PAGES = render_docs.pages()


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_results_blocks_match_their_files(page):
    text = page.read_text(encoding="utf-8")
    assert render_docs.render(text) == text, f"{page.name} is stale: run python scripts/render_docs.py"


def test_pages_with_measured_tables_are_generated():
    """The pages whose tables are measured numbers draw them from results files."""
    want = {"benchmarks.md": 12, "model_card.md": 2, "tools.md": 2, "grounding.md": 3, "install.md": 1}
    for name, n in want.items():
        assert len(render_docs.sources((ROOT / "docs" / name).read_text(encoding="utf-8"))) >= n, name


def test_a_changed_number_is_caught():
    page = ROOT / "docs" / "benchmarks.md"
    text = page.read_text(encoding="utf-8")
    m = next(render_docs.BLOCK.finditer(text))
    number = re.search(r"\d+\.\d+", m["body"])
    tampered = text[:m.start("body") + number.start()] + "999.9" + text[m.start("body") + number.end():]
    assert render_docs.render(tampered) != tampered
    assert render_docs.render(tampered) == text


def test_every_block_names_an_existing_source():
    for page in PAGES:
        for src in render_docs.sources(page.read_text(encoding="utf-8")):
            render_docs.render_source(src)   # raises on a missing file or table


def test_md_tables_splits_tables():
    text = "# t\n\n| a |\n|---|\n| 1 |\n\ntext\n| b |\n|---|\n| 2 |\n"
    assert render_docs.md_tables(text) == ["| a |\n|---|\n| 1 |", "| b |\n|---|\n| 2 |"]
