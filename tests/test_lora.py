"""LoRA (gptkit/models/lora.py) against peft's, and a LoRA run end to end: train, resume,
sample, evaluate and export. Bases are made offline: a tiny random transformers
GPT-2 saved to a folder, or a tiny checkpoint of ours."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from repo import REPO

import train
from gptkit.models import lora
from gptkit.ops.checkpoint import load_checkpoint
from gptkit.ops.errors import UserError, run_main
from gptkit.interop.hf_gpt2 import load_gpt2
from gptkit.models.loading import load_model
from gptkit.train import optim
from model import GPT, GPTConfig
from train_helpers import losses_by_iter, read_metrics, subprocess_env, tiny_args, write_base_checkpoint, write_char_dataset

transformers = pytest.importorskip("transformers")  # test-only dependencies
peft = pytest.importorskip("peft")


def tiny_hf_gpt2(folder, vocab_size=101, seed=0, embedding_std=0.02):
    """A random GPT2LMHeadModel saved as a Hugging Face folder: the stand-in for GPT-2.
    With GPT-2's init (std 0.02) a frozen 32-wide output layer can reach logits of
    about ±0.6 only, so a base for training gets larger embeddings."""
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, n_positions=64, vocab_size=vocab_size,
                                     bos_token_id=None, eos_token_id=None)
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():  # random biases too, so that any mix-up of them shows
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
        model.transformer.wte.weight.mul_(embedding_std / 0.02)
    model.save_pretrained(folder)
    return model.eval()


def random_adapters(model, seed=1):
    """Non-zero A and B everywhere (B starts at zero, which would hide a wrong B)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if lora.ADAPTER_MARK in name:
                p.copy_(0.1 * torch.randn_like(p))


def test_b_starts_at_zero_so_the_adapted_model_is_the_base_exactly():
    torch.manual_seed(0)
    base = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=50))
    idx = torch.randint(0, 50, (2, 16))
    before = base(idx)[0]
    adapted = lora.apply(base, rank=4, alpha=8, dropout=0.0, targets=lora.TARGETS)
    assert sum(isinstance(m, lora.LoRALinear) for m in adapted.modules()) == 2 * 4
    assert torch.equal(adapted(idx)[0], before)
    assert all(torch.count_nonzero(p) > 0 for n, p in adapted.named_parameters() if n.endswith("lora_A"))


def test_our_lora_equals_peft_on_the_same_transformers_gpt2(tmp_path):
    hf = tiny_hf_gpt2(tmp_path)
    ours = lora.apply(load_gpt2(tmp_path).eval(), rank=4, alpha=8, dropout=0.0, targets=lora.TARGETS)
    random_adapters(ours)
    # GPT-2's Conv1D stores W as (in, out): fan_in_fan_out tells peft so.
    theirs = peft.get_peft_model(hf, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, fan_in_fan_out=True,
                                                     target_modules=["c_attn", "c_proj", "c_fc"]))
    with torch.no_grad():
        for name, module in ours.named_modules():
            if isinstance(module, lora.LoRALinear):
                twin = theirs.base_model.model.get_submodule(name)
                twin.lora_A["default"].weight.copy_(module.lora_A)
                twin.lora_B["default"].weight.copy_(module.lora_B)
    theirs.eval()
    idx = torch.randint(0, 101, (2, 24))
    with torch.no_grad():
        expected = theirs(idx).logits
        with theirs.disable_adapter():  # the adapters must matter, or the comparison proves little
            assert (theirs(idx).logits - expected).abs().max() > 1e-2
        torch.testing.assert_close(ours(idx)[0], expected, atol=1e-5, rtol=0)
        merged = lora.merge(ours)
        assert not lora.is_applied(merged) and all(type(m) is not lora.LoRALinear for m in merged.modules())
        torch.testing.assert_close(merged(idx)[0], theirs.merge_and_unload()(idx).logits, atol=1e-5, rtol=0)


