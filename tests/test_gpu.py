"""CUDA checks (skipped without a GPU; run by scripts/gpu_check.sh): what the CPU suite
cannot see. bf16 and fp16 training with torch.compile (the loss falls and compile
really ran), the quick-start recipe, the flash attention kernel in training, fused
attention against the written-out formula, fused AdamW, eval.py against train.py's
whole-split loss, and sample.py's cached, uncached and compiled greedy decoding."""

import json

import pytest
import torch

import eval as eval_script
import sample
import train
from gptkit.ops.checkpoint import load_checkpoint
from gptkit.config import read_config_file
from gptkit.train import optim
from model import GPT, GPTConfig
from repo import REPO
from train_helpers import read_metrics, tiny_args, write_char_dataset

pytestmark = pytest.mark.gpu


@pytest.fixture
def data_dir(tmp_path):
    write_char_dataset(tmp_path / "data")
    return tmp_path / "data"


@pytest.fixture
def dynamo_counters():
    """torch._dynamo's counters, from zero: unique_graphs > 0 means compile really ran."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield torch._dynamo.utils.counters
    torch._dynamo.reset()


def assert_compiled(out, counters):
    config = json.loads((out / "config.json").read_text())
    assert config["compile"] == "true", config.get("compile_error")  # no fallback to eager
    assert read_metrics(out, "note") == []
    assert counters["stats"]["unique_graphs"] >= 1


def assert_learns(out, by=0.5):
    evals = read_metrics(out, "eval")
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - by, evals


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mixed_precision_training_with_compile_learns(data_dir, tmp_path, dtype, dynamo_counters):
    out = tmp_path / dtype
    args = tiny_args(data_dir, out, device="cuda", dtype=dtype, compile="true", max_iters=60, eval_interval=30,
                     n_embd=64, eval_iters=4)
    assert train.main(args) == 0
    assert_learns(out)
    assert_compiled(out, dynamo_counters)
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert (ckpt["scaler"] is not None) == (dtype == "float16")  # GradScaler only for fp16
    assert all(torch.isfinite(t).all() for t in ckpt["model"].values())
    train_records = read_metrics(out, "train")
    assert all(r["mem_peak_gb"] > 0 and r["mem_reserved_gb"] >= r["mem_peak_gb"] for r in train_records)


def test_quick_start_recipe_on_cuda(data_dir, tmp_path, dynamo_counters):
    """configs/shakespeare.py's model and optimizer (Muon, RoPE, QK-norm, ReLU², RMSNorm,
    soft-capped logits) with dtype and compile on auto, as a GPU user runs it."""
    recipe = read_config_file(REPO / "configs" / "shakespeare.py")
    recipe = {k: v for k, v in recipe.items() if k not in ("out_dir", "dataset", "max_iters", "eval_interval", "eval_iters", "log_interval")}
    out = tmp_path / "out"
    settings = {**recipe, "device": "cuda", "dtype": "auto", "compile": "auto", "max_iters": 60, "eval_interval": 30,
                "eval_iters": 4, "warmup_iters": 10, "lr_decay_iters": 60}
    assert train.main(tiny_args(data_dir, out, **settings)) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["optimizer"] == "muon" and config["pos_encoding"] == "rope" and config["logit_softcap"] == 15.0
    assert config["dtype"] == ("bfloat16" if torch.cuda.get_device_capability() >= (8, 0) else "float16")
    assert_learns(out)
    assert_compiled(out, dynamo_counters)


def test_training_uses_the_flash_attention_kernel(data_dir, tmp_path):
    """bf16, dropout and grouped-query heads, with SDPA restricted to flash attention:
    if any attention call of training or evaluation could not use it, it raises."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = tmp_path / "out"
    args = tiny_args(data_dir, out, device="cuda", dtype="bfloat16", compile="false", n_head=4, n_kv_head=1,
                     n_embd=128, dropout=0.1, max_iters=40, eval_interval=20, eval_iters=4)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        assert train.main(args) == 0
    assert_learns(out, by=0.3)


