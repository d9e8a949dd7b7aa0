"""Muon: orthogonalised updates, parameter routing, training, exact resume;
and the speedrun harness's pure parts (no train.py needed)."""

import dataclasses
import json
import re

import pytest
import torch

from gptkit.train.muon import Muon, orthogonalize, split_params_for_muon




# Singular values the 5-step quintic leaves, measured on random Gaussian
# matrices (20 draws per shape): every value in [0.682, 1.202] for non-square
# shapes; for square ones the few tiniest singular values of G stay small.
NS_LOW, NS_HIGH = 0.67, 1.21


@pytest.mark.parametrize("shape", [(48, 80), (80, 48), (128, 32), (32, 128), (384, 128), (3, 5)])
def test_orthogonalize_singular_values_near_one(shape):
    torch.manual_seed(0)
    G = torch.randn(*shape)
    O = orthogonalize(G)
    assert O.shape == G.shape and O.dtype == G.dtype
    sv = torch.linalg.svdvals(O)
    assert sv.min() > NS_LOW and sv.max() < NS_HIGH, (sv.min().item(), sv.max().item())
    # And it points where the exact polar factor U·Vᵀ points.
    U, _, Vh = torch.linalg.svd(G, full_matrices=False)
    polar = U @ Vh
    cosine = (O * polar).sum() / (O.norm() * polar.norm())
    assert cosine > 0.97, cosine.item()


@pytest.mark.parametrize("n", [64, 128])
def test_orthogonalize_square_bulk_near_one(n):
    torch.manual_seed(0)
    sv = torch.linalg.svdvals(orthogonalize(torch.randn(n, n)))
    in_band = ((sv > NS_LOW) & (sv < NS_HIGH)).float().mean().item()
    assert in_band >= 0.95 and sv.max() < NS_HIGH, (in_band, sv.max().item())


def test_orthogonalize_zero_gradient_stays_zero():
    assert torch.equal(orthogonalize(torch.zeros(4, 6)), torch.zeros(4, 6))


@pytest.mark.parametrize("shape", [(64, 16), (16, 64), (32, 32)])
def test_muon_step_is_scaled_orthogonal_update(shape):
    # lr=1 from a zero matrix: the parameter becomes minus the update itself.
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.zeros(*shape))
    p.grad = torch.randn(*shape)
    Muon([p], lr=1.0, momentum=0.0).step()
    rows, cols = shape
    scale = max(1.0, rows / cols) ** 0.5  # tall matrices get a larger step
    sv = torch.linalg.svdvals(-p.detach() / scale)
    in_band = ((sv > NS_LOW) & (sv < NS_HIGH)).float().mean().item()
    assert in_band >= 0.95, sv
    assert torch.allclose(-p.detach(), scale * orthogonalize(p.grad))


def test_nesterov_and_plain_momentum_differ_after_two_steps():
    torch.manual_seed(0)
    grads = [torch.randn(8, 8), torch.randn(8, 8)]
    results = []
    for nesterov in (True, False):
        p = torch.nn.Parameter(torch.zeros(8, 8))
        opt = Muon([p], lr=0.1, nesterov=nesterov)
        for g in grads:
            p.grad = g.clone()
            opt.step()
        results.append(p.detach().clone())
    assert not torch.allclose(results[0], results[1])


def test_weight_decay_is_decoupled():
    p = torch.nn.Parameter(torch.ones(4, 4))
    p.grad = torch.zeros(4, 4)  # zero update: only the decay acts
    Muon([p], lr=0.1, weight_decay=0.5).step()
    assert torch.allclose(p.detach(), torch.full((4, 4), 1 - 0.1 * 0.5))


def test_cautious_weight_decay_acts_only_where_the_update_pulls_toward_zero():
    torch.manual_seed(0)
    w, g = torch.randn(6, 6), torch.randn(6, 6)
    p = torch.nn.Parameter(w.clone())
    p.grad = g.clone()
    Muon([p], lr=0.1, momentum=0.0, nesterov=False, weight_decay=0.5, cautious_wd=True).step()
    update = orthogonalize(g)  # momentum 0: the step is lr times the orthogonalised gradient
    agree = (update * w) > 0  # the update itself moves these entries toward zero
    assert 0 < agree.sum() < agree.numel()  # both kinds of entry are present
    expected = torch.where(agree, w * (1 - 0.1 * 0.5), w) - 0.1 * update
    assert torch.allclose(p.detach(), expected, atol=1e-6)


