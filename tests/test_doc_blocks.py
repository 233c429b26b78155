"""Every ```python block in README.md and docs/*.md runs, and what it prints is what the page shows.

- A page's blocks run in order in one namespace (a later block may use an earlier one's names), on the
  embedded model on the CPU, from the repository root.
- A block is skipped only when the page says so, with its reason, in an HTML comment on the lines just
  before it: ``<!-- doc-test: skip (needs a server) -->``.
- A ```text block right after a python block (only blank lines between, or a short lead-in of at most
  three lines ending in ":", like "It prints:") is that block's output:
  what the block printed must equal it, with ``...`` matching anything (doctest's ELLIPSIS) and runs
  of whitespace compared as one space.
"""
from __future__ import annotations

import contextlib
import doctest
import io
import os
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from dgemma_struct.testing import embedded_model_available

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP = re.compile(r"<!--\s*doc-test:\s*skip\s*\((?P<reason>[^)]+)\)\s*-->")
FENCE = re.compile(r"^(?P<indent> {0,3})```(?P<lang>[\w+-]*)\s*$")


@dataclass
class Block:
    page: str
    line: int            # 1-based line of the opening fence
    code: str
    skip: str | None     # the page's reason, when it marks the block
    output: str | None   # the ```text block that follows, if any


def blocks(text: str, page: str = "page") -> list[Block]:
    """The python blocks of a markdown text, with their skip marks and shown outputs.

    >>> md = "<!-- doc-test: skip (needs a GPU) -->\\n```python\\nx = 1\\n```\\n\\n```text\\n1\\n```\\n"
    >>> [(b.line, b.code, b.skip, b.output) for b in blocks(md)]
    [(2, 'x = 1\\n', 'needs a GPU', '1\\n')]
    """
    lines = text.splitlines()
    fences: list[tuple[int, int, str, str]] = []   # (open, close, lang, body)
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m and m.group("lang"):
            j = i + 1
            while j < len(lines) and not FENCE.match(lines[j]):
                j += 1
            fences.append((i, j, m.group("lang"), "".join(ln + "\n" for ln in lines[i + 1:j])))
            i = j + 1
        elif m:   # a bare fence: skip over its block
            j = i + 1
            while j < len(lines) and not FENCE.match(lines[j]):
                j += 1
            i = j + 1
        else:
            i += 1
    out = []
    for k, (start, end, lang, body) in enumerate(fences):
        if lang != "python":
            continue
        before, n = [], start - 1
        while n >= 0 and (not lines[n].strip() or lines[n].lstrip().startswith("<!--")):
            before.append(lines[n])
            n -= 1
        mark = next((SKIP.search(b) for b in before if SKIP.search(b)), None)
        output = None
        between = [ln.strip() for ln in lines[end + 1:fences[k + 1][0]] if ln.strip()] if k + 1 < len(fences) else []
        if k + 1 < len(fences) and fences[k + 1][2] == "text" and (not between or between[-1].endswith(":")
                                                                   and len(between) <= 3):
            output = fences[k + 1][3]
        out.append(Block(page, start + 1, body, mark.group("reason").strip() if mark else None, output))
    return out


def same_output(shown: str, printed: str) -> bool:
    """Doctest's comparison: ``...`` matches anything, whitespace runs are one space.

    >>> same_output("a ... c\\n", "a   b b  c\\n"), same_output("a\\n", "b\\n")
    (True, False)
    """
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    return doctest.OutputChecker().check_output(shown, printed, flags)


def _page_ids() -> list[str]:
    return [str(p.relative_to(ROOT)) for p in PAGES]


def test_the_pages_have_blocks_and_the_readme_shows_its_output():
    found = [b for p in PAGES for b in blocks(p.read_text(), str(p.relative_to(ROOT)))]
    assert len(found) >= 10
    readme = [b for b in found if b.page == "README.md"]
    assert readme and readme[0].skip is None and readme[0].output, "the README's first example shows its output"


def test_the_checker_can_fail():
    """A wrong shown output and an unmarked failing block are caught (the checks below can fail)."""
    assert not same_output("positive\n", "negative\n")
    md = "```python\nprint(1)\n```\n```text\n2\n```\n"
    (b,) = blocks(md)
    assert not same_output(b.output, _run_blocks([b], {})[0][1])
    with pytest.raises(ZeroDivisionError):
        _run_blocks(blocks("```python\n1 / 0\n```\n"), {})


def skip_reason(b: Block) -> str | None:
    """The page's own skip reason (an HTML comment just before the block)."""
    return b.skip


def _run_blocks(page_blocks: list[Block], namespace: dict) -> list[tuple[Block, str]]:
    ran = []
    for b in page_blocks:
        if skip_reason(b):
            continue
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(compile(b.code, f"{b.page}:{b.line}", "exec"), namespace)
        ran.append((b, buf.getvalue()))
    return ran


@pytest.mark.skipif(not embedded_model_available(), reason="embedded checkpoint missing")
@pytest.mark.parametrize("page", PAGES, ids=_page_ids())
def test_page_blocks_run_and_print_what_they_show(page: Path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    page_blocks = blocks(page.read_text(), str(page.relative_to(ROOT)))
    if not page_blocks:
        pytest.skip("no python blocks")
    # a real module, so that pydantic finds the blocks' names when it builds a model's schema later
    module = types.ModuleType("doc_block_" + re.sub(r"\W", "_", page.stem))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for b, printed in _run_blocks(page_blocks, module.__dict__):
        if b.output is not None:
            assert same_output(b.output, printed), f"{b.page}:{b.line} printed:\n{printed}\nthe page shows:\n{b.output}"


LINK = re.compile(r"\]\((?P<target>[^)#\s]+\.md)(?:#[^)]*)?\)")


def _links(page: Path) -> set[Path]:
    return {(page.parent / m.group("target")).resolve() for m in LINK.finditer(page.read_text())
            if "://" not in m.group("target")}


def test_every_doc_page_is_two_clicks_from_the_readme():
    """README -> docs/index.md -> every page (the front door reaches each page in at most two clicks)."""
    readme, index = ROOT / "README.md", (ROOT / "docs" / "index.md").resolve()
    assert index in _links(readme)
    first = next(m for m in LINK.finditer(readme.read_text()) if "://" not in m.group("target"))
    assert (ROOT / first.group("target")).resolve() == index, "docs/index.md is the README's first doc link"
    reached = _links(index)
    assert {p.resolve() for p in (ROOT / "docs").glob("*.md")} - {index} - reached == set()


def test_the_front_pages_link_only_to_pages_that_exist():
    for page in (ROOT / "README.md", ROOT / "docs" / "index.md", ROOT / "docs" / "getting_started.md"):
        missing = [str(p) for p in _links(page) if not p.exists()]
        assert missing == [], (page.name, missing)


def test_every_skip_mark_is_read_as_one():
    """A ``doc-test:`` comment the parser cannot read (a reason with parentheses) would run its block."""
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if line.lstrip().startswith("<!--") and "doc-test:" in line:
                assert SKIP.fullmatch(line.strip()), f"{page.name}:{n}: unreadable skip mark {line.strip()!r}"
    assert not SKIP.fullmatch("<!-- doc-test: skip (needs a dir (path)) -->")
