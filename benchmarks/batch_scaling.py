"""Batch scaling of constrained generation (issue #14): valid outputs/s, repairs per row, forwards
per row and same-output-as-B=1 for batch sizes B (default 1, 4, 16, 64), constrained diffusion and
constrained AR, on the embedded model and the held-out corpus; this tree and (``--old-src``) an
older one, side by side in one run.

Each tree runs in its own worker process (``PYTHONPATH`` = that tree's ``src``; the editable
install's ``dgemma_struct.kernels`` / ``.grammars`` are re-pointed at that tree too), loaded once;
the driver sends the workers one cell (mode, B) at a time, alternating the trees (and which tree
goes first in each repeat), so slow drift of the box hits both arms alike. B=1 is ``generate`` per
request; B>1 is ``generate_batch`` over consecutive chunks of B requests, one seed per request
(``seed + i``), so every row's output should equal its B=1 output. Every value is checked again
here with ``jsonschema`` (format checker on). Timings: the median over ``--repeats``.

    git worktree add --detach /tmp/old_bench <old commit>
    OMP_NUM_THREADS=1 python benchmarks/batch_scaling.py --old-src /tmp/old_bench/src          # full run
    OMP_NUM_THREADS=1 python benchmarks/batch_scaling.py --n 4 --batch 1 4 --repeats 1          # smoke run

Writes ``docs/results/batch_scaling.{json,md}`` and ``docs/img/batch_scaling.png`` (valid
outputs/s vs B, both modes, both trees; repairs per row vs B).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODES = ("diffusion", "ar")


# ---------------------------------------------------------------- which source tree a process runs

def tree_root(src: str | os.PathLike) -> Path:
    """The repository root of a tree given as its ``src`` directory or as the root itself."""
    p = Path(src).resolve()
    if (p / "dgemma_struct").is_dir() and p.name == "src":
        return p.parent
    if (p / "src" / "dgemma_struct").is_dir():
        return p
    raise SystemExit(f"{src}: neither a source tree's src/ nor its root (no dgemma_struct package found)")


def pin_tree(root: str | os.PathLike) -> None:
    """Make this process import ``dgemma_struct`` from ``root``: ``root/src`` first on sys.path, and
    the editable install's finder (which maps ``dgemma_struct.kernels`` / ``.grammars`` to the
    installed checkout's top-level ``kernels/`` / ``grammars/``) re-pointed at ``root``. Call it
    before anything imports ``dgemma_struct``."""
    root = Path(root)
    sys.path.insert(0, str(root / "src"))
    for finder in sys.meta_path:
        mapping = getattr(sys.modules.get(getattr(finder, "__module__", ""), None), "MAPPING", None)
        if isinstance(mapping, dict) and "dgemma_struct" in mapping:
            mapping["dgemma_struct"] = str(root / "src" / "dgemma_struct")
            for sub in ("kernels", "grammars"):
                if (root / sub).is_dir():
                    mapping[f"dgemma_struct.{sub}"] = str(root / sub)


def loaded_from() -> dict[str, str]:
    """Where the imported ``dgemma_struct`` modules came from (a check that ``pin_tree`` worked)."""
    import dgemma_struct
    out = {"dgemma_struct": str(Path(dgemma_struct.__file__).parent)}
    try:
        import dgemma_struct.kernels as k
        out["kernels"] = str(Path(k.__file__).parent)
    except ImportError:
        pass
    return out


def tree_info(root: Path) -> dict[str, Any]:
    """The tree's commit and whether it has uncommitted changes (best effort)."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                                  timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"root": str(root), "commit": git("rev-parse", "HEAD"), "dirty": bool(status),
            "dirty_files": status.splitlines()[:20]}


