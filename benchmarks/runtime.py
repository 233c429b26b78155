"""Runtime benchmark: our block-diffusion loop vs transformers' ``model.generate``.

Same prompts, same seeds, same settings, measured side by side in one run (alternating which goes
first). Reports: identical outputs, the wall-time ratio ours / transformers (goal <= 1.05), the
model-forward share of our wall time, and TPF of the embedded model.

    OMP_NUM_THREADS=1 python benchmarks/runtime.py --n 24
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from dgemma_struct.canvas import diffusion_loop
from dgemma_struct.runtime import DiffusionRuntime
from dgemma_struct.training.corpus import make_corpus
from dgemma_struct.training.evaluate import HELD_OUT_SEED

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", default=str(ROOT / "docs" / "results"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    rt = DiffusionRuntime.default()
    model, s = rt.model, rt.settings
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

    prompts = [e["prompt"] for e in make_corpus(args.n, seed=HELD_OUT_SEED)]
    ours_t, ref_t, same, model_share, tpf = [], [], 0, [], []
    for i, p in enumerate(prompts):
        ids = torch.tensor([rt.encode_prompt(p)])
        mask = torch.ones_like(ids)

        def run_ref():
            torch.manual_seed(i)
            t0 = time.perf_counter()
            out = model.generate(ids, attention_mask=mask, max_new_tokens=args.max_new_tokens,
                                 eos_token_id=rt.eos_token_ids, pad_token_id=rt.pad_token_id,
                                 max_denoising_steps=s.max_denoising_steps,
                                 sampler_config=EntropyBoundSamplerConfig(entropy_bound=s.entropy_bound),
                                 t_min=s.t_min, t_max=s.t_max, stability_threshold=s.stability_threshold,
                                 confidence_threshold=s.confidence_threshold)
            return out, time.perf_counter() - t0

        def run_ours():
            torch.manual_seed(i)
            t0 = time.perf_counter()
            out = diffusion_loop(model, ids, mask, max_new_tokens=args.max_new_tokens, settings=s,
                                 eos_token_ids=rt.eos_token_ids, pad_token_id=rt.pad_token_id)
            return out, time.perf_counter() - t0

        if i % 2:
            (ref, rt_s), (ours, our_s) = run_ref(), run_ours()
        else:
            (ours, our_s), (ref, rt_s) = run_ours(), run_ref()
        same += int(torch.equal(ours.sequences, ref.sequences))
        ours_t.append(our_s)
        ref_t.append(rt_s)
        model_share.append(ours.model_s / our_s)
        new = ours.sequences[0, ids.shape[1]:]
        tpf.append(float((new != rt.pad_token_id).sum()) / float(ours.forward_passes[0]))
    ratios = [a / b for a, b in zip(ours_t, ref_t)]
    result = {
        "n": args.n, "identical_outputs": same, "settings": s.__dict__,
        "wall_ratio_ours_over_transformers_median": statistics.median(ratios),
        "wall_ratio_total": sum(ours_t) / sum(ref_t),
        "ours_ms_median": 1000 * statistics.median(ours_t), "transformers_ms_median": 1000 * statistics.median(ref_t),
        "model_forward_share_median": statistics.median(model_share),
        "tokens_per_forward_mean": statistics.mean(tpf),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "runtime.json").write_text(json.dumps(result, indent=1))
    md = ["# Runtime benchmark: our loop vs `model.generate`", "",
          f"Embedded model, {args.n} held-out prompts, one thread, same seed and settings for both, run "
          "alternately in one process (`python benchmarks/runtime.py`).", "",
          "| metric | value |", "|---|---|",
          f"| identical outputs | {same}/{args.n} |",
          f"| wall time ours / transformers (median of per-prompt ratios) | {result['wall_ratio_ours_over_transformers_median']:.3f} |",
          f"| wall time ours / transformers (totals) | {result['wall_ratio_total']:.3f} |",
          f"| median ms per request, ours / transformers | {result['ours_ms_median']:.1f} / {result['transformers_ms_median']:.1f} |",
          f"| model-forward share of our wall time (median) | {result['model_forward_share_median']:.1%} |",
          f"| tokens per forward (mean) | {result['tokens_per_forward_mean']:.2f} |"]
    (out / "runtime.md").write_text("\n".join(md) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