def test_fused_attention_equals_reference_formula():
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=4, n_embd=128, block_size=256, vocab_size=100, dropout=0.0)
    sdpa = GPT(cfg).cuda().eval()
    ref = GPT(GPTConfig(**{**cfg.__dict__, "attention": "reference"})).cuda().eval()
    ref.load_state_dict(sdpa.state_dict())
    idx = torch.randint(0, 100, (4, 256), device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        a, _ = sdpa(idx)
        b, _ = ref(idx)
    assert torch.allclose(a.float(), b.float(), atol=5e-2, rtol=5e-2)
    with torch.no_grad():
        a, _ = sdpa(idx)
        b, _ = ref(idx)
    assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


def test_fused_adamw_on_cuda():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=50)).cuda()
    cfg = train.TrainConfig()
    [adamw] = optim.make_optimizers(model, cfg, "cuda")
    assert adamw.defaults["fused"] is True
    before = [p.detach().clone() for p in model.parameters()]
    _, loss = model(torch.randint(0, 50, (2, 16), device="cuda"), torch.randint(0, 50, (2, 16), device="cuda"))
    loss.backward()
    adamw.step()
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_eval_py_equals_train_py_whole_split_loss(data_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert train.main(tiny_args(data_dir, out, device="cuda", dtype="bfloat16", max_iters=20, eval_interval=20,
                                eval_iters=0, dropout=0.0)) == 0
    capsys.readouterr()
    assert eval_script.main([str(out / "ckpt.pt"), "--dataset", "tiny", "--data_dir", str(data_dir), "--device", "cuda",
                             "--dtype", "bfloat16", "--batch_size", "4", "--json", "-", "--no_progress"]) == 0
    row = json.loads(capsys.readouterr().out)["models"][0]
    assert row["loss"] == pytest.approx(load_checkpoint(out / "ckpt.pt")["val_loss"], abs=1e-3)


@pytest.fixture(scope="module")
def trained_out(tmp_path_factory):
    """A 4-layer model trained briefly on CUDA, shared by the sampling tests."""
    tmp = tmp_path_factory.mktemp("sampling")
    write_char_dataset(tmp / "data")
    out = tmp / "out"
    assert train.main(tiny_args(tmp / "data", out, device="cuda", dtype="float32", max_iters=30, eval_interval=30,
                                n_layer=4, block_size=64)) == 0
    return out


def greedy(capsys, out, *extra):
    capsys.readouterr()
    assert sample.main(["--out_dir", str(out), "--device", "cuda", "--temperature", "0", "--num_samples", "2",
                        "--max_new_tokens", "100", "--start", "ROMEO:", *extra]) == 0
    return capsys.readouterr().out


def test_sample_cached_greedy_equals_uncached_on_cuda(trained_out, capsys):
    """float32, past block_size (64) with the exact cropping: the cache changes no token."""
    cached = greedy(capsys, trained_out, "--dtype", "float32", "--shift_context", "false")
    assert cached == greedy(capsys, trained_out, "--dtype", "float32", "--use_cache", "false")
    assert len(greedy(capsys, trained_out, "--dtype", "bfloat16")) == len(cached)  # bf16 weights run too


def test_sample_compiled_decoding_equals_eager_and_compiles_once(trained_out, capsys, dynamo_counters):
    """sample.py --compile: one compiled graph for every token and layer (no recompiles),
    and, in float32, the eager cache's tokens."""
    eager = greedy(capsys, trained_out, "--dtype", "float32", "--max_new_tokens", "60")
    compiled = greedy(capsys, trained_out, "--dtype", "float32", "--max_new_tokens", "60", "--compile", "true")
    assert compiled == eager
    assert dynamo_counters["stats"]["unique_graphs"] == 1, dict(dynamo_counters["stats"])
    assert sum(dynamo_counters["recompiles"].values()) == 0