def write_results(result: dict[str, Any], out: str | os.PathLike, markdown: Any) -> tuple[Path, Path]:
    """``{out}.json`` (the results) and ``{out}.md`` (``markdown(result)``, also printed): the docs
    tables are generated from the results file, never copied by hand. Returns the two paths."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    js, mdp = Path(f"{out}.json"), Path(f"{out}.md")
    js.write_text(json.dumps(result, indent=1, default=str))
    md = markdown(result)
    mdp.write_text(md)
    print("\n" + md)
    return js, mdp


def held_out(n: int) -> list[dict]:
    """The first ``n`` held-out corpus examples that carry a JSON schema (as batch_rows.py)."""
    from dgemma_struct.training.corpus import make_corpus
    from dgemma_struct.training.evaluate import HELD_OUT_SEED

    want, pool = n, max(400, 2 * n)
    while True:
        corpus = [e for e in make_corpus(pool, seed=HELD_OUT_SEED) if e.get("schema")]
        if len(corpus) >= want:
            return corpus[:want]
        pool *= 2


def schema_checker():
    """``check(value, schema) -> None or message``: an independent jsonschema check (formats on)."""
    import jsonschema

    cache: dict[str, Any] = {}

    def check(value: Any, schema: dict) -> str | None:
        key = json.dumps(schema, sort_keys=True)
        if key not in cache:
            cls = jsonschema.validators.validator_for(schema)
            cache[key] = cls(schema, format_checker=cls.FORMAT_CHECKER)
        err = jsonschema.exceptions.best_match(cache[key].iter_errors(value))
        return None if err is None else err.message[:200]
    return check


# ---------------------------------------------------------------- worker (one per tree)

def worker(root: str, n: int, seed: int, threads: int) -> None:
    """Serve cells over stdin/stdout: one JSON line in (``{"mode", "batch"}`` or ``{"quit"}``), one
    JSON line out. Anything the library prints goes to stderr."""
    proto = sys.stdout
    sys.stdout = sys.stderr
    pin_tree(root)
    import torch

    from dgemma_struct import DiffusionRuntime, generate, generate_batch

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    rt = DiffusionRuntime.default()
    load_s = time.perf_counter() - t0
    corpus = held_out(n)
    prompts, schemas = [e["prompt"] for e in corpus], [e["schema"] for e in corpus]
    seeds = [seed + i for i in range(n)]
    check = schema_checker()
    # warm-up: every distinct schema compiled once, first-call costs of both modes paid
    t0 = time.perf_counter()
    seen: set[str] = set()
    for p, s in zip(prompts, schemas):
        key = json.dumps(s, sort_keys=True)
        if key not in seen:
            seen.add(key)
            generate(p, s, runtime=rt, seed=seed)
    for mode in MODES:
        generate(prompts[0], schemas[0], runtime=rt, seed=seed, mode=mode)
    if n > 1:  # a small batch in each mode: batched first-call costs
        for mode in MODES:
            generate_batch(prompts[:2], schemas[:2], runtime=rt, seed=seeds[:2], mode=mode, return_exceptions=True)
    warm_s = time.perf_counter() - t0

    def send(obj: dict) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    send({"ready": True, "load_s": load_s, "warmup_s": warm_s, "distinct_schemas": len(seen),
          "loaded_from": loaded_from(), "torch": torch.__version__, "threads": torch.get_num_threads()})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("quit"):
            return
        mode, b = cmd["mode"], int(cmd["batch"])
        t0 = time.perf_counter()
        rows: list[Any] = []
        if b == 1:
            for p, s, sd in zip(prompts, schemas, seeds):
                try:
                    rows.append(generate(p, s, runtime=rt, seed=sd, mode=mode, return_details=True))
                except Exception as err:  # noqa: BLE001 - a failed request is counted, not fatal
                    rows.append(err)
        else:
            for i in range(0, n, b):
                rows += generate_batch(prompts[i:i + b], schemas[i:i + b], runtime=rt, seed=seeds[i:i + b],
                                       mode=mode, return_exceptions=True)
        wall = time.perf_counter() - t0
        out: dict[str, Any] = {"mode": mode, "batch": b, "n": n, "wall_s": wall, "texts": [], "errors": [],
                               "invalid": [], "repairs": 0, "junk_repairs": 0, "fallbacks": 0,
                               "forwards": 0, "ok": 0}
        for i, r in enumerate(rows):
            if isinstance(r, Exception):
                out["texts"].append(None)
                out["errors"].append(f"{i}: {type(r).__name__}: {str(r)[:160]}")
                continue
            out["texts"].append(r.text)
            st = r.stats
            out["repairs"] += st.repairs
            out["junk_repairs"] += getattr(st, "junk_repairs", 0)
            out["fallbacks"] += int(bool(getattr(st, "fallback", False)))
            out["forwards"] += getattr(st, "forward_passes", 0)
            try:
                value = json.loads(r.text)
            except ValueError as err:
                out["invalid"].append(f"{i}: not JSON: {err}")
                continue
            msg = check(value, schemas[i])
            if msg is not None:
                out["invalid"].append(f"{i}: {msg}")
                continue
            out["ok"] += 1
        send(out)


class Arm:
    """A worker process for one tree."""

    def __init__(self, label: str, root: Path, a: argparse.Namespace, logdir: Path):
        self.label, self.root = label, root
        self.log_path = logdir / f"batch_scaling_{label}.log"
        self.log = open(self.log_path, "w")
        env = dict(os.environ, PYTHONPATH=str(root / "src"), OMP_NUM_THREADS=str(a.threads),
                   MKL_NUM_THREADS=str(a.threads))
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", str(root),
                                      "--n", str(a.n), "--seed", str(a.seed), "--threads", str(a.threads)],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, bufsize=1)

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.log.flush()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            tail = self.log_path.read_text()[-3000:]
            raise SystemExit(f"worker {self.label} ({self.root}) died (rc={self.proc.poll()}); log tail:\n{tail}")
        return json.loads(line)

    def run(self, mode: str, batch: int) -> dict:
        self.proc.stdin.write(json.dumps({"mode": mode, "batch": batch}) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        try:
            self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
        self.log.close()


# ---------------------------------------------------------------- summary, table, plot

def crossover(bs: list[int], diff: list[float], ar: list[float]) -> dict[str, Any]:
    """Where constrained AR's valid outputs/s overtakes diffusion's (or the reverse), as B
    interpolated linearly in log2(B) between the measured sizes."""
    d = [x - y for x, y in zip(diff, ar)]   # > 0: diffusion ahead
    for k in range(1, len(bs)):
        if (d[k - 1] > 0) != (d[k] > 0):
            x0, x1 = math.log2(bs[k - 1]), math.log2(bs[k])
            frac = d[k - 1] / (d[k - 1] - d[k]) if d[k - 1] != d[k] else 0.5
            b = 2 ** (x0 + frac * (x1 - x0))
            lead = "ar" if d[k] < 0 else "diffusion"
            return {"b": round(b, 1), "between": [bs[k - 1], bs[k]], "ahead_after": lead,
                    "text": f"{'AR' if lead == 'ar' else 'diffusion'} overtakes at B≈{b:.1f} "
                            f"(between {bs[k - 1]} and {bs[k]})"}
    if not d:
        return {"b": None, "text": "no data"}
    lead = "diffusion" if d[0] > 0 else "AR"
    return {"b": None, "text": f"no crossover for B in {bs[0]}..{bs[-1]}: {lead} ahead throughout"}


def summarize(cells: dict, labels: list[str], modes: list[str], bs: list[int]) -> dict:
    """Per arm, mode and B: medians over repeats, ratios against B=1, the targets of issue #14."""
    summary: dict[str, Any] = {}
    for label in labels:
        s = summary[label] = {"modes": {}}
        for mode in modes:
            m = s["modes"][mode] = {}
            ref = cells[label][mode].get(1) or cells[label][mode][bs[0]]
            ref_texts = ref[0]["texts"]
            for b in bs:
                runs = cells[label][mode][b]
                first = runs[0]
                n = first["n"]
                ok_rows = n - len(first["errors"])
                walls = [r["wall_s"] for r in runs]
                wall = statistics.median(walls)
                m[b] = {"n": n, "effective_batch": min(b, n), "wall_s": wall, "wall_s_all": walls,
                        "valid_per_s": first["ok"] / wall, "valid": first["ok"], "errors": len(first["errors"]),
                        "invalid": len(first["invalid"]),
                        "repairs_per_row": first["repairs"] / max(ok_rows, 1),
                        "junk_repairs_per_row": first["junk_repairs"] / max(ok_rows, 1),
                        "fallbacks": first["fallbacks"],
                        "forwards_per_row": first["forwards"] / max(ok_rows, 1),
                        "same_as_b1": sum(1 for x, y in zip(first["texts"], ref_texts) if x is not None and x == y),
                        "stable_across_repeats": all(r["texts"] == first["texts"] for r in runs),
                        "error_samples": first["errors"][:3], "invalid_samples": first["invalid"][:3]}
        targets: dict[str, Any] = {}
        if "diffusion" in modes and 1 in bs:
            d = s["modes"]["diffusion"]
            hi = max(bs)
            targets[f"diffusion_valid_per_s_B{hi}_over_B1"] = d[hi]["valid_per_s"] / max(d[1]["valid_per_s"], 1e-9)
            r1 = d[1]["repairs_per_row"]
            targets[f"diffusion_repairs_per_row_B{hi}_over_B1"] = (d[hi]["repairs_per_row"] / r1) if r1 else None
            targets[f"diffusion_repairs_per_row_B{hi}_minus_B1"] = d[hi]["repairs_per_row"] - r1
        if set(MODES) <= set(modes):
            targets["crossover"] = crossover(bs, [s["modes"]["diffusion"][b]["valid_per_s"] for b in bs],
                                             [s["modes"]["ar"][b]["valid_per_s"] for b in bs])
        s["targets"] = targets
    return summary


