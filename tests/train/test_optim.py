"""optim.py: the learning-rate schedules as pure functions, the decay split,
Muon + AdamW together, and the GradScaler choice."""

import types

import pytest
import torch

from gptkit.train import optim
from gptkit.train.step import set_lr
from model import GPT, GPTConfig
from train import TrainConfig


def cfg(**kw):
    base = dict(learning_rate=1e-3, min_lr=1e-4, decay_lr=True, warmup_iters=10, lr_decay_iters=100,
                lr_schedule="cosine", cooldown_frac=0.2, weight_decay=0.1, beta1=0.9, beta2=0.95,
                optimizer="adamw", muon_lr=0.02, muon_momentum=0.95, muon_nesterov=True, muon_ns_steps=5, cooldown_shape="linear")
    base.update(kw)
    return types.SimpleNamespace(**base)


def test_cosine_warmup_then_decay_to_min_lr():
    c = cfg()
    lrs = [optim.lr_at(s, c) for s in range(120)]
    assert lrs[0] == pytest.approx(1e-3 / 11) and lrs[9] == pytest.approx(1e-3 * 10 / 11)
    assert all(a < b for a, b in zip(lrs[:10], lrs[1:11]))  # warmup rises
    assert lrs[10] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[10:100], lrs[11:101]))  # then only falls
    assert lrs[55] == pytest.approx((1e-3 + 1e-4) / 2)  # halfway through the cosine
    assert lrs[100] == lrs[119] == 1e-4


def test_constant_wsd_and_no_decay():
    assert [optim.lr_at(s, cfg(lr_schedule="constant")) for s in (10, 50, 500)] == [1e-3] * 3
    w = cfg(lr_schedule="wsd", cooldown_frac=0.2)
    assert optim.lr_at(50, w) == optim.lr_at(80, w) == 1e-3  # stable until 80% of lr_decay_iters
    assert optim.lr_at(90, w) == pytest.approx((1e-3 + 1e-4) / 2)  # linear cooldown
    assert optim.lr_at(100, w) == optim.lr_at(150, w) == 1e-4
    assert [optim.lr_at(s, cfg(decay_lr=False)) for s in (0, 5, 500)] == [1e-3] * 3


def test_wsd_one_minus_sqrt_cooldown():
    """Hägele et al.'s 1-sqrt cooldown: at a share f of the cooldown the rate is
    peak - sqrt(f) * (peak - floor), written out here, and it ends where linear does."""
    w = cfg(lr_schedule="wsd", cooldown_frac=0.2, cooldown_shape="1-sqrt")
    assert optim.lr_at(80, w) == 1e-3
    for step in (81, 85, 90, 95, 99):
        f = (step - 80) / 20
        assert optim.lr_at(step, w) == pytest.approx(1e-3 - f ** 0.5 * (1e-3 - 1e-4))
    assert optim.lr_at(85, w) < optim.lr_at(85, cfg(lr_schedule="wsd", cooldown_frac=0.2))
    assert optim.lr_at(100, w) == 1e-4
    # a time budget's progress drives it the same way
    assert optim.lr_scale(50, w, progress=0.85) == pytest.approx(1 - 0.25 ** 0.5 * 0.9)
    with pytest.raises(ValueError, match="cooldown_shape"):
        TrainConfig(cooldown_shape="sqrt")


def tiny_model():
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=11))


def test_adamw_decays_matrices_only():
    model = tiny_model()
    [adamw] = optim.make_optimizers(model, cfg(), "cpu")
    decay, no_decay = adamw.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    names = {id(p): n for n, p in model.named_parameters()}
    assert any(names[id(p)].endswith("ln_1.weight") for p in no_decay["params"])
    assert any(names[id(p)].endswith("c_attn.bias") for p in no_decay["params"])
    covered = [id(p) for g in adamw.param_groups for p in g["params"]]
    assert sorted(covered) == sorted(id(p) for p in model.parameters())  # each exactly once
    assert not adamw.defaults["fused"]  # fused only on CUDA


def test_muon_and_adamw_cover_every_parameter_once_and_follow_the_schedule():
    model = tiny_model()
    adamw, muon = optim.make_optimizers(model, cfg(optimizer="muon"), "cpu")
    covered = [id(p) for opt in (adamw, muon) for g in opt.param_groups for p in g["params"]]
    assert sorted(covered) == sorted(id(p) for p in model.parameters())
    assert all(p.dim() == 2 for g in muon.param_groups for p in g["params"])
    set_lr([adamw, muon], 0.5)
    assert adamw.param_groups[0]["lr"] == pytest.approx(5e-4) and muon.param_groups[0]["lr"] == pytest.approx(0.01)