def test_only_adapters_train_and_get_optimizer_state():
    torch.manual_seed(0)
    model = lora.apply(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=50)),
                       rank=2, alpha=2, dropout=0.0, targets=("attn.c_attn",))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"transformer.h.{i}.attn.c_attn.lora_{m}" for i in range(2) for m in "AB"}
    cfg = train.TrainConfig(init_from="gpt2", lora_rank=2)
    [adamw] = optim.make_optimizers(model, cfg, "cpu")
    _, loss = model(torch.randint(0, 50, (2, 16)), torch.randint(0, 50, (2, 16)))
    loss.backward()
    adamw.step()
    assert {id(p) for p in adamw.state} == {id(p) for n, p in model.named_parameters() if n in trainable}
    assert all(p.grad is None for n, p in model.named_parameters() if n not in trainable)


def test_fingerprint_names_every_base_value_and_ignores_adapters():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=20))
    before = lora.fingerprint(model)
    lora.apply(model, rank=2, alpha=2, dropout=0.0, targets=("attn.c_attn",))
    random_adapters(model)
    assert lora.fingerprint(model) == before
    with torch.no_grad():
        model.transformer.h[0].mlp.c_fc.bias[3] += 1e-6
    assert lora.fingerprint(model) != before


@pytest.mark.parametrize("override, message", [
    ({"lora_rank": 4}, "lora_rank > 0 adapts a trained model: set --init_from"),
    ({"lora_rank": -1, "init_from": "gpt2"}, "lora_rank=-1 must not be negative"),
    ({"lora_rank": 4, "init_from": "gpt2", "lora_targets": "attn.c_atn"}, "lora_targets='attn.c_atn': each must be one of attn.c_attn"),
    ({"lora_rank": 4, "init_from": "gpt2", "lora_alpha": 0}, "lora_alpha=0"),
    ({"lora_rank": 4, "init_from": "gpt2", "lora_dropout": 1}, "lora_dropout=1"),
    ({"lora_rank": 4, "init_from": "gpt2", "optimizer": "muon"}, "LoRA adapters train with AdamW"),
    ({"init_from": "gpt2", "lora_alpha": 16}, "lora_alpha=16.0 without lora_rank: LoRA is off"),
    ({"init_from": "gpt2", "lora_dropout": 0.1}, "lora_dropout=0.1 without lora_rank"),
    ({"init_from": "gpt2", "lora_targets": "all"}, "lora_targets='all' without lora_rank"),
    ({"init_from": "gpt2", "lora_alpha": 8, "lora_targets": "all"}, "lora_alpha=8.0, lora_targets='all' without"),
])
def test_impossible_lora_settings_are_refused_in_one_line(tmp_path, capsys, override, message):
    with pytest.raises(SystemExit) as info:
        run_main(train.main, tiny_args(tmp_path, tmp_path / "out", **override))
    err = capsys.readouterr().err
    assert info.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_alpha_defaults_to_the_rank_and_all_means_every_matrix():
    assert train.TrainConfig(init_from="gpt2", lora_rank=16).lora_alpha == 16
    assert lora.parse_targets("all") == lora.TARGETS
    assert lora.parse_targets("mlp.c_fc, attn.c_attn") == ("mlp.c_fc", "attn.c_attn")


def test_a_target_renamed_in_model_py_is_refused_naming_the_blocks_modules():
    """Targets are model.py's names: where a learner renamed one, the run stops (before
    anything is swapped) with one line that lists what the blocks hold."""
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=11))
    for block in model.transformer.h:  # as after renaming c_attn to qkv in model.py
        block.attn.qkv = block.attn.c_attn
        del block.attn.c_attn
    with pytest.raises(UserError, match=r"blocks have no attn\.c_attn \(renamed in model\.py\? its modules: .*attn\.qkv") as e:
        lora.check_rank(model, 4, ("attn.c_attn",))
    assert "\n" not in str(e.value)
    lora.check_rank(model, 4, ("mlp.c_fc",))  # the names that are there still work


# ---- a LoRA run end to end -------------------------------------------------------


