"""gptkit/fast/fused.py: the hand-written backward passes agree with autograd's, and
apply() swaps them into a built GPT without changing what it computes or saves."""

import copy
import json

import torch
import torch.nn.functional as F

import model as plain
from gptkit.fast import fused
from model import GPT, GPTConfig


def tiny_relu2_rmsnorm(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(block_size=16, vocab_size=37, n_layer=2, n_head=4, n_embd=32,
                         norm="rmsnorm", mlp="relu2", qk_norm=True, bias=True))  # biased and bias-free norms


def test_relu2_gradient_is_autograd_s_bitwise():
    h = torch.randn(4, 8, 32)
    a, b = h.clone().requires_grad_(), h.clone().requires_grad_()
    g = torch.randn_like(h)
    F.relu(a).square().backward(g)
    fused.relu2(b).backward(g)
    assert torch.equal(fused.relu2(h), F.relu(h).square())
    assert torch.equal(a.grad, b.grad)


def test_rms_norm_matches_the_library_and_passes_gradcheck():
    x = torch.randn(3, 5, 16) * 3
    w = torch.rand(16) + 0.5
    torch.testing.assert_close(fused.rms_norm(x, w, 1e-5), F.rms_norm(x, (16,), w, 1e-5))
    x64 = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    w64 = (torch.rand(8, dtype=torch.float64) + 0.5).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: fused.rms_norm(a, b, 1e-5), (x64, w64))


def test_they_are_used_only_for_float32_on_cpu():
    assert fused.use_fused(torch.zeros(2))
    assert not fused.use_fused(torch.zeros(2, dtype=torch.bfloat16))


def test_apply_swaps_every_rmsnorm_and_relu2_and_keeps_the_parameters():
    model = tiny_relu2_rmsnorm()
    params = dict(model.named_parameters())
    state = model.state_dict()
    assert fused.apply(model) is model
    kinds = [type(m) for m in model.modules()]
    assert kinds.count(fused.FusedRMSNorm) == 2 * 2 + 2 * 2 + 1  # ln_1, ln_2, q_norm, k_norm per block; ln_f
    assert kinds.count(fused.FusedReLU2) == 2
    assert plain.RMSNorm not in kinds and plain.ReLU2 not in kinds
    after = dict(model.named_parameters())
    assert list(after) == list(params) and all(after[n] is p for n, p in params.items())
    assert list(model.state_dict()) == list(state)


def test_applied_model_computes_the_same_and_trains_the_same():
    model = tiny_relu2_rmsnorm().train()
    fast = fused.apply(copy.deepcopy(model))
    idx = torch.randint(0, 37, (4, 16), generator=torch.Generator().manual_seed(1))
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, fast)]
    for step in range(5):
        losses = []
        for m, opt in zip((model, fast), opts):
            logits, loss = m(idx[:, :-1], idx[:, 1:])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        if step == 0:  # the forwards are bitwise the same formula
            assert losses[0] == losses[1]
        assert abs(losses[0] - losses[1]) < 1e-5  # RMSNorm's gradient agrees to rounding
    for p, q in zip(model.parameters(), fast.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_swapped_modules_use_the_hand_written_backward_only_for_float32_on_cpu():
    model = fused.apply(tiny_relu2_rmsnorm())
    norm, act = model.transformer.h[0].attn.q_norm, model.transformer.h[0].mlp.act  # a norm without bias
    x = torch.randn(2, 3, 8, requires_grad=True)  # head_dim 8
    assert type(norm(x).grad_fn).__name__ == "RMSNormFunctionBackward"
    assert type(act(x).grad_fn).__name__ == "ReLU2FunctionBackward"
    x16 = torch.randn(2, 3, 8, dtype=torch.bfloat16, requires_grad=True)
    norm.bfloat16()
    assert "RMSNormFunction" not in type(norm(x16).grad_fn).__name__
    assert torch.equal(norm(x16), plain.RMSNorm(8).bfloat16()(x16))  # both weights are still ones
    assert "ReLU2Function" not in type(act(x16).grad_fn).__name__
    assert torch.equal(act(x16), F.relu(x16).square())



def run_with_kernels(data_dir, out, kernels, capsys, **settings):
    import train
    from train_helpers import losses_by_iter, tiny_args

    settings = {"norm": "rmsnorm", "mlp": "relu2", "dropout": 0.0, **settings}
    assert train.main(tiny_args(data_dir, out, cpu_kernels=kernels, **settings)) == 0
    header = [line for line in capsys.readouterr().out.splitlines() if "| kernels " in line]
    recorded = json.loads((out / "config.json").read_text())["cpu_kernels"]
    return losses_by_iter(out), header, recorded


def test_train_py_cpu_kernels_fused_and_model_give_the_same_losses_and_say_which_ran(tmp_path, capsys):
    from train_helpers import write_char_dataset

    write_char_dataset(tmp_path / "data")
    hand, hand_header, hand_recorded = run_with_kernels(tmp_path / "data", tmp_path / "fused", "fused", capsys)
    auto, auto_header, auto_recorded = run_with_kernels(tmp_path / "data", tmp_path / "model", "model", capsys)
    assert hand_header == ["0.03M parameters | world size 1 | cpu float32 | compile False | "
                           "kernels gptkit/fast/fused.py (RMSNorm, ReLU² backward by hand, checked against "
                           "model.py; --cpu_kernels model for model.py's)"]
    assert auto_header == ["0.03M parameters | world size 1 | cpu float32 | compile False | kernels model.py"]
    assert (hand_recorded, auto_recorded) == ("fused", "model")
    assert hand.keys() == auto.keys() and len(hand) == 20
    assert hand[0] == auto[0]  # the same forward, bit for bit
    for it in hand:  # the gradients agree to rounding, and so do the losses after 20 steps
        assert abs(hand[it] - auto[it]) <= 1e-4 * abs(auto[it]), (it, hand[it], auto[it])
    # a model with neither module (LayerNorm, GELU) runs model.py whatever the setting, and says so
    _, header, recorded = run_with_kernels(tmp_path / "data", tmp_path / "gpt2", "fused", capsys,
                                           norm="layernorm", mlp="gelu", max_iters=2)
    assert header[0].endswith("| kernels model.py") and recorded == "model"
