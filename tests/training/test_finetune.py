"""Fine-tuning from a checkpoint (issue #33): start checkpoint, corpus mix, schedule, diffusion recipe, resume."""
import json
import random

import pytest
import torch

from dgemma_struct.errors import InvalidRequestError, ModelLoadError
from dgemma_struct.training import render
from dgemma_struct.training import train as train_mod
from dgemma_struct.training.recipe import DiffusionRecipe, embedded_path, load_init, lr_at, mixed_corpus


def test_schedule_warms_up_then_decays_to_the_floor():
    lrs = [lr_at(s, 100, lr=1e-3, warmup=10, floor=0.1) for s in range(101)]
    assert lrs[0] == pytest.approx(1e-4) and max(lrs) == pytest.approx(lrs[9])
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lrs[-1] == pytest.approx(1e-4)


def test_views_are_blocks_of_the_answer_with_their_own_context():
    tok, _ = load_init(embedded_path())
    from dgemma_struct.training.generalise import make_generalise_corpus

    encoded = [train_mod.encode_example(tok, e) for e in make_generalise_corpus(6, seed=3)]
    recipe = DiffusionRecipe(views=3, t_dist="high")
    b = train_mod.make_batch(encoded, 32, 2048, torch.Generator().manual_seed(0), random.Random(0), recipe)
    assert b["clean"].shape == b["noisy"].shape == b["dec_pos"].shape == (3, 6, 32)
    T = b["ids"].shape[1]
    for v in range(3):
        for i, (prompt, answer) in enumerate(encoded):
            off = T - len(prompt) - len(answer)
            start = int(b["dec_pos"][v, i, 0]) - off - len(prompt)  # where this view's block begins in the answer
            assert start % 32 == 0
            want = (answer + [0] * 32)[start:start + 32]
            assert b["clean"][v, i].tolist() == want
            # the decoder sees the prompt and the answer before the block, nothing after
            assert int(b["dec_mask"][v, i, :T].sum()) == len(prompt) + start
    one = train_mod.make_batch(encoded, 32, 2048, torch.Generator().manual_seed(0), random.Random(0))
    assert one["clean"].shape == (6, 32)


def test_bad_recipe_and_start_checkpoint_are_typed_errors(tmp_path):
    with pytest.raises(InvalidRequestError, match="t_dist"):
        DiffusionRecipe(t_dist="cosine")
    with pytest.raises(InvalidRequestError, match="mix"):
        mixed_corpus({}, "default", 10, 0, 1.5)
    with pytest.raises(InvalidRequestError, match="fresh_names"):
        mixed_corpus({}, "default", 10, 0, 0.5, fresh_names=2.0)
    with pytest.raises(InvalidRequestError, match="short_records"):
        mixed_corpus({}, "default", 10, 0, 0.6, short_records=0.4)
    with pytest.raises(InvalidRequestError, match="tables"):
        mixed_corpus({}, "default", 10, 0, 0.5, short_records=0.1, tables=0.4)
    with pytest.raises(InvalidRequestError, match="absent"):
        mixed_corpus({}, "default", 10, 0, 0.5, short_records=0.1, tables=0.2, absent=0.2)
    with pytest.raises(ModelLoadError, match="no checkpoint"):
        train_mod.train(tmp_path / "o", init_from=tmp_path, max_steps=1, corpus_size=20, device="cpu", threads=1)