def test_normuon_evens_out_the_neurons_and_keeps_muons_step_size():
    from gptkit.train.muon import normalize_neurons

    torch.manual_seed(0)
    update = orthogonalize(torch.randn(16, 8)) * torch.linspace(0.2, 3.0, 16)[:, None]  # uneven rows
    state = {}
    normed = normalize_neurons(update, state)
    row_rms = normed.square().mean(dim=1).sqrt()
    assert torch.allclose(row_rms, row_rms.mean().expand(16), rtol=1e-4)  # first step: every row alike
    assert normed.norm().item() == pytest.approx(update.norm().item(), rel=1e-5)
    assert torch.allclose(state["neuron_second_moment"], 0.05 * update.square().mean(dim=1, keepdim=True))
    # Later steps divide by the running average, not by this step's own RMS.
    second_rms = normalize_neurons(update.flip(0), state).square().mean(dim=1).sqrt()
    assert second_rms.max() > 1.5 * second_rms.min()
    # Through Muon: the same update as orthogonalise-then-normalise, step for step.
    p = torch.nn.Parameter(torch.zeros(16, 8))
    g = torch.randn(16, 8)
    p.grad = g.clone()
    Muon([p], lr=1.0, momentum=0.0, nesterov=False, normuon=True).step()
    assert torch.allclose(-p.detach(), 2 ** 0.5 * normalize_neurons(orthogonalize(g), {}), atol=1e-6)


@pytest.mark.parametrize("shape", [(8,), (2, 3, 4), ()])
def test_non_matrix_parameter_is_rejected_with_its_shape(shape):
    with pytest.raises(ValueError, match=re.escape(f"2-D weight matrices, but a parameter has shape {shape}")):
        Muon([torch.nn.Parameter(torch.zeros(shape))])


def test_non_matrix_parameter_error_names_it():
    named = [("h.0.w", torch.nn.Parameter(torch.zeros(3, 3))), ("ln.bias", torch.nn.Parameter(torch.zeros(3)))]
    with pytest.raises(ValueError, match=r"'ln\.bias' has shape \(3,\).*AdamW"):
        Muon(named)


@pytest.mark.parametrize("kwargs", [dict(lr=-1.0), dict(momentum=1.0), dict(ns_steps=0), dict(weight_decay=-0.1)])
def test_bad_hyperparameters_are_rejected(kwargs):
    with pytest.raises(ValueError, match="Muon"):
        Muon([torch.nn.Parameter(torch.zeros(2, 2))], **kwargs)


# ------------------------------------------------------------------ resume


def _regression_problem():
    torch.manual_seed(0)
    x = torch.randn(64, 16)
    y = torch.randn(64, 8)
    w1 = torch.nn.Parameter(torch.randn(32, 16) * 0.1)
    w2 = torch.nn.Parameter(torch.randn(8, 32) * 0.1)
    return x, y, [w1, w2]