def write_gpt2_token_dataset(data_dir, n=12_000, seed=0):
    """GPT-2 token ids following a learnable rule (a random Markov chain over 40 ids),
    with a {"type": "gpt2"} tokenizer; train.py never decodes them."""
    import json

    rng = np.random.default_rng(seed)
    ids, following = rng.choice(100, 40, replace=False), rng.permutation(40)
    states = [0]
    for _ in range(n - 1):
        states.append(following[states[-1]] if rng.random() < 0.9 else rng.integers(40))
    tokens = ids[np.array(states)].astype(np.uint16)
    folder = data_dir / "bpe"
    folder.mkdir(parents=True)
    n_val = n // 10
    tokens[:-n_val].tofile(folder / "train.bin")
    tokens[-n_val:].tofile(folder / "val.bin")
    meta = {"format_version": 1, "tokenizer": {"type": "gpt2"}, "vocab_size": 50257, "dtype": "uint16",
            "eot_id": 50256, "num_tokens": {"train": n - n_val, "val": n_val}, "sources": [],
            "split": {"rule": "the last tenth", "val_fraction": 0.1}, "fingerprint": "markov"}
    (folder / "meta.json").write_text(json.dumps(meta))
    return data_dir


@pytest.fixture
def hf_run(tmp_path, tiktoken_available):
    """A LoRA run of 30 iterations on a tiny Hugging Face GPT-2 folder (GPT-2's vocabulary)."""
    base = tmp_path / "base"
    tiny_hf_gpt2(base, vocab_size=50257, embedding_std=0.5)
    data = write_gpt2_token_dataset(tmp_path / "data")
    out = tmp_path / "run"
    args = tiny_args(data, out, dataset="bpe", init_from=base, lora_rank=4, lora_alpha=16, lora_targets="all",
                     learning_rate=3e-2, max_iters=30, lr_decay_iters=30, eval_interval=30, eval_iters=4,
                     batch_size=4, gradient_accumulation_steps=1, dropout=0.0, block_size=32)
    assert train.main(args) == 0
    return base, data, out


def test_lora_run_learns_saves_adapters_only_and_exports_the_merged_model(hf_run, tmp_path):
    base, data, out = hf_run
    evals = read_metrics(out, "eval")
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.3, evals
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert set(ckpt["model"]) == {f"transformer.h.{i}.{t}.lora_{m}" for i in range(2) for t in lora.TARGETS for m in "AB"}
    assert ckpt["lora"]["base"] == {"init_from": str(base.resolve()), "fingerprint": lora.fingerprint(load_gpt2(base))}
    base_bytes = (base / "model.safetensors").stat().st_size
    for name in ("ckpt.pt", "best.pt"):
        assert (out / name).stat().st_size < base_bytes / 20, (name, (out / name).stat().st_size, base_bytes)

    # The unmerged run's logits: base + adapters, built the way training resumes it.
    from gptkit.models.loading import adapted_model

    unmerged = adapted_model(ckpt["lora"], ckpt["model"], "ckpt", 32).eval()
    idx = torch.from_numpy(np.fromfile(data / "bpe" / "val.bin", dtype=np.uint16)[:32].astype(np.int64))[None]
    with torch.no_grad():
        expected = unmerged(idx)[0]
    merged, _, summary = load_model(out_dir=out)
    assert "LoRA rank 4" in summary and "merged" in summary
    with torch.no_grad():
        torch.testing.assert_close(merged(idx)[0], expected, atol=5e-5, rtol=1e-5)  # merging rounds W + BA once: up to ~1.5e-5 here

    from gptkit.evals.evaluation import load_candidate  # eval.py's loading

    with torch.no_grad():
        torch.testing.assert_close(load_candidate(str(out)).model(idx)[0], expected, atol=5e-5, rtol=1e-5)

    from gptkit.interop.export import export_hf

    export_hf(out, tmp_path / "hf-out")
    exported = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf-out").eval()
    with torch.no_grad():
        torch.testing.assert_close(exported(idx).logits, expected, atol=5e-5, rtol=1e-5)
        # the export scores the run's own val loss on the same windows
        x, y = idx[:, :-1], idx[:, 1:]
        ours = torch.nn.functional.cross_entropy(unmerged(x)[0].reshape(-1, 50257), y.reshape(-1))
        theirs = torch.nn.functional.cross_entropy(exported(x).logits.reshape(-1, 50257), y.reshape(-1))
        assert abs(ours.item() - theirs.item()) < 1e-5