def test_fresh_names_rename_people_of_the_mixed_in_original_share_only():
    from dgemma_struct.training import words
    from dgemma_struct.training.corpus import make_corpus

    listed = set(words.FIRST) | set(words.LAST)
    makers = {"default": make_corpus, "other": lambda n, seed: [{"prompt": f"Ask Alice {i}", "answer": "Alice"}
                                                                  for i in range(n)]}
    plain = mixed_corpus(makers, "other", 400, 1, 0.5)
    fresh = mixed_corpus(makers, "other", 400, 1, 0.5, fresh_names=1.0)
    assert mixed_corpus(makers, "other", 400, 1, 0.5, fresh_names=0.0) == plain
    # the main corpus' examples are left alone; every original one that named a listed person is renamed
    assert sum(e["prompt"].startswith("Ask Alice") for e in fresh) == 200
    orig = [e for e in fresh if not e["prompt"].startswith("Ask Alice")]
    named = [e for e in plain if not e["prompt"].startswith("Ask Alice")
             and any(w.strip(".,;:") in listed for w in e["prompt"].split())]
    assert named
    still = [e for e in orig if e["kind"] == "short" and e["family"] == "phone"
             and any(w.strip(".,;:") in listed for w in e["prompt"].split())]
    assert not still
    half = mixed_corpus(makers, "other", 400, 1, 0.5, fresh_names=0.5)
    renamed = sum(a != b for a, b in zip(half, plain))
    assert 0.2 * len(named) < renamed < 0.8 * len(named)


def test_short_records_take_their_share_from_the_main_corpus_and_keep_the_original_share():
    from dgemma_struct.training.corpus import make_corpus

    makers = {"default": make_corpus, "other": lambda n, seed: [{"prompt": f"main {i}", "kind": "main"}
                                                                  for i in range(n)]}
    out = mixed_corpus(makers, "other", 400, 1, 0.5, short_records=0.1)
    fams = [e.get("family", "") for e in out]
    assert len(out) == 400 and sum(e["kind"] == "main" for e in out) == 160
    assert sum(f.startswith("short_") for f in fams) == 40
    assert mixed_corpus(makers, "other", 400, 1, 0.5, short_records=0.1) == out
    assert mixed_corpus(makers, "other", 400, 1, 0.0, short_records=0.0) == makers["other"](400, 1)
    both = mixed_corpus(makers, "other", 400, 1, 0.5, short_records=0.1, tables=0.15)
    assert sum(e["kind"] == "main" for e in both) == 100 and sum("|---" in e.get("prompt", "") for e in both) >= 60
    three = mixed_corpus(makers, "other", 400, 1, 0.5, short_records=0.1, tables=0.15, absent=0.1)
    asks_more = [e for e in three if isinstance(e.get("fields"), dict) and e.get("template")
                 and len(e["schema"]["properties"]) > len(e["fields"])]
    assert sum(e["kind"] == "main" for e in three) == 60 and len(asks_more) >= 40
    four = mixed_corpus(makers, "other", 400, 1, 0.5, short_records=0.1, tables=0.15, absent=0.1, phrasings=0.1)
    composed = [e for e in four if e.get("template") and e["template"] not in render.TEMPLATES + render.CLASSIFY_TEMPLATES]
    assert sum(e["kind"] == "main" for e in four) == 20 and len(composed) == 40
    with pytest.raises(InvalidRequestError, match="phrasings"):
        mixed_corpus(makers, "other", 10, 0, 0.5, short_records=0.1, tables=0.1, absent=0.1, phrasings=0.25)


def test_fine_tune_from_the_shipped_checkpoint_keeps_snapshots_and_resumes(tmp_path):
    kw = dict(init_from="embedded", corpus="generalise", corpus_size=60, mix=0.5, short_records=0.2, batch_size=2,
              threads=1, device="cpu", log_every=1, checkpoint_every=1, keep_checkpoints=True, warmup=1,
              diffusion_views=2, t_dist="high", sc_like_inference=True, self_condition=1.0, diffusion_weight=2.0)
    meta = train_mod.train(tmp_path, max_steps=1, **kw)
    assert meta["steps"] == 1 and meta["init_from"].endswith("embedded") and meta["vocab_size"] == 2048
    assert meta["diffusion"]["views"] == 2 and meta["mix"] == 0.5 and meta["short_records"] == 0.2
    assert (tmp_path / "step_00001" / "config.json").exists()
    # the parent's guided decoding settings go with the fine-tuned weights, snapshots included
    parent = (embedded_path() / "dgemma_struct.json").read_bytes()
    assert (tmp_path / "dgemma_struct.json").read_bytes() == parent
    assert (tmp_path / "step_00001" / "dgemma_struct.json").read_bytes() == parent
    shipped = json.loads((embedded_path() / "tokenizer.json").read_text())["model"]["vocab"]
    assert json.loads((tmp_path / "tokenizer.json").read_text())["model"]["vocab"] == shipped
    meta = train_mod.train(tmp_path, max_steps=2, resume=True, **kw)
    log = json.loads((tmp_path / "training_log.json").read_text())
    assert meta["steps"] == 2 and [r["step"] for r in log] == [1, 2]
    assert all(torch.isfinite(torch.tensor([r["diffusion_loss"], r["ar_loss"]])).all() for r in log)


