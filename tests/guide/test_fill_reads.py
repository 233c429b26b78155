"""Issue 22: the greedy fills that end a canvas read the device side by side
(:func:`~dgemma_struct.constraints.closing.read_together`): one host read per round for all rows, the
same tokens as each fill alone and as the numpy path."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dgemma_struct.constraints import Regex, compile_constraint
from dgemma_struct.constraints.closing import greedy_fill, greedy_fill_reads, read_together
from dgemma_struct.engine.profiling import HostSyncProbe


@pytest.fixture(scope="module")
def digits(tok_runtime):
    return compile_constraint(Regex("[0-9]{2,6}"), tokenizer=tok_runtime.tokenizer)


def _logits(c, seed: int, n: int, misses: int) -> np.ndarray:
    """Random logits whose first ``misses`` positions have their top 2 on letters (never allowed):
    a top-2 fill falls back to the masked argmax there; position 1 has every other logit -inf."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c.vocab_size)).astype(np.float32)
    letters = [c.tokenize(ch)[0] for ch in "ab"]
    x[1, :] = -np.inf
    for i in range(misses):
        x[i, letters] = [50.0 + i, 40.0 + i]
    return x


def test_fills_side_by_side_match_each_alone_in_one_read_per_round(digits):
    rows = [_logits(digits, s, 8, m) for s, m in ((0, 1), (1, 3), (2, 5), (3, 0))]
    alone, reads_alone = [], []
    for x in rows:
        with HostSyncProbe() as probe:
            alone.append(greedy_fill(digits.canvas_walker(), torch.from_numpy(x), 8, topk=2))
        reads_alone.append(probe.total)
        assert alone[-1] == greedy_fill(digits.canvas_walker(), x, 8, topk=2)   # torch path == numpy path
    with HostSyncProbe() as probe:
        together = read_together([greedy_fill_reads(digits.canvas_walker(), torch.from_numpy(x), 8, topk=2)
                                  for x in rows])
    assert together == alone
    assert max(reads_alone) > 2 and probe.total == max(reads_alone) < sum(reads_alone)
    text = digits.tokenizer_info.lltok.decode_str([t for t in alone[2] if t not in digits.stop_token_ids])
    assert text.isdigit() and 2 <= len(text) <= 6


def test_an_error_in_one_fill_closes_the_others(digits):
    w = digits.canvas_walker()
    x = torch.from_numpy(_logits(digits, 0, 8, 3))

    def broken():
        yield torch.zeros(1, dtype=torch.long)
        raise RuntimeError("boom")

    fill = greedy_fill_reads(w, x, 8, topk=2)
    with pytest.raises(RuntimeError, match="boom"):
        read_together([fill, broken()])
    assert fill.gi_frame is None                     # closed: its cursor rolled back
    assert w.frontier == 0 and greedy_fill(w, x, 8, topk=2)
