"""Tool calling on the embedded model's held-out tool prompts: constrained vs unconstrained.

The held-out split is ``make_corpus(n, seed=12345)`` (training used seed 0); its tool examples
declare one to three tools (OpenAI ``tools`` entries, rendered by the chat template) and expect one
or two native calls. Per mode (diffusion, AR):

* **unconstrained**: the model writes freely; its text (special tokens kept) is parsed the way a
  vLLM-style tool parser would (``<|tool_call>call:NAME{...}<tool_call|>``). A call counts as
  *valid* when it parses, names a declared tool, and its arguments validate against that tool's
  schema; a request counts as valid when it has at least one call and every call is valid.
* **constrained**: :func:`dgemma_struct.generate_tool_calls` with ``tool_choice="required"``:
  every returned call is valid by construction (or a typed error is raised and counted).

Both report tool-name accuracy (the expected names, in order) and argument accuracy (share of
expected arguments with the exact value), wall time and forward passes per request.

    python benchmarks/tool_prompts_eval.py --n 400 --out docs/results/tool_prompts_eval.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import jsonschema
import torch

from dgemma_struct.cli.arguments import load_runtime
from dgemma_struct.errors import DgemmaStructError
from dgemma_struct.prompts import ChatPrompt
from dgemma_struct.runtime import DiffusionRuntime
from dgemma_struct.tools import generate_tool_calls
from dgemma_struct.tools.syntax import parse_tool_calls
from dgemma_struct.training.evaluate import HELD_OUT_SEED, call_scores
from dgemma_struct.training.corpus import make_corpus


def _valid(calls: list[tuple[str, dict]], tools: list[dict]) -> bool:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    if not calls:
        return False
    for name, args in calls:
        if name not in schemas:
            return False
        try:
            jsonschema.validate(args, schemas[name])
        except jsonschema.ValidationError:
            return False
    return True


def run(rt: DiffusionRuntime, examples: list[dict], mode: str, max_new_tokens: int) -> dict:
    rows: dict[str, list] = {"unconstrained": [], "constrained": []}
    for i, e in enumerate(examples):
        msgs = [{"role": "user", "content": e["prompt"]}]
        t0 = time.perf_counter()
        r = rt.generate(ChatPrompt(msgs, tools=e["tools"]), max_new_tokens=max_new_tokens, seed=i, mode=mode)
        wall = time.perf_counter() - t0
        text = rt.tokenizer.decode(r.token_ids, skip_special_tokens=False)
        try:
            calls = parse_tool_calls(text)
            parsed = True
        except ValueError:
            calls, parsed = [], False
        names_ok, acc = call_scores(calls, e["fields"]["calls"])
        rows["unconstrained"].append(dict(parsed=parsed, valid=parsed and _valid(calls, e["tools"]), names=names_ok,
                                          acc=acc, wall=wall, fwd=r.stats.forward_passes, error=None))
        t0 = time.perf_counter()
        try:
            res = generate_tool_calls(msgs, e["tools"], tool_choice="required", runtime=rt,
                                      max_new_tokens=max_new_tokens, seed=i, mode=mode)
            calls = [(c.name, c.arguments) for c in res.calls]
            error, fwd = None, res.stats.forward_passes
        except DgemmaStructError as err:
            calls, error, fwd = [], type(err).__name__, 0
        wall = time.perf_counter() - t0
        names_ok, acc = call_scores(calls, e["fields"]["calls"])
        rows["constrained"].append(dict(parsed=error is None, valid=error is None and _valid(calls, e["tools"]),
                                        names=names_ok, acc=acc, wall=wall, fwd=fwd, error=error))
    out = {}
    for arm, rs in rows.items():
        out[arm] = {"requests": len(rs), "parsed": sum(r["parsed"] for r in rs) / len(rs),
                    "valid_calls": sum(r["valid"] for r in rs) / len(rs),
                    "tool_names_exact": sum(r["names"] for r in rs) / len(rs),
                    "argument_accuracy": statistics.mean(r["acc"] for r in rs),
                    "typed_errors": sorted({r["error"] for r in rs if r["error"]}),
                    "n_typed_errors": sum(r["error"] is not None for r in rs),
                    "wall_ms_p50": 1000 * statistics.median(r["wall"] for r in rs),
                    "forwards_mean": statistics.mean(r["fwd"] for r in rs)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=400, help="held-out examples drawn; their tool prompts are used")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--out", default="docs/results/tool_prompts_eval.json")
    ap.add_argument("--model", default=None, help="local checkpoint directory (default: the embedded model)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rt = load_runtime(args.model, "auto", "auto")   # a local directory only, never the hub
    examples = [e for e in make_corpus(args.n, seed=HELD_OUT_SEED) if e["kind"] == "tool" and not e["thinking"]]
    report = {"model": rt.name, "held_out": f"make_corpus({args.n}, seed={HELD_OUT_SEED}), tool prompts",
              "n": len(examples), "max_new_tokens": args.max_new_tokens,
              "modes": {m: run(rt, examples, m, args.max_new_tokens) for m in ("diffusion", "ar")}}
    Path(args.out).write_text(json.dumps(report, indent=1))
    lines = [f"# Tool prompts on the embedded model ({len(examples)} held-out requests)", "",
             "| mode | arm | valid calls | tool names exact | argument accuracy | typed errors | p50 ms | forwards |",
             "|---|---|--:|--:|--:|--:|--:|--:|"]
    for m, arms in report["modes"].items():
        for arm, s in arms.items():
            lines.append(f"| {m} | {arm} | {s['valid_calls']:.1%} | {s['tool_names_exact']:.1%} | "
                         f"{s['argument_accuracy']:.1%} | {s['n_typed_errors']} | {s['wall_ms_p50']:.0f} | "
                         f"{s['forwards_mean']:.1f} |")
    Path(args.out).with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
