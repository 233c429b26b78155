"""The ``demo`` command's job: what the embedded model was trained on, then three of its training
families (person JSON, date regex, sentiment choice) in diffusion and AR, then grounded extraction."""
from __future__ import annotations

import json
from typing import Iterator

from pydantic import BaseModel


class Person(BaseModel):
    name: str
    age: int
    email: str


def demo_preface(rt) -> str:
    """What the embedded model can do, read from its training corpus, before any result is shown.

    >>> from dgemma_struct import DiffusionRuntime
    >>> "record families" in demo_preface(DiffusionRuntime.default())
    True
    """
    from dgemma_struct.training.corpus import JSON_FAMILIES
    from dgemma_struct.training.dialect_corpus import TOOLS

    params = sum(p.numel() for p in rt.model.parameters()) / 1e6
    device = f"{rt.model.device} ({str(rt.model.dtype).removeprefix('torch.')})"
    return (f"dgemma-struct demo: the embedded {params:.2f}M-parameter DiffusionGemma on {device}, a toy trained\n"
            f"only on synthetic records (docs/model_card.md):\n"
            f"  - JSON extraction, {len(JSON_FAMILIES)} record families: {', '.join(JSON_FAMILIES)}\n"
            f"  - short answers: dates, emails, phone numbers, order codes, sentiment, topic, arithmetic,\n"
            f"    key=value settings\n"
            f"  - tool calls to {len(TOOLS)} declared tools ({', '.join(list(TOOLS)[:3])},\n"
            f"    {', '.join(list(TOOLS)[3:])}), and the same with thinking on\n"
            f"Every value below is valid for its type by construction. Prompts like these get right answers\n"
            f"most of the time; any other prompt gets valid but meaningless values (load a real checkpoint\n"
            f"with DiffusionRuntime.from_pretrained for that). Diffusion first, then AR on the same weights.\n")


def demo_lines(rt, seed: int = 0) -> Iterator[str]:
    """The demo's output, a line (or block) at a time, as each result is ready.

    >>> from dgemma_struct import DiffusionRuntime
    >>> next(demo_lines(DiffusionRuntime.default())).startswith("dgemma-struct demo:")
    True
    """
    from dgemma_struct.api import generate
    from dgemma_struct.constraints.specs import Choice, Regex
    from dgemma_struct.grounding import demo as grounded_demo

    # prompts of three training families that the model answers right in both modes (a bare regex
    # answer is the toy's weak spot in diffusion: docs/model_card.md); the grounded demo below shows
    # grounding, which copies values from the prompt whatever the model would have written
    jobs = [
        ("Extract the name, age and email as JSON.\nAlice Gomez is 51 years old and can be reached at "
         "alice44@example.com.", Person),
        ("What date is mentioned? Answer as YYYY-MM-DD.\nThe contract ends on March 3, 2027.",
         Regex(r"\d{4}-\d{2}-\d{2}")),
        ("Classify the sentiment as positive, negative or neutral.\nThe hotel was clean and the view was amazing.",
         Choice(["positive", "negative", "neutral"])),
    ]
    yield demo_preface(rt)
    for prompt, spec in jobs:
        yield f"prompt: {prompt!r}"
        for mode in ("diffusion", "ar"):
            res = generate(prompt, spec, runtime=rt, seed=seed, mode=mode, return_details=True)
            value = res.value.model_dump() if hasattr(res.value, "model_dump") else res.value
            s = res.stats
            yield f"  {mode:9s} value: {json.dumps(value)}  ({type(res.value).__name__})"
            yield (f"  {'':9s} stats: {s.forward_passes} forward passes, {s.tokens_per_forward:.2f} tokens/forward, "
                   f"{s.forced_tokens} forced tokens, {s.repairs} repairs, fallback={s.fallback}, "
                   f"{s.wall_s * 1000:.0f} ms ({s.mask_s * 1000:.0f} ms constraint work)")
    yield "\n" + grounded_demo(rt, seed=seed)
