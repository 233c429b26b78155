"""BFCL tool declarations through the native Gemma 4 tool-call constraint.

The four BFCL subsets of JSONSchemaBench (simple, multiple, parallel, parallel_multiple) hold each
test's functions as one JSON Schema (``{"anyOf": [{"properties": {NAME: ARGS}}, ...]}``). Each
``NAME: ARGS`` becomes a declared tool; the prompt is written from the BFCL ground truth. Measured:
compile rate (all records), and on a sample per subset, in diffusion and AR mode on a random-weight
DiffusionGemma of the real shape (vocab 262,144, canvas 256) with the Gemma 4 tokenizer: the share of
requests returning calls that validate against the record's original schema (goal 100%), typed
failures, wall time and forward passes per request. Random weights write nonsense: validity here is
entirely the constraint's doing; accuracy needs a trained model.

    python benchmarks/tool_calls_bfcl.py --per-subset 12 --diffusion-per-subset 3 --out docs/results/tool_calls_bfcl.json
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "jsonschemabench"
TOK = ROOT.parent / "shared" / "data" / "gemma4-tokenizer"
SUBSETS = ["BFCL_simple", "BFCL_multiple", "BFCL_parallel", "BFCL_parallel_multiple"]


def tools_of(schema: dict) -> list[dict]:
    branches = schema.get("anyOf") or [schema]
    out = []
    for b in branches:
        for name, args in (b.get("properties") or {}).items():
            out.append({"type": "function", "function": {"name": name, "parameters": args}})
    return out


def prompt_of(rec: dict) -> str:
    truth = next((t["data"] for t in rec.get("tests", []) if t.get("valid")), None)
    if not truth:
        return "Call the right function."
    parts = [f"{name} with " + ", ".join(f"{k} = {v}" for k, v in args.items()) for name, args in truth.items()]
    return "Please call " + "; and ".join(parts) + "."


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-subset", type=int, default=12)
    ap.add_argument("--diffusion-per-subset", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "tool_calls_bfcl.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    from jsonschema import Draft202012Validator
    from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion

    from dgemma_struct.errors import DgemmaStructError
    from dgemma_struct.engine.model_config import real_shape_config
    from dgemma_struct.runtime import DiffusionRuntime
    from dgemma_struct.tools import compile_tool_calls, generate_tool_calls

    tok = AutoTokenizer.from_pretrained(str(TOK))
    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(real_shape_config()).eval()
    gc = model.generation_config
    gc.eos_token_id, gc.pad_token_id, gc.max_denoising_steps = [1, 106, 50], 0, 4
    rt = DiffusionRuntime(model, tok)
    report: dict = {"subsets": {}, "model": "random-weight real shape (vocab 262,144, canvas 256), Gemma 4 tokenizer"}
    for sub in SUBSETS:
        recs = [json.loads(line) for line in gzip.open(DATA / f"{sub}.jsonl.gz", "rt")]
        compiled, compile_ms, compile_errors = [], [], {}
        for rec in recs:
            t0 = time.perf_counter()
            try:
                compile_tool_calls(tools_of(rec["schema"]), tok, stop_token_ids=rt.eos_token_ids,
                                   parallel_tool_calls="parallel" in sub, tool_choice="required")
                compiled.append(rec)
            except DgemmaStructError as err:
                compile_errors[type(err).__name__] = compile_errors.get(type(err).__name__, 0) + 1
            compile_ms.append((time.perf_counter() - t0) * 1e3)
        row = {"records": len(recs), "compiled": len(compiled), "compile_errors": compile_errors,
               "compile_ms_p50": statistics.median(compile_ms), "modes": {}}
        step = max(1, len(compiled) // max(1, args.per_subset))
        sample = compiled[::step][:args.per_subset]
        for mode, n in (("ar", len(sample)), ("diffusion", args.diffusion_per_subset)):
            valid = failures = untyped = 0
            walls, forwards, calls = [], [], 0
            errs: dict[str, int] = {}
            for rec in sample[:n]:
                validator = Draft202012Validator(rec["schema"])
                t0 = time.perf_counter()
                try:
                    res = generate_tool_calls(prompt_of(rec), tools_of(rec["schema"]), tool_choice="required",
                                              parallel_tool_calls="parallel" in sub, runtime=rt, mode=mode,
                                              max_new_tokens=args.max_new_tokens, max_repairs=1)
                except DgemmaStructError as err:
                    failures += 1
                    errs[type(err).__name__] = errs.get(type(err).__name__, 0) + 1
                    continue
                except Exception as err:  # noqa: BLE001 - counted: an untyped error is a bug
                    untyped += 1
                    errs["untyped:" + type(err).__name__] = errs.get("untyped:" + type(err).__name__, 0) + 1
                    continue
                finally:
                    walls.append(time.perf_counter() - t0)
                ok = bool(res.calls) and all(validator.is_valid({c.name: c.arguments}) for c in res.calls)
                valid += ok
                calls += len(res.calls)
                forwards.append(res.stats.forward_passes)
            row["modes"][mode] = {"requests": n, "valid_calls": valid, "typed_failures": failures, "untyped": untyped,
                                  "errors": errs, "calls": calls,
                                  "valid_share_of_returned": valid / max(1, n - failures - untyped),
                                  "wall_s_median": statistics.median(walls) if walls else None,
                                  "forwards_median": statistics.median(forwards) if forwards else None}
            print(sub, mode, row["modes"][mode], file=sys.stderr, flush=True)
        report["subsets"][sub] = row
        print(sub, {k: v for k, v in row.items() if k != "modes"}, file=sys.stderr, flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