def test_prefix_corruption_keeps_a_clean_prefix_and_noises_the_rest():
    gen = torch.Generator().manual_seed(1)
    t = torch.ones(200, 1)
    mask = DiffusionRecipe(prefix=1.0).corrupt_mask(t, (200, 32), gen)
    clean_prefix = (~mask).int().cumprod(dim=1).sum(dim=1)  # clean positions before the first noised one
    assert bool((mask.sum(dim=1) == 32 - clean_prefix).all())  # at t=1 everything after the prefix is noised
    assert 0 < clean_prefix.float().mean() < 31 and len(set(clean_prefix.tolist())) > 10
    assert bool(DiffusionRecipe().corrupt_mask(t, (200, 32), gen).all())  # no prefix: all noised at t=1


def test_frontier_corruption_leaves_a_clean_prefix_and_all_random_after_it_at_any_noise_rate():
    gen = torch.Generator().manual_seed(2)
    t = torch.full((300, 1), 0.1)   # a low rate: without the frontier rule most positions stay clean
    mask = DiffusionRecipe(frontier=1.0).corrupt_mask(t, (300, 32), gen)
    first = mask.int().argmax(dim=1)
    assert bool((mask == (torch.arange(32)[None, :] >= first[:, None])).all())   # one clean run, then all random
    assert len(set(first.tolist())) > 20
    some = DiffusionRecipe(frontier=0.5).corrupt_mask(t, (300, 32), gen)
    contiguous = (some == (torch.arange(32)[None, :] >= some.int().argmax(dim=1)[:, None])).all(dim=1)
    assert 0.3 < contiguous.float().mean() < 0.8   # about half the blocks, the rest uniform at rate t
    with pytest.raises(InvalidRequestError, match="frontier"):
        DiffusionRecipe(frontier_weight=-1.0)


def test_frontier_loss_is_the_cross_entropy_at_each_rows_first_random_position():
    logits = torch.randn(3, 8, 11)
    clean = torch.randint(0, 11, (3, 8))
    noise = torch.zeros(3, 8, dtype=torch.bool)
    noise[0, 2:] = True
    noise[1, 5:] = True          # row 2: nothing random, left out
    want = torch.nn.functional.cross_entropy(logits[[0, 1], [2, 5]], clean[[0, 1], [2, 5]])
    got = DiffusionRecipe(frontier_weight=3.0).frontier_loss(logits, clean, noise)
    assert float(got) == pytest.approx(3 * float(want))
    assert float(DiffusionRecipe(frontier_weight=3.0).frontier_loss(logits, clean, noise & False)) == 0.0
    # in the training loss: the frontier term raises the diffusion loss of the same batch
    tok, model = load_init(embedded_path())
    from dgemma_struct.training.generalise import make_generalise_corpus

    encoded = [train_mod.encode_example(tok, e) for e in make_generalise_corpus(4, seed=5)]
    recipe = DiffusionRecipe(frontier=1.0, frontier_weight=1.0)
    b = train_mod.make_batch(encoded, 32, 2048, torch.Generator().manual_seed(0), random.Random(0), recipe)
    with torch.no_grad():
        plain, _ = train_mod.loss_on_batch(model, b, False, DiffusionRecipe(frontier=1.0))
        extra, _ = train_mod.loss_on_batch(model, b, False, recipe)
    assert float(extra) > float(plain)


