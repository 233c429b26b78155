"""Runtime benchmark: our block-diffusion loop vs transformers' ``model.generate``.

Same prompts, same seeds, same settings, measured side by side in one run (alternating which goes
first). Reports: identical outputs, the wall-time ratio ours / transformers (goal <= 1.05), the
model-forward share of our wall time, and TPF of the embedded model.

    OMP_NUM_THREADS=1 python benchmarks/runtime.py --n 24
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch

from dgemma_struct.engine.canvas import diffusion_loop
from dgemma_struct.engine.model_config import real_shape_config
from dgemma_struct.runtime import DiffusionRuntime
from dgemma_struct.engine.sampler import DiffusionSettings
from dgemma_struct.training.corpus import make_corpus
from dgemma_struct.training.evaluate import HELD_OUT_SEED

ROOT = Path(__file__).resolve().parents[1]


def compare(model, rt_like: dict, prompts_ids: list[torch.Tensor], settings, max_new_tokens: int) -> dict:
    """Runs our loop and ``model.generate`` on each prompt with the same seed, alternating which
    goes first, and returns identical-output count, wall-time ratios, forward share and TPF."""
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

    s = settings
    ours_t, ref_t, same, model_share, tpf = [], [], 0, [], []
    for i, ids in enumerate(prompts_ids):
        mask = torch.ones_like(ids)

        def run_ref():
            torch.manual_seed(i)
            t0 = time.perf_counter()
            out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                 eos_token_id=rt_like["eos"], pad_token_id=rt_like["pad"],
                                 max_denoising_steps=s.max_denoising_steps,
                                 sampler_config=EntropyBoundSamplerConfig(entropy_bound=s.entropy_bound),
                                 t_min=s.t_min, t_max=s.t_max, stability_threshold=s.stability_threshold,
                                 confidence_threshold=s.confidence_threshold)
            return out, time.perf_counter() - t0

        def run_ours():
            torch.manual_seed(i)
            t0 = time.perf_counter()
            out = diffusion_loop(model, ids, mask, max_new_tokens=max_new_tokens, settings=s,
                                 eos_token_ids=rt_like["eos"], pad_token_id=rt_like["pad"])
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
        tpf.append(float((new != rt_like["pad"]).sum()) / float(ours.forward_passes[0]))
    ratios = [a / b for a, b in zip(ours_t, ref_t)]
    return {
        "n": len(prompts_ids), "identical_outputs": same, "settings": dataclasses.asdict(s),
        "wall_ratio_ours_over_transformers_median": statistics.median(ratios),
        "wall_ratio_total": sum(ours_t) / sum(ref_t),
        "ours_ms_median": 1000 * statistics.median(ours_t), "transformers_ms_median": 1000 * statistics.median(ref_t),
        "model_forward_share_median": statistics.median(model_share),
        "tokens_per_forward_mean": statistics.mean(tpf),
    }


def _rows(r: dict) -> list[str]:
    return [f"| identical outputs | {r['identical_outputs']}/{r['n']} |",
            f"| wall time ours / transformers (median of per-prompt ratios) | {r['wall_ratio_ours_over_transformers_median']:.3f} |",
            f"| wall time ours / transformers (totals) | {r['wall_ratio_total']:.3f} |",
            f"| median ms per request, ours / transformers | {r['ours_ms_median']:.1f} / {r['transformers_ms_median']:.1f} |",
            f"| model-forward share of our wall time (median) | {r['model_forward_share_median']:.1%} |",
            f"| tokens per forward (mean) | {r['tokens_per_forward_mean']:.2f} |"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--real-shape-n", type=int, default=2,
                    help="prompts for the real-shape random model (canvas 256, vocab 262,144); 0 skips it")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    rt = DiffusionRuntime.default()
    prompts = [torch.tensor([rt.encode_prompt(e["prompt"])]) for e in make_corpus(args.n, seed=HELD_OUT_SEED)]
    result = {"embedded": compare(rt.model, {"eos": rt.eos_token_ids, "pad": rt.pad_token_id}, prompts,
                                  rt.settings, args.max_new_tokens)}
    if args.real_shape_n:
        from transformers import DiffusionGemmaForBlockDiffusion

        torch.manual_seed(0)
        big = DiffusionGemmaForBlockDiffusion(real_shape_config()).eval()
        g = torch.Generator().manual_seed(1)
        ids = [torch.randint(10, 262_144, (1, 24), generator=g) for _ in range(args.real_shape_n)]
        # random weights never get confident: a short step budget keeps this to a few minutes
        s = DiffusionSettings(max_denoising_steps=8, entropy_bound=0.5)
        result["real_shape"] = compare(big, {"eos": [1], "pad": 0}, ids, s, 256)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "runtime.json").write_text(json.dumps(result, indent=1))
    md = ["# Runtime benchmark: our loop vs `model.generate`", "",
          "Same seed and settings for both, run alternately in one process, one thread "
          "(`python benchmarks/runtime.py`). Goal: identical outputs, wall-time ratio ≤ 1.05.", "",
          f"## Embedded model ({args.n} held-out prompts, its generation config)", "",
          "| metric | value |", "|---|---|", *_rows(result["embedded"])]
    if "real_shape" in result:
        md += ["", f"## Real checkpoint's shape, random weights ({args.real_shape_n} prompts)", "",
               "`real_shape_config()`: canvas 256, vocab 262,144, 5:1 sliding/full layers, narrow and shallow so it "
               "runs on a CPU; one 256-token canvas, 8 denoising steps. Here sampling and entropy over 256 × 262,144 "
               "logits dominate, so this row measures the loop's own vocab-sized work against transformers'.", "",
               "| metric | value |", "|---|---|", *_rows(result["real_shape"])]
    (out / "runtime.md").write_text("\n".join(md) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
