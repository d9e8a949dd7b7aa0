"""CUDA checks (skipped without a GPU; run by scripts/gpu_check.sh): bf16 and fp16
training with the GradScaler, torch.compile, fused attention against the written-out
formula, fused AdamW."""

import pytest
import torch

from gptkit.checkpoint import load_checkpoint
from gptkit.train import optim
from model import GPT, GPTConfig
import train
from train_helpers import read_metrics, tiny_args, write_char_dataset

pytestmark = pytest.mark.gpu


@pytest.fixture
def data_dir(tmp_path):
    write_char_dataset(tmp_path / "data")
    return tmp_path / "data"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mixed_precision_training_learns(data_dir, tmp_path, dtype):
    out = tmp_path / dtype
    args = tiny_args(data_dir, out, device="cuda", dtype=dtype, max_iters=60, eval_interval=30, n_embd=64, eval_iters=4)
    assert train.main(args) == 0
    evals = read_metrics(out, "eval")
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.5
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert (ckpt["scaler"] is not None) == (dtype == "float16")  # GradScaler only for fp16
    assert all(torch.isfinite(t).all() for t in ckpt["model"].values())


def test_compiled_training_matches_eager_closely(data_dir, tmp_path):
    runs = {}
    for compile_ in ("false", "true"):
        out = tmp_path / compile_
        args = tiny_args(data_dir, out, device="cuda", dtype="float32", compile=compile_, dropout=0.0, max_iters=10)
        assert train.main(args) == 0
        runs[compile_] = [r["loss"] for r in read_metrics(out, "train")]
    assert runs["true"] == pytest.approx(runs["false"], abs=2e-3)


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
