"""GPU benchmark of the Triton masking kernels (prepared for one H200; self-contained).

Needs only torch + triton (+ numpy): it imports the kernel modules from this checkout's
``kernels/`` folder as the top-level package ``kernels`` (no other project dependency), so on a
bare machine run from the repository root::

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_kernels.py          # writes $OUT/kernels_gpu.json

Measures, on fp32 logits ``[B*256, 262144]`` for B = 1, 4:

* a device-to-device copy (``dst.copy_(src)``) to get the *measured* HBM bandwidth,
* ``apply_token_bitmask_`` (Triton vs the torch path, and xgrammar's Triton kernel if importable),
* ``masked_stats`` (Triton fused one-pass vs the torch path), with and without Gumbel sampling,

and reports achieved GB/s and the fraction of the measured bandwidth bound for the bytes each
kernel must move. Correctness of Triton vs torch is checked on every shape first. Results are
written under ``$OUT`` (default ``./device_out``) after every shape, so a run cut short keeps what
it measured. ``benchmarks/device_check.py`` (part a) runs the same comparison inside the one
prepared GPU call.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import kernels as K  # noqa: E402  (this repo's kernels/ folder == dgemma_struct.kernels)
from kernels import triton_masking as TM  # noqa: E402

VOCAB = 262_144
NOMINAL_TBPS = 4.8  # H200 datasheet; the bound below uses the measured copy bandwidth


def bench(fn, reps: int = 30, warmup: int = 5) -> dict:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return {"median_ms": statistics.median(ts), "min_ms": ts[0], "p90_ms": ts[int(0.9 * (len(ts) - 1))]}


def measured_bandwidth_gbps() -> float:
    n = 1 << 28  # 1 GiB fp32
    src = torch.empty(n, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    r = bench(lambda: dst.copy_(src), reps=20)
    del src, dst
    return 2 * n * 4 / (r["min_ms"] / 1e3) / 1e9


def make_bitmask(rows: int, density: float, gen: torch.Generator) -> torch.Tensor:
    allowed = torch.rand(rows, VOCAB, generator=gen, device="cuda") < density
    return K.pack_bool_mask(allowed), allowed


def entry(name, r, nbytes, bw):
    gbps = nbytes / (r["median_ms"] / 1e3) / 1e9
    return {"op": name, **r, "bytes": nbytes, "GB_per_s": gbps, "frac_of_measured_bw": gbps / bw}


def dump(out: dict) -> None:
    """Write what has been measured so far (called after every shape and at the end)."""
    dest = Path(os.environ.get("OUT") or "device_out")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "kernels_gpu.json").write_text(json.dumps(out, indent=2) + "\n")


def main() -> None:
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    t_start = time.time()
    dev = torch.cuda.get_device_name()
    bw = measured_bandwidth_gbps()
    print(f"device={dev} measured copy bandwidth={bw:.0f} GB/s", flush=True)
    try:
        import xgrammar  # noqa: F401

        try:
            from xgrammar.kernels.apply_token_bitmask_inplace_triton import apply_token_bitmask_inplace_triton as xgr_apply
        except Exception:  # pragma: no cover - API moved between versions
            xgr_apply = None
        xgr_note = f"xgrammar {getattr(xgrammar, '__version__', '?')} " + ("triton kernel found" if xgr_apply else
                                                                          "imported but its triton kernel was not found")
    except Exception as exc:  # noqa: BLE001
        xgr_apply, xgr_note = None, f"xgrammar not importable ({type(exc).__name__}); no comparison"
    print(xgr_note, flush=True)

    gen = torch.Generator(device="cuda").manual_seed(0)
    out: dict = {"device": dev, "torch": torch.__version__, "triton": __import__("triton").__version__,
                 "measured_copy_GBps": bw, "nominal_TBps": NOMINAL_TBPS, "xgrammar": xgr_note, "shapes": []}
    dump(out)
    for b in (1, 4):
        try:
            rows = b * 256
            logits = torch.randn(rows, VOCAB, device="cuda", generator=gen) * 4
            width = VOCAB // 32
            shape_res: dict = {"B": b, "rows": rows, "vocab": VOCAB, "results": [], "checks": {}}
            for density in (0.01, 0.5):
                bm, allowed = make_bitmask(rows, density, gen)
                # correctness: Triton vs torch path
                x1, x2 = logits.clone(), logits.clone()
                K.apply_token_bitmask_(x1, bm, backend="triton")
                K.apply_token_bitmask_(x2, bm, backend="torch")
                shape_res["checks"][f"apply_equal_d{density}"] = bool(torch.equal(x1, x2))
                del x1, x2
                banned = int((~allowed).sum())
                del allowed
                apply_bytes = rows * width * 4 + banned * 4  # read bitmask + write banned logits
                work = logits.clone()
                for blk in (2048, 4096, 8192):
                    r = bench(lambda: TM.apply_token_bitmask_triton_(work, bm, None, block=blk))
                    shape_res["results"].append(entry(f"apply triton block={blk} density={density}", r, apply_bytes, bw))
                r = bench(lambda: K.apply_token_bitmask_(work, bm, backend="torch"), reps=10)
                shape_res["results"].append(entry(f"apply torch density={density}", r, apply_bytes, bw))
                if xgr_apply is not None:
                    try:
                        r = bench(lambda: xgr_apply(work, bm))
                        shape_res["results"].append(entry(f"apply xgrammar-triton density={density}", r,
                                                          rows * width * 4 + 2 * rows * VOCAB * 4, bw))
                    except Exception as exc:  # noqa: BLE001
                        shape_res["checks"]["xgrammar_error"] = repr(exc)[:300]
                del work
                if density != 0.01:
                    continue
                # stats: correctness then timing
                temp = torch.full((rows,), 0.8, device="cuda")
                st_t = K.masked_stats(logits, bm, temperature=0.8, backend="triton")
                st_r = K.masked_stats(logits, bm, temperature=0.8, backend="torch")
                shape_res["checks"]["stats_max_abs_err"] = {
                    k: float((getattr(st_t, k) - getattr(st_r, k)).abs().max()) for k in ("max", "logsumexp", "entropy")}
                shape_res["checks"]["stats_argmax_equal"] = bool(torch.equal(st_t.argmax, st_r.argmax))
                stats_bytes = rows * VOCAB * 4 + rows * width * 4
                best = None
                for blk in (1024, 2048, 4096, 8192):
                    for nw in (4, 8, 16):
                        r = bench(lambda: TM.masked_stats_triton(logits, bm, temp, block=blk, num_warps=nw), reps=20)
                        e = entry(f"stats triton block={blk} warps={nw}", r, stats_bytes, bw)
                        shape_res["results"].append(e)
                        if best is None or e["median_ms"] < best[0]["median_ms"]:
                            best = (e, blk, nw)
                _, blk, nw = best
                r = bench(lambda: TM.masked_stats_triton(logits, bm, temp, gumbel=True, seed=1, block=blk, num_warps=nw),
                          reps=20)
                shape_res["results"].append(entry(f"stats+gumbel triton block={blk} warps={nw}", r, stats_bytes, bw))
                r = bench(lambda: K.masked_stats(logits, bm, temperature=0.8, backend="torch"), reps=5, warmup=1)
                shape_res["results"].append(entry("stats torch", r, stats_bytes, bw))
                r = bench(lambda: K.masked_stats(logits, bm, temperature=0.8, gumbel=True, seed=1, backend="torch"),
                          reps=5, warmup=1)
                shape_res["results"].append(entry("stats+gumbel torch", r, stats_bytes, bw))
            out["shapes"].append(shape_res)
            dump(out)
            del logits
            torch.cuda.empty_cache()
            print(json.dumps(shape_res, indent=1), flush=True)
        except Exception as exc:  # noqa: BLE001 - record it, keep the other shapes
            out["shapes"].append({"B": b, "error": f"{type(exc).__name__}: {exc}"[:2000]})
            dump(out)
            print(f"B={b} failed: {type(exc).__name__}: {exc}"[:2000], flush=True)
            torch.cuda.empty_cache()
    # headline: best triton vs torch per op/shape
    heads = []
    for s in out["shapes"]:
        res = s.get("results", [])
        for op, tri_prefix, torch_name in [
            ("apply d=0.01", "apply triton", "apply torch density=0.01"),
            ("stats", "stats triton", "stats torch"),
        ]:
            tri = [r for r in res if r["op"].startswith(tri_prefix) and ("density=0.01" in r["op"] or op == "stats")]
            tor = [r for r in res if r["op"] == torch_name]
            if tri and tor:
                bt = min(tri, key=lambda r: r["median_ms"])
                heads.append({"B": s["B"], "op": op, "best_triton": bt["op"], "triton_ms": bt["median_ms"],
                              "triton_GBps": bt["GB_per_s"], "frac_bw": bt["frac_of_measured_bw"],
                              "torch_ms": tor[0]["median_ms"], "speedup_vs_torch": tor[0]["median_ms"] / bt["median_ms"]})
    out["headline"] = heads
    out["wall_s"] = time.time() - t_start
    print("SUMMARY_JSON_BEGIN\n" + json.dumps({"headline": heads, "measured_copy_GBps": bw, "xgrammar": xgr_note}, indent=1)
          + "\nSUMMARY_JSON_END", flush=True)
    dump(out)


if __name__ == "__main__":
    main()