def _train(params, opt, x, y, steps):
    losses = []
    for _ in range(steps):
        w1, w2 = params
        loss = ((torch.relu(x @ w1.T) @ w2.T - y) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_muon_fits_a_small_regression():
    x, y, params = _regression_problem()
    losses = _train(params, Muon(params, lr=0.02), x, y, 40)
    assert losses[-1] < 0.6 * losses[0], losses


@pytest.mark.parametrize("options", [{}, dict(cautious_wd=True, normuon=True)], ids=["muon", "normuon-cautious"])
def test_state_dict_round_trip_resume_is_exact(tmp_path, options):
    x, y, params = _regression_problem()
    straight = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt = Muon(straight, lr=0.02, momentum=0.9, weight_decay=0.01, **options)
    _train(straight, opt, x, y, 10)

    resumed = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt = Muon(resumed, lr=0.02, momentum=0.9, weight_decay=0.01, **options)
    _train(resumed, opt, x, y, 5)
    torch.save({"params": [p.detach() for p in resumed], "optim": opt.state_dict()}, tmp_path / "ck.pt")
    del opt, resumed

    saved = torch.load(tmp_path / "ck.pt", weights_only=True)
    resumed = [torch.nn.Parameter(t.clone()) for t in saved["params"]]
    opt = Muon(resumed, lr=123.0)  # hyperparameters come back from the state dict
    opt.load_state_dict(saved["optim"])
    assert opt.param_groups[0]["lr"] == 0.02
    assert "momentum_buffer" in opt.state[resumed[0]]
    assert ("neuron_second_moment" in opt.state[resumed[0]]) == bool(options)
    assert opt.param_groups[0]["normuon"] == bool(options)
    _train(resumed, opt, x, y, 5)
    for a, b in zip(straight, resumed):
        assert torch.equal(a, b)


# ------------------------------------------------------- routing on model.GPT


def _model_module():
    try:
        import model
    except ImportError as e:  # model.py is written by another engineer
        pytest.skip(f"model.py not available ({e})")
    return model


def _tiny_gpt(overrides):
    model = _model_module()
    fields = {f.name for f in dataclasses.fields(model.GPTConfig)}
    missing = sorted(set(overrides) - fields)
    if missing:
        pytest.fail(f"GPTConfig has no field(s) {missing}; update the variants in this test")
    base = dict(block_size=16, vocab_size=32, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=True)
    cfg = model.GPTConfig(**{**base, **overrides})
    torch.manual_seed(0)
    return model.GPT(cfg)


VARIANTS = {
    "gpt2": {},
    "swiglu": {"mlp": "swiglu"},
    "qk_norm": {"qk_norm": True},
    "rope": {"pos_encoding": "rope"},
    "untied": {"tie_embeddings": False},
    "recipe-like": {
        "pos_encoding": "rope", "qk_norm": True, "mlp": "relu2", "norm": "rmsnorm", "bias": False,
        "tie_embeddings": False, "zero_init_proj": True, "logit_softcap": 15.0,
    },
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_parameter_in_exactly_one_optimizer(variant):
    gpt = _tiny_gpt(VARIANTS[variant])
    muon, adamw = split_params_for_muon(gpt)
    muon_ids = [id(p) for _, p in muon]
    adamw_ids = [id(p) for _, p in adamw]
    all_ids = [id(p) for p in gpt.parameters()]
    assert len(set(muon_ids)) == len(muon_ids) and len(set(adamw_ids)) == len(adamw_ids)
    assert not set(muon_ids) & set(adamw_ids)
    assert sorted(muon_ids + adamw_ids) == sorted(all_ids)

    # Every Linear weight inside a block goes to Muon; nothing else does.
    block_matrices = {
        id(m.weight) for m in gpt.transformer.h.modules() if isinstance(m, torch.nn.Linear)
    }
    assert block_matrices and block_matrices == set(muon_ids)
    for name, p in muon:
        assert name.startswith("transformer.h.") and p.ndim == 2, name
    adamw_names = {name for name, _ in adamw}
    assert "transformer.wte.weight" in adamw_names
    assert any("ln" in n or "norm" in n for n in adamw_names), adamw_names
    # Untied, the head is its own matrix; tied, it is wte and listed once.
    assert ("lm_head.weight" in adamw_names) == (not gpt.config.tie_embeddings)
    # The optimizers accept the lists as they are.
    Muon(muon)
    torch.optim.AdamW(adamw)


def test_routing_refuses_a_wrapped_model():
    class Wrapper(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.module = inner

    with pytest.raises(ValueError, match="raw GPT"):
        split_params_for_muon(Wrapper(_tiny_gpt({})))


def test_muon_and_adamw_train_a_tiny_gpt():
    gpt = _tiny_gpt({})
    muon, adamw = split_params_for_muon(gpt)
    optimizers = [Muon(muon, lr=0.02), torch.optim.AdamW([p for _, p in adamw], lr=3e-3, weight_decay=0.0)]
    # A fixed repeating sequence 0 1 2 3 4 0 1 ..., four shifted copies.
    idx = torch.stack([torch.roll(torch.arange(17) % 5, -s) for s in range(4)])  # (B, T+1)
    x, y = idx[:, :-1], idx[:, 1:]  # (B, T)
    losses = []
    for _ in range(40):
        _, loss = gpt(x, y)
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        loss.backward()
        for opt in optimizers:
            opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0], losses


# ------------------------------------------------- speedrun harness, pure parts


def test_first_reach_interpolates_between_evaluations():
    from benchmarks.bench_speedrun import first_reach

    points = [(0, 0.0, 4.0), (100, 10.0, 3.0), (200, 20.0, 2.0), (300, 30.0, 1.5)]
    assert first_reach(points, 2.5) == (15.0, 150.0)  # halfway between 3.0 and 2.0
    assert first_reach(points, 2.0) == (20.0, 200.0)  # exactly at an evaluation
    assert first_reach(points, 4.5) == (0.0, 0.0)  # already there at the start
    assert first_reach(points, 1.0) is None
    # A loss that goes up again does not count twice: the first crossing wins.
    assert first_reach([(0, 0.0, 3.0), (10, 1.0, 1.0), (20, 2.0, 3.0)], 2.0) == (0.5, 5.0)


def test_metrics_parsing_and_summary(tmp_path):
    from benchmarks.bench_speedrun import eval_points, read_metrics, summarize_run

    lines = [
        {"kind": "eval", "iter": 0, "val_loss": 4.2, "train_time_s": 0.0},
        {"kind": "train", "iter": 0, "loss": 4.2, "lr": 1e-3, "ms_per_iter": 30.0},
        {"kind": "eval", "iter": 200, "val_loss": 2.0, "train_time_s": 8.0},
        {"kind": "eval", "iter": 100, "val_loss": 3.0, "train_time_s": 4.0},
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n\n")
    points = eval_points(read_metrics(path))
    assert points == [(0, 0.0, 4.2), (100, 4.0, 3.0), (200, 8.0, 2.0)]
    s = summarize_run(points, target=2.5)
    assert s["final_val_loss"] == 2.0 and s["final_iter"] == 200 and s["train_time_s"] == 8.0
    assert s["time_to_target_s"] == pytest.approx(6.0) and s["iter_to_target"] == pytest.approx(150.0)
    assert s["ms_per_iter"] == pytest.approx(40.0)


def test_bad_metrics_line_is_named(tmp_path):
    from benchmarks.bench_speedrun import read_metrics
    from gptkit.ops.errors import RunFailed

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind": "eval"}\n{"kind": tru\n')
    with pytest.raises(RunFailed, match="metrics.jsonl, line 2"):
        read_metrics(path)
    with pytest.raises(RunFailed, match="was not written"):
        read_metrics(tmp_path / "missing.jsonl")


def test_tables_report_ratio_against_baseline_train_time():
    from benchmarks.bench_speedrun import build_tables
    from benchmarks.report import Table

    configs = [("A", []), ("B", [])]
    points = {
        "A": {1: [(0, 0.0, 4.0), (2000, 100.0, 1.9)], 2: [(0, 0.0, 4.0), (2000, 120.0, 1.9)]},
        "B": {1: [(0, 0.0, 4.0), (500, 40.0, 1.8)], 2: [(0, 0.0, 4.0), (500, 36.0, 2.5)]},
    }
    summary, runs = build_tables(configs, points, None, Table)
    text = summary.to_markdown()
    # Target 1.9 (A's mean final). B seed 1 reaches it at 40 · (2.1/2.2) s,
    # ratio 38.18/100 = 0.38; seed 2 never does.
    assert "| B | 1/2 | 38.2 | 0.38 |" in text, text
    assert "| A | 2/2 |" in text and "1.0000" not in text
    assert "not reached" in runs.to_markdown()


def test_quick_overrides_end_on_an_evaluation():
    from benchmarks.bench_speedrun import quick_overrides

    out = quick_overrides({"max_iters": 1000, "lr_decay_iters": 1000, "warmup_iters": 50}, 0.1, 4)
    assert out == ["--max_iters=100", "--eval_interval=25", "--lr_decay_iters=100", "--warmup_iters=5"]


def test_unknown_ablation_setting_is_named():
    from benchmarks.bench_speedrun import check_settings
    from gptkit.ops.errors import UserError

    check_settings("ok", ["configs/x.py", "--n_layer=2"], {"n_layer"})
    with pytest.raises(UserError, match="B, no qk-norm: .*'--qk_nrom' \\(did you mean '--qk_norm'\\?\\)"):
        check_settings("B, no qk-norm", ["--qk_nrom=false"], {"qk_norm"})



def test_speedrun_plan_alternates_configs_and_ablations_override_last():
    import argparse

    from benchmarks import bench_speedrun

    parser = argparse.ArgumentParser()
    bench_speedrun.add_arguments(parser)
    configs = bench_speedrun.plan(parser.parse_args(["--ablation", "--recipe_args=--optimizer=muon"]))
    labels = [label for label, _ in configs]
    assert labels[:2] == ["A: nanoGPT-equivalent", "B: recipe"]
    assert len(labels) == 2 + len(bench_speedrun.ABLATIONS)
    baseline = configs[0][1]
    assert baseline[0] == "configs/shakespeare_char.py"
    assert {"--n_layer=4", "--max_iters=2000", "--eval_iters=0", "--eval_interval=250"} <= set(baseline)
    for (label, argv), override in zip(configs[2:], bench_speedrun.ABLATIONS.values()):
        assert argv[0] == "configs/shakespeare.py" and argv[-len(override):] == override, label
    quick = bench_speedrun.plan(parser.parse_args(["--quick"]))
    assert quick[0][1][-3:] == ["--max_iters=200", "--eval_interval=50", "--lr_decay_iters=200"]


def test_cpu_seconds_to_target_interpolate_and_ns_steps_is_a_setting(tmp_path):
    from benchmarks.speedrun_cpu import first_reach_cpu
    from train import TrainConfig

    records = [{"kind": "eval", "iter": 0, "val_loss": 4.0, "train_cpu_s": 2.0},
               {"kind": "train", "iter": 50, "loss": 3.0, "train_cpu_s": 5.0},
               {"kind": "eval", "iter": 100, "val_loss": 2.0, "train_cpu_s": 12.0}]
    assert first_reach_cpu(records, 3.0) == (7.0, 50.0)
    assert first_reach_cpu(records, 1.0) is None
    assert TrainConfig(muon_ns_steps=3).muon_ns_steps == 3
    with pytest.raises(ValueError, match="muon_ns_steps=0"):
        TrainConfig(muon_ns_steps=0)