def test_sampling_is_refused_in_one_line_when_the_base_changed_or_is_gone(hf_run, tiktoken_available):
    base, data, out = hf_run

    def sample():
        return subprocess.run([sys.executable, str(REPO / "sample.py"), f"--out_dir={out}", "--device=cpu",
                               "--num_samples=1", "--max_new_tokens=5"],
                              cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=120)

    assert sample().returncode == 0
    expected = load_checkpoint(out / "best.pt")["lora"]["base"]["fingerprint"]
    model = transformers.GPT2LMHeadModel.from_pretrained(base)
    with torch.no_grad():
        model.transformer.h[0].attn.c_attn.bias[0] += 0.5  # someone fine-tuned the base in place
    model.save_pretrained(base)
    changed = sample()
    assert changed.returncode == 2 and len(changed.stderr.strip().splitlines()) == 1, changed.stderr
    assert "weights have changed" in changed.stderr and expected[:23] in changed.stderr
    assert lora.fingerprint(load_gpt2(base))[:23] in changed.stderr

    for f in base.iterdir():
        f.unlink()
    base.rmdir()
    gone = sample()
    assert gone.returncode == 2 and len(gone.stderr.strip().splitlines()) == 1, gone.stderr
    assert "cannot be loaded" in gone.stderr and expected[:23] in gone.stderr and "found none" in gone.stderr


@pytest.fixture
def char_base(tmp_path):
    data = write_char_dataset(tmp_path / "data").parent
    return data, write_base_checkpoint(tmp_path / "base.pt", data)


LORA = dict(lora_rank=4, lora_dropout=0.1, lora_targets="attn.c_attn,mlp.c_fc", dropout=0.1)


def test_sigterm_then_resume_equals_uninterrupted(char_base, tmp_path, monkeypatch):
    data, base = char_base
    args = dict(LORA, init_from=base, max_iters=16, eval_interval=5, lr_decay_iters=16)
    assert train.main(tiny_args(data, tmp_path / "full", **args)) == 0
    monkeypatch.setenv("GPT_FAULTS", "sigterm_at=7")
    assert train.main(tiny_args(data, tmp_path / "cut", **args)) == 0
    assert load_checkpoint(tmp_path / "cut" / "ckpt.pt")["iter_num"] == 8
    monkeypatch.delenv("GPT_FAULTS")
    assert train.main(tiny_args(data, tmp_path / "cut", **dict(args, init_from="resume"))) == 0
    a, b = losses_by_iter(tmp_path / "full"), losses_by_iter(tmp_path / "cut")
    assert sorted(a) == sorted(b) == list(range(16))
    assert max(abs(a[i] - b[i]) for i in a) <= 1e-6
    full, cut = (load_checkpoint(tmp_path / name / "ckpt.pt") for name in ("full", "cut"))
    for name, tensor in full["model"].items():
        torch.testing.assert_close(cut["model"][name], tensor, atol=1e-6, rtol=0)
    assert len(cut["optimizer"][0]["state"]) == len(cut["model"]) == 8  # adapters only


@pytest.mark.parametrize("fault, what", [("nan_loss_at", "loss is nan"), ("inf_grad_at", "gradient norm is inf")])
def test_a_non_finite_step_stops_the_lora_run_with_its_last_checkpoint_finite(char_base, tmp_path, monkeypatch, capsys, fault, what):
    data, base = char_base
    monkeypatch.setenv("GPT_FAULTS", f"{fault}=7")  # inf_grad_at: an adapter's gradient (the first trainable parameter)
    with pytest.raises(SystemExit) as info:
        run_main(train.main, tiny_args(data, tmp_path / "out", init_from=base, max_iters=20, eval_interval=5, **LORA))
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert f"{what} at iteration 7" in err and "(iteration 5)" in err
    ckpt = load_checkpoint(tmp_path / "out" / "ckpt.pt")
    assert ckpt["iter_num"] == 5 and all(torch.isfinite(t).all() for t in ckpt["model"].values())


