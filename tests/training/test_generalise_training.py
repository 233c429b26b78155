"""train(corpus="generalise"): runs, resumes, and writes every checkpoint file under 16 MiB."""
import json

import pytest

from dgemma_struct.errors import InvalidRequestError
from dgemma_struct.training import train as train_mod
from dgemma_struct.training import train_state


def test_state_in_parts_round_trips(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(train_state, "PART_BYTES", 1000)
    state = {"w": torch.arange(2000, dtype=torch.float32), "step": 7}
    path = tmp_path / "train_state.pt"
    train_state.save_state(state, path)
    parts = sorted(tmp_path.glob("train_state.pt.*"))
    assert len(parts) >= 8 and all(p.stat().st_size <= 1000 for p in parts) and not path.exists()
    back = train_state.load_state(path)
    assert back["step"] == 7 and torch.equal(back["w"], state["w"])
    monkeypatch.setattr(train_state, "PART_BYTES", 10**6)
    train_state.save_state({"step": 1}, path)  # a state that fits in one file replaces every part
    assert path.exists() and not list(tmp_path.glob("train_state.pt.*"))


def test_generalise_corpus_trains_and_resumes_with_small_files(tmp_path, monkeypatch):
    monkeypatch.setattr(train_state, "PART_BYTES", 200_000)
    kw = dict(corpus_size=200, vocab_size=400, batch_size=2, threads=1, device="cpu", log_every=1, corpus="generalise")
    meta = train_mod.train(tmp_path, max_steps=1, **kw)
    assert meta["corpus"] == "generalise" and meta["steps"] == 1
    meta = train_mod.train(tmp_path, max_steps=2, resume=True, **kw)
    assert meta["steps"] == 2 and len(json.loads((tmp_path / "training_log.json").read_text())) == 2
    assert list(tmp_path.glob("train_state.pt.0*"))  # the state was written in parts
    with pytest.raises(InvalidRequestError, match="generalise"):
        train_mod.train(tmp_path, max_steps=3, resume=True, **{**kw, "corpus": "default"})
    assert all(p.stat().st_size < 16 * 2**20 for p in tmp_path.iterdir())


def test_unknown_corpus_is_refused(tmp_path):
    with pytest.raises(InvalidRequestError, match="corpus must be one of"):
        train_mod.train(tmp_path / "x", corpus="nope", device="cpu")
    assert not (tmp_path / "x").exists()


def test_gpu_run_trains_and_writes_its_results(tmp_path):
    from dgemma_struct.training.gpu_run import main

    out = main(["--out", str(tmp_path / "m"), "--results", str(tmp_path / "r"), "--minutes", "0.02",
                "--batch-size", "2", "--corpus-size", "120", "--device", "cpu", "--eval-n", "0", "--threads", "1"])
    assert out["training"]["corpus"] == "generalise" and out["training"]["steps"] >= 1
    assert json.loads((tmp_path / "r" / "training_meta.json").read_text())["corpus"] == "generalise"
    assert (tmp_path / "m" / "model.safetensors").exists() or list((tmp_path / "m").glob("model-*.safetensors"))