def test_frontier_probe_compares_the_ar_head_and_the_decoder_on_the_same_positions():
    from dgemma_struct.training.probe import frontier_accuracy

    tok, model = load_init(embedded_path())
    out = frontier_accuracy(model, tok, n=2)
    assert set(out) == {"in_distribution", "held_out_families", "held_out_phrasings"}
    for row in out.values():
        assert row["tokens"] > 10 and all(0.0 <= row[k] <= 1.0 for k in ("ar", "diffusion_frontier"))
    assert out == frontier_accuracy(model, tok, n=2)   # seeded: checkpoints compare on the same canvases
    # the AR head reads the answer so far; the decoder given nothing but noise names few tokens right
    assert sum(r["ar"] for r in out.values()) > sum(r["diffusion_all_random"] for r in out.values())


def test_result_tables_show_each_split_and_mode(tmp_path):
    from dgemma_struct.training import finetune_report

    arm = {"field_accuracy": 0.25, "exact_records": 0.0, "median_forwards": 7}
    splits = {s: {"diffusion": {"constrained": arm}, "ar": {"constrained": {**arm, "field_accuracy": 0.5}}}
              for s in finetune_report.SPLITS}
    mode = {**dict.fromkeys(finetune_report.HELD_OUT_KEYS, 0.9), "field_accuracy": 0.7, "mean_tokens_per_forward": 12.0}
    data = {"shipped": {"splits": splits, "held_out": {"diffusion": mode, "ar": mode}},
            "tuned": {"splits": splits, "held_out": {"diffusion": mode, "ar": {**mode, "field_accuracy": 0.8}}}}
    (tmp_path / "training_finetune.json").write_text(json.dumps(data))
    [md] = finetune_report.write(tmp_path)
    text = md.read_text()
    assert text.count("| held_out_families |") == 2 and "| 25.0% (0.0%) | 25.0% (0.0%) | 7 → 7 |" in text
    assert "| field_accuracy | 70.0% | 70.0% | 70.0% | 80.0% | yes |" in text and "| 12.00 | yes |" in text
    data["tuned"]["held_out"]["diffusion"] = {**mode, "valid_json_rate": 0.86}   # 4 pp below: flagged
    (tmp_path / "training_finetune.json").write_text(json.dumps(data))
    finetune_report.write(tmp_path)
    assert "| valid_json_rate | 90.0% | 86.0% | 90.0% | 90.0% | **no** |" in md.read_text()
    # explicit columns (oldest first) and the unseen-names table, whose drop is flagged the same way
    names = lambda ar: {"n": 4, "families": ["phone"], "ar": {"exact": ar, "per_family": {"phone": ar}}}  # noqa: E731
    data = {"columns": ["orig", "mid", "new"], "orig": {**data["shipped"], "unseen_names": names(0.75)},
            "mid": {**data["shipped"], "unseen_names": names(0.25), "label": "middle"},
            "new": {**data["shipped"], "unseen_names": names(0.5)}}
    (tmp_path / "training_finetune.json").write_text(json.dumps(data))
    finetune_report.write(tmp_path)
    text = md.read_text()
    assert "| split | mode | arm | orig | middle | new |" in text
    assert "| ar | phone | 75.0% | 25.0% | 50.0% | **no** |" in text
    data["new"]["unseen_names"] = names(0.75)
    (tmp_path / "training_finetune.json").write_text(json.dumps(data))
    finetune_report.write(tmp_path)
    assert "| ar | all | 75.0% | 25.0% | 75.0% | yes |" in md.read_text()
    data["new"]["frontier_first"] = {"splits": {s: {"diffusion": {"constrained": {**arm, "field_accuracy": 0.5,
                                                                                "median_forwards": 30}}}
                                                for s in finetune_report.SPLITS}}
    (tmp_path / "training_finetune.json").write_text(json.dumps(data))
    finetune_report.write(tmp_path)
    text = md.read_text()
    assert "| new | 25.0% → 50.0% | 7 → 30 | 25.0% → 50.0% |" in text
    assert "| orig |" not in text.split("frontier-first")[-1]