def test_a_second_run_on_a_live_lora_out_dir_is_refused(char_base, tmp_path):
    from gptkit.ops.lock import FolderLock

    data, base = char_base
    out = tmp_path / "out"
    out.mkdir()
    lock = FolderLock(out, "training run", "use another --out_dir").acquire()
    try:
        with pytest.raises(UserError, match="training run"):
            train.main(tiny_args(data, out, init_from=base, **LORA))
    finally:
        lock.release()


def test_a_checkpoint_file_as_init_from_fine_tunes_every_weight_from_it(char_base, tmp_path):
    data, base = char_base
    out = tmp_path / "out"
    assert train.main(tiny_args(data, out, init_from=base, learning_rate=0.0, max_iters=2, eval_interval=2)) == 0
    start, ckpt = load_checkpoint(base)["model"], load_checkpoint(out / "ckpt.pt")
    assert "lora" not in ckpt and set(ckpt["model"]) == set(start)
    assert all(torch.equal(ckpt["model"][k], v) for k, v in start.items())  # learning rate 0: the base unchanged
    write_char_dataset(tmp_path / "other", text="just a few other letters " * 2000)
    with pytest.raises(UserError, match="vocabulary mismatch: .*base.pt was trained with a char"):
        train.main(tiny_args(tmp_path / "other", tmp_path / "x", init_from=base))


@pytest.mark.parametrize("rank, ok", [(32, True), (33, False), (10**12, False)])
def test_a_rank_above_the_adapted_layers_width_is_refused_before_adapters_take_memory(char_base, tmp_path, capsys, rank, ok):
    data, base = char_base  # 32 wide: attn.c_attn is 32 in, 96 out
    args = tiny_args(data, tmp_path / "out", init_from=base, lora_rank=rank, max_iters=1, eval_interval=1)
    if ok:
        assert train.main(args) == 0
        return
    with pytest.raises(SystemExit) as info:
        run_main(train.main, args)
    err = capsys.readouterr().err
    assert info.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"lora_rank={rank} is above what attn.c_attn (32 in, 96 out) can use" in err and "lora_rank <= 32" in err


def test_resuming_a_lora_run_takes_lora_dropout_without_a_rank(char_base, tmp_path):
    data, base = char_base
    out = tmp_path / "out"
    assert train.main(tiny_args(data, out, init_from=base, max_iters=2, eval_interval=2, **LORA)) == 0
    assert train.main(tiny_args(data, out, init_from="resume", max_iters=4, eval_interval=2, lora_dropout=0.2)) == 0
    assert load_checkpoint(out / "ckpt.pt")["iter_num"] == 4


def test_a_run_folder_or_a_sharded_folder_as_base_loads_its_checkpoint(char_base, tmp_path):
    from gptkit.models.loading import checkpoint_of

    data, base = char_base
    first = tmp_path / "first"
    assert train.main(tiny_args(data, first, init_from=base, max_iters=2, eval_interval=2)) == 0
    assert checkpoint_of(first) == first / "best.pt" and checkpoint_of(base) == base
    out = tmp_path / "out"
    assert train.main(tiny_args(data, out, init_from=first, learning_rate=0.0, max_iters=1, eval_interval=1, **LORA)) == 0
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["lora"]["base"]["init_from"] == str((first / "best.pt").resolve())  # the file, not the folder
    hf_like = tmp_path / "hf"
    hf_like.mkdir()
    assert checkpoint_of(hf_like) is None  # any other folder is a Hugging Face one
    (tmp_path / "sharded" / "ckpt").mkdir(parents=True)  # an FSDP run's folder without a whole checkpoint
    with pytest.raises(UserError, match="no checkpoint in"):
        checkpoint_of(tmp_path / "sharded")
