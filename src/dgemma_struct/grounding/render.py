"""HTML rendering of a grounded extraction: the sources with every grounded span highlighted and
labelled by its field, then a table of the values and their offsets."""
from __future__ import annotations

import html
import json
import re
from typing import Any, Sequence

from dgemma_struct.grounding.sources import GroundedSpan

_PALETTE = ["#ffd54f", "#81d4fa", "#a5d6a7", "#f48fb1", "#ce93d8", "#ffab91", "#80cbc4", "#e6ee9c",
            "#b0bec5", "#bcaaa4"]


def render_html(sources: Sequence[str], spans: Sequence[GroundedSpan], *, value: Any = None,
                title: str | None = None, full_page: bool = True) -> str:
    """HTML of ``sources`` with ``spans`` highlighted (one colour per field, its name as a label),
    followed by a table of the extracted values and their offsets."""
    labels = list(dict.fromkeys(re.sub(r"\.\d+(?=\.|$)", "[]", s.label) for s in spans))
    color = {lab: _PALETTE[i % len(_PALETTE)] for i, lab in enumerate(labels)}
    parts = []
    for di, doc in enumerate(sources):
        mine = sorted((s for s in spans if s.doc == di), key=lambda s: (s.start, -(s.end - s.start)))
        cuts = sorted({0, len(doc)} | {s.start for s in mine} | {s.end for s in mine})
        out = []
        for a, b in zip(cuts, cuts[1:]):
            cover = [s for s in mine if s.start <= a and b <= s.end]
            seg = html.escape(doc[a:b])
            if cover:
                top = cover[-1]
                lab = re.sub(r"\.\d+(?=\.|$)", "[]", top.label)
                names = ", ".join(html.escape(c.label) for c in cover)
                seg = (f'<mark style="background:{color[lab]}" title="{names}" '
                       f'data-fields="{names}">{seg}</mark>')
            out.append(seg)
            for s in mine:
                if s.end == b:
                    lab = re.sub(r"\.\d+(?=\.|$)", "[]", s.label)
                    out.append(f'<span class="lbl" style="background:{color[lab]}">{html.escape(s.label)}</span>')
        head = f'<div class="doc-h">source {di + 1} of {len(sources)}</div>' if len(sources) > 1 else ""
        parts.append(f'{head}<div class="doc">{"".join(out)}</div>')
    rows = "".join(
        f'<tr><td><span class="sw" style="background:{color[re.sub(r".[0-9]+(?=[.]|$)", "[]", s.label)]}">'
        f'</span>{html.escape(s.pointer)}</td><td><code>{html.escape(json.dumps(s.value, ensure_ascii=False))}'
        f'</code></td><td>{s.doc}:{s.start}&ndash;{s.end}</td></tr>' for s in spans)
    table = (f'<table><thead><tr><th>field</th><th>value</th><th>source:chars</th></tr></thead>'
             f'<tbody>{rows}</tbody></table>')
    val = (f'<pre class="val">{html.escape(json.dumps(value, ensure_ascii=False, indent=2))}</pre>'
           if value is not None else "")
    body = (f'<div class="grounded">{"<h2>" + html.escape(title) + "</h2>" if title else ""}{"".join(parts)}'
            f'{table}{val}</div>')
    if not full_page:
        return body
    css = ("body{font-family:system-ui,sans-serif;margin:24px;color:#222;background:#fff}"
           ".doc{white-space:pre-wrap;line-height:2.1;font-size:17px;border:1px solid #ddd;border-radius:6px;"
           "padding:12px 14px;margin:8px 0 16px}.doc-h{font-size:12px;color:#777}"
           "mark{border-radius:3px;padding:1px 2px}.lbl{font-size:10px;vertical-align:super;border-radius:3px;"
           "padding:0 3px;margin-left:1px;font-family:monospace;opacity:.85}"
           "table{border-collapse:collapse;font-size:14px}td,th{border-bottom:1px solid #eee;padding:4px 10px;"
           "text-align:left}.sw{display:inline-block;width:10px;height:10px;margin-right:6px;border-radius:2px}"
           ".val{background:#f6f8fa;padding:10px;border-radius:6px;font-size:13px}")
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title or "grounded extraction")}'
            f'</title><style>{css}</style></head><body>{body}</body></html>')