def test_recipe_flags_reach_train_and_bad_values_are_one_line_errors():
    import argparse
    import subprocess
    import sys

    from dgemma_struct.training.finetune_args import add_finetune_arguments, finetune_kwargs

    p = argparse.ArgumentParser()
    add_finetune_arguments(p)
    kw = finetune_kwargs(p.parse_args(["--frontier", "0.5", "--frontier-weight", "2", "--prefix", "0.25",
                                       "--fresh-names", "0.5", "--short-records", "0.1", "--grow-depth", "0.1",
                                       "--tables", "0.2", "--absent", "0.15", "--phrasings", "0.05"]))
    assert (kw["frontier"], kw["frontier_weight"], kw["prefix"], kw["fresh_names"], kw["short_records"],
            kw["grow_depth"], kw["tables"], kw["absent"], kw["phrasings"]) == (0.5, 2.0, 0.25, 0.5, 0.1, 0.1, 0.2, 0.15,
                                                                               0.05)
    assert finetune_kwargs(p.parse_args([]))["grow_depth"] is None
    import inspect
    assert set(kw) <= set(inspect.signature(train_mod.train).parameters)
    r = subprocess.run([sys.executable, "-m", "dgemma_struct.cli", "train", "--frontier-weight", "-1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "must be >= 0" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "dgemma_struct.cli", "train", "--grow-depth", "2"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "must be in [0, 1]" in r.stderr and "Traceback" not in r.stderr


def _ar_logits(model, ids):
    return model.model.encoder(input_ids=ids).last_hidden_state


def test_grown_model_doubles_the_layers_and_at_scale_zero_computes_the_same_function():
    from dgemma_struct.training.grow import grow_depth

    tok, small = load_init(embedded_path())
    ids = torch.tensor([tok("Extract the name and age as JSON.\nAda Lind is 34 years old.")["input_ids"]])
    big = grow_depth(small, 0.0)
    text = big.config.text_config
    assert text.num_hidden_layers == 8 and text.layer_types == [t for t in small.config.text_config.layer_types
                                                                  for _ in (0, 1)]
    with torch.no_grad():
        want = _ar_logits(small, ids)
        assert torch.allclose(_ar_logits(big, ids), want, atol=1e-5)
        near = _ar_logits(grow_depth(small, 0.1), ids)
    assert not torch.allclose(near, want, atol=1e-3)  # the copies take part from the start
    # the copy of layer i is layer i's weights, its two residual branches scaled
    sd, gd = small.state_dict(), grow_depth(small, 0.25).state_dict()
    key = "model.decoder.layers.{}.{}"
    assert torch.equal(gd[key.format(3, "self_attn.q_proj.weight")], sd[key.format(1, "self_attn.q_proj.weight")])
    assert torch.allclose(gd[key.format(3, "post_attention_layernorm.weight")],
                          0.25 * sd[key.format(1, "post_attention_layernorm.weight")])
    assert torch.equal(gd[key.format(2, "post_attention_layernorm.weight")],
                       sd[key.format(1, "post_attention_layernorm.weight")])


def test_grow_depth_bad_scale_or_no_start_checkpoint_are_typed_errors(tmp_path):
    from dgemma_struct.training.grow import grow_depth

    _, small = load_init(embedded_path())
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(InvalidRequestError, match="branch_scale"):
            grow_depth(small, bad)
    with pytest.raises(InvalidRequestError, match="needs init_from"):
        train_mod.train(tmp_path / "o", grow_depth=0.1, max_steps=1, corpus_size=20, device="cpu", threads=1)
    assert not (tmp_path / "o").exists()


def test_fine_tune_with_grow_depth_saves_a_deeper_checkpoint_that_loads(tmp_path):
    from transformers import DiffusionGemmaForBlockDiffusion

    meta = train_mod.train(tmp_path, init_from="embedded", grow_depth=0.1, corpus="generalise", corpus_size=40,
                           mix=0.5, batch_size=2, threads=1, device="cpu", max_steps=1, warmup=1)
    assert meta["layers"] == 8 and meta["grow_depth"] == 0.1 and meta["steps"] == 1
    grown = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path)
    assert grown.config.text_config.num_hidden_layers == 8