def markdown(result: dict) -> str:
    meta, summary, bs, modes = result["meta"], result["summary"], result["meta"]["batches"], result["meta"]["modes"]
    labels = list(summary)
    lines = []
    if meta["smoke"]:
        lines += ["> **SMOKE RUN** (tiny settings, a check that the script works; not a measurement).", ""]
    lines += ["# Batch scaling of constrained generation (issue #14)", "",
              f"`benchmarks/batch_scaling.py`, {meta['date']}: {meta['n']} held-out JSON-schema prompts, embedded "
              f"model, {meta['threads']} torch thread(s), {meta['cpu_count']} CPUs, median of {meta['repeats']} "
              f"repeat(s), cells interleaved between trees. B=1 is `generate` per request, B>1 `generate_batch` "
              f"in chunks of B; seeds `{meta['seed']} + i` per request.", ""]
    for label in labels:
        t = meta["trees"][label]
        lines.append(f"- **{label}**: `{t['commit'][:12]}`{' + uncommitted changes' if t['dirty'] else ''} "
                     f"({t['root']})")
    lines.append("")
    head = "| mode | B | " + " | ".join(f"{lab} valid/s" for lab in labels)
    head += " | " + " | ".join(f"{lab} repairs/row" for lab in labels)
    head += " | " + " | ".join(f"{lab} forwards/row" for lab in labels)
    head += " | " + " | ".join(f"{lab} same as B=1" for lab in labels)
    head += " | " + " | ".join(f"{lab} err/invalid" for lab in labels) + " |"
    lines += [head, "|---|--:|" + "--:|" * (5 * len(labels))]
    for mode in modes:
        for b in bs:
            c = [summary[lab]["modes"][mode][b] for lab in labels]
            eff = c[0]["effective_batch"]
            row = f"| {mode} | {b}{'' if eff == b else f' ({eff})'} | "
            row += " | ".join(f"{x['valid_per_s']:.2f}" for x in c) + " | "
            row += " | ".join(f"{x['repairs_per_row']:.3f}" for x in c) + " | "
            row += " | ".join(f"{x['forwards_per_row']:.1f}" for x in c) + " | "
            row += " | ".join(f"{x['same_as_b1']}/{x['n']}" for x in c) + " | "
            row += " | ".join(f"{x['errors']}/{x['invalid']}" for x in c) + " |"
            lines.append(row)
    lines += ["", "Forwards/row: the decoder forwards each row took part in (`stats.forward_passes`; a batched "
              "forward counts once for each of its rows).", "", "## Targets", ""]
    hi = max(bs)
    for label in labels:
        tg = summary[label]["targets"]
        parts = []
        k = f"diffusion_valid_per_s_B{hi}_over_B1"
        if k in tg:
            parts.append(f"diffusion valid/s B={hi} / B=1 = **{tg[k]:.2f}×** (target ≥ 4×)")
        k = f"diffusion_repairs_per_row_B{hi}_over_B1"
        if k in tg:
            r = tg[k]
            parts.append("diffusion repairs/row B=%d / B=1 = %s (target ≤ 1.5×)"
                         % (hi, f"**{r:.2f}×**" if r is not None else
                            f"n/a (0 repairs at B=1; B={hi} has "
                            f"{summary[label]['modes']['diffusion'][hi]['repairs_per_row']:.3f}/row)"))
        if "crossover" in tg:
            parts.append(f"diffusion/AR crossover: {tg['crossover']['text']}")
        lines.append(f"- **{label}**: " + "; ".join(parts))
    if len(labels) == 2:
        a, b = labels
        def gain(mode: str, x: int) -> float:
            return summary[b]["modes"][mode][x]["valid_per_s"] / max(summary[a]["modes"][mode][x]["valid_per_s"], 1e-9)
        lines.append(f"- **{b} / {a}** valid/s: " + ", ".join(f"{mode} B={x} {gain(mode, x):.2f}×"
                                                              for mode in modes for x in bs))
        if "same_b1_across_trees" in result:
            lines.append("- same B=1 output in both trees: " + ", ".join(
                f"{mode} {v}/{meta['n']}" for mode, v in result["same_b1_across_trees"].items()))
    bad = [(lab, mode, b, summary[lab]["modes"][mode][b]) for lab in labels for mode in modes for b in bs
           if summary[lab]["modes"][mode][b]["errors"] or summary[lab]["modes"][mode][b]["invalid"]]
    if bad:
        lines += ["", "## Errors / invalid outputs (samples)", ""]
        for lab, mode, b, c in bad:
            lines.append(f"- {lab} {mode} B={b}: " + "; ".join(c["error_samples"] + c["invalid_samples"]))
    if result.get("plot"):
        lines += ["", f"![valid outputs/s vs B]({os.path.relpath(result['plot'], ROOT / 'docs' / 'results')})"]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return False
    summary, bs, modes = result["summary"], result["meta"]["batches"], result["meta"]["modes"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {"diffusion": "tab:blue", "ar": "tab:orange"}
    styles = ["--", "-"] if len(summary) == 2 else ["-"]
    for (label, s), ls in zip(summary.items(), styles):
        for mode in modes:
            ys = [s["modes"][mode][b]["valid_per_s"] for b in bs]
            ax1.plot(bs, ys, ls, marker="o", color=colors.get(mode), label=f"{mode} ({label})")
            ax2.plot(bs, [s["modes"][mode][b]["repairs_per_row"] for b in bs], ls, marker="o",
                     color=colors.get(mode), label=f"{mode} ({label})")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(bs, [str(b) for b in bs])
        ax.set_xlabel("batch size B")
        ax.grid(alpha=0.3)
    ax1.set_ylabel("valid outputs / s")
    ax1.set_ylim(bottom=0)
    ax2.set_ylabel("repairs per row")
    ax2.set_ylim(bottom=0)
    ax1.legend(fontsize=8)
    title = "Constrained generation vs batch size (embedded model, CPU)"
    fig.suptitle(title + (" [SMOKE RUN]" if result["meta"]["smoke"] else ""))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ---------------------------------------------------------------- driver

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=64, help="requests per cell (default 64)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16, 64], help="batch sizes (default 1 4 16 64)")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--repeats", type=int, default=2, help="timed repeats of every cell; the median is reported")
    ap.add_argument("--seed", type=int, default=0, help="request i uses seed + i")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS") or 1),
                    help="torch threads per worker (default: $OMP_NUM_THREADS or 1)")
    ap.add_argument("--old-src", default=None, help="an older tree (its src/ or root) to run side by side")
    ap.add_argument("--new-src", default=str(ROOT / "src"),
                    help="the tree measured as 'new' (default: this checkout)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "batch_scaling"),
                    help="output path without extension (.json and .md are written)")
    ap.add_argument("--plot", default=str(ROOT / "docs" / "img" / "batch_scaling.png"))
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="mark the outputs as a smoke run (automatic for --n < 32)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker, a.n, a.seed, a.threads)
        return
    bs = sorted(set(a.batch))
    if 1 not in bs:
        print("note: B=1 is not in --batch; 'same as B=1' compares against the smallest B", file=sys.stderr)
    trees = ([("old", tree_root(a.old_src))] if a.old_src else []) + [("new", tree_root(a.new_src))]
    labels = [lab for lab, _ in trees]
    logdir = Path(tempfile.mkdtemp(prefix="batch_scaling_"))
    t_start = time.perf_counter()
    arms = {}
    for label, root in trees:
        arms[label] = Arm(label, root, a, logdir)
    ready = {}
    for label, arm in arms.items():
        ready[label] = r = arm.read()
        print(f"[{time.perf_counter() - t_start:6.1f}s] {label}: loaded from {r['loaded_from']}, "
              f"load {r['load_s']:.1f}s, warm-up {r['warmup_s']:.1f}s ({r['distinct_schemas']} schemas)", flush=True)
    cells: dict[str, dict[str, dict[int, list]]] = {lab: {m: {b: [] for b in bs} for m in a.modes} for lab in labels}
    try:
        for rep in range(a.repeats):
            order = labels if rep % 2 == 0 else labels[::-1]
            for mode in a.modes:
                for b in bs:
                    for label in order:
                        c = arms[label].run(mode, b)
                        cells[label][mode][b].append(c)
                        print(f"[{time.perf_counter() - t_start:6.1f}s] rep {rep + 1}/{a.repeats} {label:3s} "
                              f"{mode:9s} B={b:<3d} {c['ok']}/{c['n']} valid in {c['wall_s']:6.2f}s = "
                              f"{c['ok'] / c['wall_s']:6.2f}/s  repairs {c['repairs']}  errors {len(c['errors'])} "
                              f"invalid {len(c['invalid'])}", flush=True)
    finally:
        for arm in arms.values():
            arm.close()
    import torch

    meta = {"date": dt.datetime.now().isoformat(timespec="seconds"), "n": a.n, "batches": bs, "modes": a.modes,
            "repeats": a.repeats, "seed": a.seed, "threads": a.threads, "cpu_count": os.cpu_count(),
            "platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "smoke": bool(a.smoke or a.n < 32), "wall_s_total": time.perf_counter() - t_start,
            "trees": {lab: {**tree_info(root), "worker": ready[lab]} for lab, root in trees},
            "command": " ".join(sys.argv)}
    result: dict[str, Any] = {"meta": meta, "summary": summarize(cells, labels, a.modes, bs)}
    if len(labels) == 2 and 1 in bs:
        result["same_b1_across_trees"] = {
            mode: sum(1 for x, y in zip(cells["old"][mode][1][0]["texts"], cells["new"][mode][1][0]["texts"])
                      if x is not None and x == y) for mode in a.modes}
    result["cells"] = {lab: {m: {str(b): cells[lab][m][b] for b in bs} for m in a.modes} for lab in labels}
    if not a.no_plot and plot(result, Path(a.plot)):
        result["plot"] = str(Path(a.plot).resolve())
    # JSON keys must be strings: the summary's B keys become "1", "4", ...
    js, mdp = write_results(result, a.out, markdown)
    print(f"wrote {js}, {mdp}"
          + (f", {result['plot']}" if result.get("plot") else "") + f" in {meta['wall_s_total']:.0f}s")


if __name__ == "__main__":
    main()