def test_muons_weight_decay_is_its_own_setting_and_adamws_stays_on_the_embeddings():
    model = tiny_model()
    adamw, muon = optim.make_optimizers(model, cfg(optimizer="muon", muon_weight_decay=0.2), "cpu")
    assert [g["weight_decay"] for g in muon.param_groups] == [0.2] and adamw.param_groups[0]["weight_decay"] == 0.1
    _, muon = optim.make_optimizers(model, cfg(optimizer="muon"), "cpu")  # settings saved before it: none
    assert [g["weight_decay"] for g in muon.param_groups] == [0.0]
    assert not muon.param_groups[0]["cautious_wd"] and not muon.param_groups[0]["normuon"]
    _, muon = optim.make_optimizers(model, cfg(optimizer="muon", muon_cautious_wd=True, muon_normuon=True), "cpu")
    assert muon.param_groups[0]["cautious_wd"] and muon.param_groups[0]["normuon"]


def test_grad_scaler_only_for_float16():
    assert not optim.make_scaler(torch.float32, "cpu").is_enabled()
    assert not optim.make_scaler(torch.bfloat16, "cpu").is_enabled()
    assert optim.make_scaler(torch.float16, "cpu").is_enabled()


def test_a_time_budgets_decay_follows_the_share_spent_as_the_step_schedule_follows_steps():
    for schedule in ("cosine", "wsd"):
        c = cfg(lr_schedule=schedule)
        for step in range(10, 130):  # after the warmup, progress p stands for step p * lr_decay_iters
            assert optim.lr_scale(step, c, progress=min(1.0, step / 100)) == pytest.approx(optim.lr_scale(step, c))
        assert optim.lr_scale(3, c, progress=0.5) == optim.lr_scale(3, c)  # the warmup counts steps
        assert optim.lr_scale(20, c, progress=0.0) == 1.0  # a warmup longer than the clock's share: the peak


def test_a_schedule_ends_at_max_iters_or_when_its_budget_is_spent():
    from gptkit.run_state import RunState

    budget = optim.Schedule(types.SimpleNamespace(**vars(cfg()), max_iters=1000, time_budget=60.0), "cpu")
    steps = optim.Schedule(types.SimpleNamespace(**vars(cfg()), max_iters=1000, time_budget=0.0), "cpu")
    state = RunState(iter_num=500, train_cpu_s=30.0, train_time_s=90.0)
    assert budget.progress(state) == 0.5 and not budget.finished(state)
    assert budget.eta_s(state, 1.0) == 90.0  # 30 CPU s left, at the 3 wall s per CPU s the run has had
    assert budget.eta_s(RunState(iter_num=500, train_cpu_s=30.0, train_time_s=15.0), 1.0) == 15.0  # two threads
    assert budget.progress(RunState(iter_num=750, train_cpu_s=30.0)) == 0.75  # the steps are further along
    assert budget.progress(RunState(iter_num=250, train_cpu_s=45.0)) == 0.75  # the clock is
    assert budget.finished(RunState(iter_num=9, train_cpu_s=60.0))
    assert budget.eta_s(RunState(iter_num=990, train_cpu_s=30.0, train_time_s=30.0), 1.0) == 9.0  # max_iters comes first
    assert optim.Schedule(budget.cfg, "cuda").finished(state)  # a GPU's clock is wall seconds in steps
    assert steps.progress(state) is None and not steps.finished(state) and steps.eta_s(state, 1.0) == 499
    state.iter_num = 1000  # max_iters still caps a budget
    assert budget.finished(state) and steps.finished(state)


def test_a_budget_that_ends_inside_the_warmup_is_said_early_from_the_pace_and_at_the_end():
    from gptkit.run_state import RunState

    def schedule(**kw):
        settings = {**vars(cfg(warmup_iters=100)), "max_iters": 1000, "time_budget": 60.0, **kw}
        return optim.Schedule(types.SimpleNamespace(**settings), "cpu")

    s = schedule()
    for pace in (0.1, 0.5, 0.59, 0.6, 0.61, 1.0, 5.0):  # seconds a step; 10 steps taken, 6 s spent
        allowed = 10 + int(54 / pace)
        note = s.budget_warmup_note(10, 6.0, pace)
        assert (note is not None) == (allowed < 100), pace
        if note:
            assert f"allows about {allowed:,} steps" in note and "warmup_iters=100" in note and "never decay" in note
    assert s.end_note(RunState(iter_num=40, train_cpu_s=60.0)).startswith(
        "the time budget ended the run at step 40, inside warmup_iters=100: the learning rate never decayed (it "
        "reached 40% of learning_rate)")
    assert s.end_note(RunState(iter_num=100, train_cpu_s=60.0)) is None  # the warmup was done: it decayed
    assert s.end_note(RunState(iter_num=40, train_cpu_s=30.0)) is None  # not the budget's end
    for quiet in (schedule(time_budget=0.0), schedule(decay_lr=False), schedule(lr_schedule="constant"),
                  schedule(max_iters=100), schedule(warmup_iters=0)):  # nothing decays, or schedule_warnings says so
        assert quiet.budget_warmup_note(10, 6.0, 5.0) is None
        assert quiet.end_note(RunState(iter_num=40, train_cpu_s=60.0)) is None
