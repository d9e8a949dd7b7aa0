"""rl.py: GRPO's update against the policy gradient written out, DPO's loss and gradient
against TRL's own code, a run stopped by SIGTERM and resumed equal to one never stopped,
two gloo ranks equal to one process, LoRA's reference is the base, DPO raises the
held-out margin, and bad inputs end in one line. The chat model is made here: a tiny
GPT taught the arithmetic template for a few dozen steps (replies of digits and <|end|>)."""

import dataclasses
import json
import re
import signal
import subprocess
import sys
import time
import types
from collections import defaultdict

import pytest
import torch

import rl
from gptkit.models import lora
from gptkit.data import rl_data
from gptkit.data.chat import encode_conversation
from gptkit.ops.checkpoint import load_checkpoint, save_checkpoint
from gptkit.ops.errors import run_main
from gptkit.data.tokenizer import tokenizer_from_dict
from model import GPT, GPTConfig
from repo import REPO
from train_helpers import subprocess_env

CHARS = list(" +0123456789?Wahist")  # arithmetic_chat's characters


@pytest.fixture(scope="module")
def chat_ckpt(tmp_path_factory):
    """A chat checkpoint that answers sums with digits and <|end|>, often wrongly."""
    tok = tokenizer_from_dict({"type": "char", "chars": CHARS})
    base = tok.vocab_size
    torch.manual_seed(0)
    config = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_size=base + 4,
                       bias=False)
    model = GPT(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    prompts = rl_data.arithmetic_prompts("train")
    for step in range(40):
        rows = []
        for p in prompts[step * 16: (step + 1) * 16]:
            ids, mask = encode_conversation(p.messages + [{"role": "assistant", "content": p.answer}],
                                            tok.encode, base)
            rows.append((ids, mask))
        T = max(len(ids) for ids, _ in rows)
        x = torch.tensor([ids + [0] * (T - len(ids)) for ids, _ in rows])
        y = torch.tensor([[t if m else -1 for t, m in zip(ids[1:], mask[1:])] + [-1] * (T - len(ids) + 1)
                          for ids, mask in rows])
        loss = model(x, y)[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
    path = tmp_path_factory.mktemp("chat") / "chat.pt"
    turn = {name: base + i for i, name in enumerate(("<|system|>", "<|user|>", "<|assistant|>", "<|end|>"))}
    save_checkpoint({"format_version": 1, "model": model.state_dict(),
                     "model_config": dataclasses.asdict(config), "tokenizer": tok.to_dict(),
                     "chat": {"template": "gptkit-chat-1", "turn_ids": turn}}, path)
    return path


def args(ckpt, out, *more):
    return [f"--init_from={ckpt}", f"--out_dir={out}", "--group_size=4", "--prompts_per_step=4",
            "--max_new_tokens=4", "--eval_prompts=16", "--eval_interval=2", "--learning_rate=3e-3",
            "--reward=final_number", "--device=cpu", *more]


def run_rl(argv):
    """rl.main through run_main (errors as the command line prints them): the exit code."""
    try:
        run_main(rl.main, argv)
    except SystemExit as e:
        return e.code
    raise AssertionError("run_main always exits")


def weights(out):
    return load_checkpoint(out / "ckpt.pt")["model"]


def records(out, kind):
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


# --------------------------------------------------------------------------- the updates
def test_grpo_step_is_the_policy_gradient_written_out():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=11))
    seq = torch.randint(0, 11, (4, 9))
    mask = torch.tensor([[0] * 4 + [1] * 5, [0] * 4 + [1] * 3 + [0] * 2,
                         [0] * 3 + [1] * 6, [0] * 5 + [1] * 2 + [0] * 2])
    A = torch.tensor([0.5, -0.5, 1.0, -1.0])
    for norm in ("token", "sequence"):
        cfg = rl.RLConfig(loss_norm=norm)
        with torch.no_grad():
            old = rl.reply_logprobs(model, seq, mask)
        m = mask[:, 1:].float()
        total = m.sum().item() if norm == "token" else 4.0
        model.zero_grad()
        rl.grpo_step(model, {"seq": seq, "mask": mask, "advantages": A, "old_logp": old,
                             "total": total}, cfg)
        ours = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        # REINFORCE with a baseline, by hand: -sum_i A_i * (reply i's log-prob terms) / count
        logits = model(seq[:, :-1])[0]
        logp = torch.log_softmax(logits, -1).gather(-1, seq[:, 1:, None]).squeeze(-1) * m
        per_reply = logp.sum(1) if norm == "token" else logp.sum(1) / m.sum(1)
        (-(A * per_reply).sum() / total).backward()
        for a, b in zip(ours, (p.grad for p in model.parameters())):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_clipped_ratio_stops_the_gradient_past_clip_eps():
    """PPO's clip: a reply whose ratio already exceeds 1 + eps in the advantage's direction
    gives no gradient; inside the range it does."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=11))
    seq, mask = torch.randint(0, 11, (1, 6)), torch.tensor([[0, 0, 1, 1, 1, 1]])
    with torch.no_grad():
        logp = rl.reply_logprobs(model, seq, mask)
    cfg = rl.RLConfig(clip_eps=0.2)
    for shift, moves in ((-1.0, False), (-0.01, True)):  # ratio e^1 > 1.2: clipped; e^0.01: not
        model.zero_grad()
        rl.grpo_step(model, {"seq": seq, "mask": mask, "advantages": torch.tensor([1.0]),
                             "old_logp": logp + shift * mask[:, 1:], "total": 4.0}, cfg)
        norm = sum(p.grad.abs().sum() for p in model.parameters() if p.grad is not None)
        assert (norm > 0) == moves


def test_dpo_loss_and_gradient_equal_trls():
    """TRL's DPOTrainer._compute_loss itself, run on our log-probabilities (its model's
    outputs stubbed with them): the same loss and the same gradient."""
    dpo_trainer = pytest.importorskip("trl.trainer.dpo_trainer")
    torch.manual_seed(0)
    P, T = 5, 7
    per_token = torch.randn(2 * P, T - 1)
    completion = (torch.rand(2 * P, T) > 0.3).long()
    per_token = per_token * completion[:, 1:]
    ref = torch.randn(2 * P)
    for kind, eps in (("sigmoid", 0.0), ("robust", 0.1)):
        ours_in = per_token.clone().requires_grad_(True)
        logp = ours_in.sum(1)
        ours = rl.dpo_loss(logp[:P], logp[P:], ref[:P], ref[P:], 0.3, eps, kind).mean()
        ours.backward()
        theirs_in = per_token.clone().requires_grad_(True)
        outputs = types.SimpleNamespace(log_probs=theirs_in, entropy=torch.zeros(2 * P, T - 1),
                                        mean_logits=torch.zeros(2 * P, T - 1),
                                        is_top1=torch.zeros(2 * P, T - 1, dtype=torch.bool))
        accelerator = types.SimpleNamespace(device="cpu", gather=lambda t: t,
                                            gather_for_metrics=lambda t: t)
        trainer = types.SimpleNamespace(
            model=types.SimpleNamespace(training=True), accelerator=accelerator,
            aux_loss_enabled=False, ld_alpha=None, precompute_ref_logps=True,
            f_divergence_type="reverse_kl", loss_types=[kind], loss_weights=[1.0], beta=0.3,
            label_smoothing=eps, _metrics={"train": defaultdict(list)}, _total_train_tokens=0,
            _tp_size=1, use_weighting=False)
        inputs = {"input_ids": torch.zeros(2 * P, T, dtype=torch.long), "attention_mask": completion,
                  "completion_mask": completion, "ref_chosen_logps": ref[:P],
                  "ref_rejected_logps": ref[P:]}
        theirs = dpo_trainer.DPOTrainer._compute_loss(trainer, lambda **kw: outputs, inputs, False)
        theirs.backward()
        torch.testing.assert_close(ours, theirs)
        torch.testing.assert_close(ours_in.grad, theirs_in.grad)


def test_lora_disabled_is_the_base_exactly():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=11))
    idx = torch.randint(0, 11, (2, 8))
    base = model(idx)[0]
    lora.apply(model, 2, 2.0, 0.0, lora.TARGETS)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if lora.ADAPTER_MARK in name:
                p.normal_()
    assert not torch.allclose(model(idx)[0], base)
    with lora.disabled(model):
        assert torch.equal(model(idx)[0], base)
    assert not torch.allclose(model(idx)[0], base)  # switched on again


# --------------------------------------------------------------------------- the data
def test_prompt_and_pair_layouts(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "What is 2+2?", "answer": 4}\n'
                       '{"question": "Tom has 3...", "answer": "3 + 4 = 7\\n#### 7"}\n'
                       '{"messages": [{"role": "user", "content": "1+1?"}], "answer": "2"}\n')
    read = rl_data.read_prompts(prompts)
    assert [p.answer for p in read] == ["4", "7", "2"]
    assert read[1].messages == [{"role": "user", "content": "Tom has 3..."}]
    pairs = tmp_path / "d.jsonl"
    conv = [{"role": "user", "content": "2+2?"}]
    pairs.write_text("\n".join(json.dumps(o) for o in (
        {"prompt": "2+2?", "chosen": "4", "rejected": "5"},
        {"prompt": conv, "chosen": [{"role": "assistant", "content": "4"}],
         "rejected": [{"role": "assistant", "content": "5"}]},
        {"chosen": conv + [{"role": "assistant", "content": "4"}],
         "rejected": conv + [{"role": "assistant", "content": "5"}]})) + "\n")
    assert all((p.messages, p.chosen, p.rejected) == (conv, "4", "5")
               for p in rl_data.read_pairs(pairs))


def test_rewards():
    assert rl_data.exact(" 82 ", "82") == 1.0 and rl_data.exact("83", "82") == 0.0
    assert rl_data.final_number("so 3+4 = 7 #### 7", "7") == 1.0
    assert rl_data.final_number("1,234 apples", "1234") == 1.0
    assert rl_data.final_number("7 then 8", "7") == 0.0 and rl_data.final_number("none", "7") == 0.0
    assert rl_data.final_number("7", "no number") == 0.0  # an answer without a number rewards nothing


@pytest.mark.parametrize("line, says", [
    ('{"prompt": "What is 2+2?"}', 'p.jsonl:2: no "answer"'),
    ('{"answer": "4"}', 'p.jsonl:2: no "prompt"'),
])
def test_a_prompt_without_what_it_needs_is_one_line(tmp_path, capsys, chat_ckpt, line, says):
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "What is 1+1?", "answer": "2"}\n')
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "What is 1+1?", "answer": "2"}\n' + line + "\n")
    code = run_rl(args(chat_ckpt, tmp_path / "out", f"--task={bad}", f"--eval_task={good}"))
    err = capsys.readouterr().err.strip()
    assert code == 2 and says in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("pair, says", [
    ({"prompt": "2+2?", "chosen": "4"}, 'no "rejected" field'),
    ({"prompt": "2+2?", "chosen": "4", "rejected": "4"}, '"chosen" equals "rejected"'),
    ({"chosen": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "4"}],
      "rejected": [{"role": "user", "content": "b"}, {"role": "assistant", "content": "5"}]},
     "differ before their last reply"),
])
def test_a_bad_pair_is_one_line_naming_file_and_line(tmp_path, capsys, chat_ckpt, pair, says):
    pairs = tmp_path / "d.jsonl"
    pairs.write_text(json.dumps({"prompt": "1+1?", "chosen": "2", "rejected": "3"}) + "\n"
                     + json.dumps(pair) + "\n")
    code = run_rl(args(chat_ckpt, tmp_path / "out", "--method=dpo", f"--pairs={pairs}"))
    err = capsys.readouterr().err.strip()
    assert code == 2 and f"{pairs}:2: " in err and says in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_reward_that_raises_is_one_line_and_writes_nothing(tmp_path, capsys, chat_ckpt,
                                                             monkeypatch):
    def broken(reply, answer):
        raise KeyError("oops")

    monkeypatch.setitem(rl_data.REWARDS, "exact", broken)
    code = run_rl(args(chat_ckpt, tmp_path / "out", "--reward=exact"))
    err = capsys.readouterr().err.strip()
    assert code == 2 and "reward exact failed on held-out prompt 1" in err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "out" / "ckpt.pt").exists()
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


# rl.py's settings that train.py has too, refused as train.py refuses them (the same
# function, gptkit/train/settings.py), each with the words of train.py's message
SHARED_REFUSALS = [
    ({"grad_clip": "-1"}, "grad_clip=-1.0 must be a finite number, not negative"),
    ({"learning_rate": "-1e-3"}, "learning_rate=-0.001 must be a finite number, not negative"),
    ({"learning_rate": "nan"}, "learning_rate=nan must be a finite number, not negative"),
    ({"muon_lr": "inf"}, "muon_lr=inf must be a finite number, not negative"),
    ({"learning_rate": "0.5", "weight_decay": "2"}, "learning_rate x weight_decay = 1 must be below 1"),
    ({"beta2": "1"}, "beta2=1.0 must be in [0, 1)"),
    ({"seed": str(10**22)}, "seed=10000000000000000000000 must be between 0 and"),
    ({"seed": "-1"}, "seed=-1 must be between 0 and"),
    ({"lora_rank": "-2"}, "lora_rank=-2 must not be negative"),
    ({"lora_dropout": "1"}, "lora_dropout=1.0 must be in [0, 1)"),
]


@pytest.mark.parametrize("values, says", SHARED_REFUSALS + [
    ({"temperature": "nan"}, "temperature=nan must be a number > 0"),
    ({"temperature": "inf"}, "temperature=inf must be a number > 0"),
    ({"top_k": "-1"}, "top_k=-1 must be at least 1"),
    ({"top_k": "0"}, "top_k=0 must be at least 1"),
    ({"beta": "nan"}, "beta and clip_eps must be numbers > 0"),
    ({"kl_coef": "inf"}, "kl_coef >= 0"),
    ({"too_long": "cut"}, "too_long"),
])
def test_a_bad_setting_is_one_line_before_anything_is_read(tmp_path, capsys, chat_ckpt, values, says):
    out = tmp_path / "out"
    code = run_rl(args(chat_ckpt, out, *(f"--{k}={v}" for k, v in values.items())))
    err = capsys.readouterr().err.strip()
    assert code == 2 and says in err and len(err.splitlines()) == 1, err
    assert not out.exists()


@pytest.mark.parametrize("values, says", SHARED_REFUSALS)
def test_train_py_refuses_the_shared_settings_alike(values, says):
    """The rule is train.py's own: TrainConfig refuses each in the same words."""
    import train

    typed = {k: type(getattr(train.TrainConfig(), k))(v) for k, v in values.items()}
    with pytest.raises(ValueError, match=re.escape(says)):
        train.TrainConfig(**typed)


def test_every_settings_help_is_one_line_of_source():
    """A help text split over lines wraps into orphan fragments ("a ", "also "): each is one."""
    import ast

    split = [f"rl.py:{node.lineno}" for node in ast.walk(ast.parse((REPO / "rl.py").read_text()))
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setting"
             and node.args[1].lineno != node.args[1].end_lineno]
    assert split == []


def long_prompt_files(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "What is 1+1?", "answer": "2"}\n')
    long = tmp_path / "long.jsonl"
    long.write_text('{"prompt": "What is 1+1?", "answer": "2"}\n'
                    + json.dumps({"prompt": "What is " + "1+" * 20 + "1?", "answer": "21"}) + "\n")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "What is 1+1?", "chosen": "2", "rejected": "3"}) + "\n"
                     + json.dumps({"prompt": "What is " + "1+" * 20 + "1?", "chosen": "21",
                                   "rejected": "22"}) + "\n")
    return good, long, pairs


@pytest.mark.parametrize("method", ["grpo", "dpo"])
def test_a_prompt_or_pair_past_the_block_is_refused_or_cropped(tmp_path, capsys, chat_ckpt, method):
    """Block 32: a prompt of 50 characters is refused in one line naming its file and
    line (exit 2, nothing written), or with --too_long=crop trains on its last tokens."""
    good, long, pairs = long_prompt_files(tmp_path)
    data = ([f"--task={long}", f"--eval_task={good}"] if method == "grpo" else
            ["--method=dpo", f"--pairs={pairs}", f"--eval_pairs={pairs}", "--pairs_per_step=2"])
    out = tmp_path / "refused"
    assert run_rl(args(chat_ckpt, out, *data, "--max_iters=2")) == 2
    err = capsys.readouterr().err.strip()
    where = f"{long if method == 'grpo' else pairs}:2: "
    assert err.startswith(f"error: {where}") and "block of 32" in err and len(err.splitlines()) == 1
    assert not (out / "ckpt.pt").exists() and not (out / "metrics.jsonl").exists()
    out = tmp_path / "cropped"
    assert run_rl(args(chat_ckpt, out, *data, "--max_iters=2", "--too_long=crop")) == 0
    printed = capsys.readouterr().out
    assert f"too_long=crop: 1 prompts or pairs lose their oldest tokens" in printed and where[:-2] in printed
    assert len(records(out, "rl_train")) == 2


def test_a_reply_longer_than_the_block_is_refused_even_cropping(tmp_path, capsys, chat_ckpt):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "What is 1+1?", "chosen": "2" * 40, "rejected": "3"}) + "\n")
    assert run_rl(args(chat_ckpt, tmp_path / "out", "--method=dpo", f"--pairs={pairs}", "--too_long=crop")) == 2
    err = capsys.readouterr().err.strip()
    assert f"{pairs}:1: " in err and err.endswith(": shorten the reply") and len(err.splitlines()) == 1
    assert run_rl(args(chat_ckpt, tmp_path / "out2", "--max_new_tokens=40", "--too_long=crop")) == 2
    err = capsys.readouterr().err
    assert "max_new_tokens (40)" in err and err.strip().endswith(": lower --max_new_tokens")


@pytest.mark.parametrize("where", ["task", "eval_task", "pairs"])
def test_a_character_outside_the_vocabulary_names_file_and_line(tmp_path, capsys, chat_ckpt, where):
    good, _, _ = long_prompt_files(tmp_path)
    bad = tmp_path / "bad.jsonl"
    if where == "pairs":
        bad.write_text(json.dumps({"prompt": "What is 1+1?", "chosen": "2", "rejected": "3"}) + "\n"
                       + json.dumps({"prompt": "What is 1+1?", "chosen": "2", "rejected": "3%"}) + "\n")
        data = ["--method=dpo", f"--pairs={bad}"]
    else:
        bad.write_text('{"prompt": "What is 1+1?", "answer": "2"}\n{"prompt": "What is 1%1?", "answer": "0"}\n')
        data = [f"--task={bad}", f"--eval_task={good}"] if where == "task" else [f"--eval_task={bad}"]
    out = tmp_path / "out"
    assert run_rl(args(chat_ckpt, out, *data)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {bad}:2: ") and "'%'" in err and len(err.splitlines()) == 1
    assert not (out / "metrics.jsonl").exists()


def test_best_pt_holds_the_best_held_out_pass1_the_start_included(tmp_path, chat_ckpt):
    """best.pt is the weights of the best held-out pass@1, the start's (step 0) included:
    a run that only makes the model worse (here a rate far too high) leaves the start
    there, which eval.py, convert.py and serve.py read from the folder (best.pt first).
    Before, step 0 was never saved and such a run left only its last, worse, weights."""
    out = tmp_path / "rl"
    assert run_rl(args(chat_ckpt, out, "--max_iters=3", "--eval_interval=1", "--learning_rate=0.1")) == 0
    evals = records(out, "rl_eval")
    earliest_best = max(evals, key=lambda r: (r["pass1"], -r["iter"]))
    best = load_checkpoint(out / "best.pt")
    assert best["iter_num"] == earliest_best["iter"]
    if earliest_best["iter"] == 0:
        start = load_checkpoint(chat_ckpt)["model"]
        assert all(torch.equal(best["model"][k], start[k]) for k in start)


def test_resuming_after_a_kill_keeps_every_record_of_rl_pys_kinds(tmp_path, chat_ckpt):
    """A run killed after its checkpoint at step 2 (the kill leaves a step-2 record and a
    cut line behind), resumed to step 4: its metrics.jsonl reads as the run never killed,
    the evaluation at step 2 (written before that checkpoint) kept."""
    cut, whole = tmp_path / "cut", tmp_path / "whole"
    assert run_rl(args(chat_ckpt, cut, "--max_iters=2", "--lr_decay=false")) == 0
    with open(cut / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "rl_train", "iter": 2, "loss": 9.0}) + "\n" + '{"kind": "rl_ev')
    assert run_rl(args(chat_ckpt, cut, "--max_iters=4", "--lr_decay=false")[1:] + ["--init_from=resume"]) == 0
    assert run_rl(args(chat_ckpt, whole, "--max_iters=4", "--lr_decay=false")) == 0
    for kind in ("rl_eval", "rl_train"):
        drop = lambda rs: [{k: v for k, v in r.items() if k not in ("ms_per_iter", "train_cpu_s")} for r in rs]
        assert drop(records(cut, kind)) == drop(records(whole, kind))
    assert [r["iter"] for r in records(cut, "rl_eval")] == [0, 2, 4]


# --------------------------------------------------------------------------- runs
def test_dpo_raises_the_margin_of_its_pairs(tmp_path, chat_ckpt, capsys):
    """DPO on a few pairs (right vs wrong sums), every step all of them: the margin against
    the reference (0 before any step: the policy is the reference) and the share of pairs
    ranked right rise, the loss falls below log 2."""
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"What is {a}+{a}?", "chosen": str(2 * a),
                                         "rejected": str(2 * a + 1)}) + "\n" for a in range(8)))
    out = tmp_path / "dpo"
    assert run_rl(args(chat_ckpt, out, "--method=dpo", f"--pairs={pairs}", f"--eval_pairs={pairs}",
                       "--pairs_per_step=8", "--max_iters=8", "--eval_interval=8",
                       "--learning_rate=3e-3", "--lr_decay=false", "--beta=0.5")) == 0
    first, last = records(out, "rl_eval")
    assert first["margin"] == pytest.approx(0.0, abs=1e-6)
    assert last["margin"] > 0.2 and last["pair_accuracy"] >= 0.75
    losses = [r["loss"] for r in records(out, "rl_train")]
    assert losses[0] == pytest.approx(0.6931, abs=1e-3) and losses[-1] < 0.6
    printed = capsys.readouterr().out.splitlines()
    steps = [line for line in printed if line.startswith("step ")]
    assert len(steps) == 8 and not any("reward" in line for line in steps)  # DPO samples none
    assert f"the trained model: pass@1 {last['pass1']:.4f}, held-out margin {last['margin']:.4f}" in printed[-1]


def test_lora_run_saves_adapters_and_its_reference_is_the_start(tmp_path, chat_ckpt):
    """With LoRA the reference is the base with the adapters off (no second copy): after
    training, it gives the start checkpoint's log-probabilities exactly; the checkpoint
    holds adapters only, which the loaders merge onto the start."""
    out = tmp_path / "lora"
    assert run_rl(args(chat_ckpt, out, "--method=dpo", "--max_iters=2", "--lora_rank=4",
                       "--lora_targets=all", "--learning_rate=3e-2")) == 0
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["lora"]["rank"] == 4 and all(lora.ADAPTER_MARK in k for k in ckpt["model"])
    cfg = rl.RLConfig(method="dpo", init_from="resume", out_dir=str(out))
    model, chat, _, start = rl.load_start(cfg)
    assert lora.is_applied(model) and start == chat_ckpt.resolve()
    from gptkit.models.loading import model_from_checkpoint, read_checkpoint

    base, _, _ = model_from_checkpoint(read_checkpoint(chat_ckpt), chat_ckpt)
    ids = chat.prompt([{"role": "user", "content": "What is 3+4?"}]) + chat.reply_ids("7")
    seq, mask = torch.tensor([ids]), torch.tensor([[0] * (len(ids) - 2) + [1, 1]])
    reference = rl.reference_for(model, cfg, start)
    assert torch.equal(reference(seq, mask), rl.reply_logprobs(base, seq, mask))
    assert not torch.equal(rl.reply_logprobs(model, seq, mask), rl.reply_logprobs(base, seq, mask))
    merged, _, _ = model_from_checkpoint(ckpt, out / "ckpt.pt")
    torch.testing.assert_close(rl.reply_logprobs(merged, seq, mask), rl.reply_logprobs(model, seq, mask))


def start_rl(out, ckpt, *more):
    return subprocess.Popen([sys.executable, str(REPO / "rl.py"), *args(ckpt, out, *more)],
                            cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_sigterm_saves_and_resuming_equals_an_uninterrupted_run(tmp_path, chat_ckpt):
    cut = tmp_path / "cut"
    proc = start_rl(cut, chat_ckpt, "--max_iters=200", "--lr_decay=false")
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("step 3/"):
            proc.send_signal(signal.SIGTERM)
            break
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, "".join(lines) + out
    assert "stopped by SIGTERM" in out
    stopped_at = load_checkpoint(cut / "ckpt.pt")["iter_num"]
    end = stopped_at + 2
    resumed = subprocess.run([sys.executable, str(REPO / "rl.py"), *args(
        chat_ckpt, cut, f"--max_iters={end}", "--lr_decay=false")[1:], "--init_from=resume"],
        cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    whole = tmp_path / "whole"
    assert run_rl(args(chat_ckpt, whole, f"--max_iters={end}", "--lr_decay=false")) == 0
    a, b = weights(cut), weights(whole)
    assert load_checkpoint(cut / "ckpt.pt")["iter_num"] == end
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], load_checkpoint(chat_ckpt)["model"][k]) for k in a)
    # the log reads as one run: each step once, the same rewards
    steps = lambda o: [(r["iter"], r["reward"]) for r in records(o, "rl_train")]
    assert steps(cut) == steps(whole)


def test_two_gloo_ranks_equal_one_process(tmp_path, chat_ckpt):
    two, one = tmp_path / "two", tmp_path / "one"
    more = ("--max_iters=3", "--eval_interval=3", "--batch_size=5")  # chunks that split replies
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node=2", str(REPO / "rl.py"), *args(chat_ckpt, two, *more)],
                         cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run_rl(args(chat_ckpt, one, *more)) == 0
    a, b = weights(two), weights(one)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6)
    assert records(two, "rl_eval") == pytest.approx(records(one, "rl_eval"))
    assert [r["reward"] for r in records(two, "rl_train")] == [
        r["reward"] for r in records(one, "rl_train")]


# Real-looking replies to a question whose GSM8K answer ends "#### <gold>", and whether
# each is right: currency, commas, decimals, negatives, units, a trailing period, several
# numbers (the last counts), GSM8K's own "#### N" (what follows it counts).
GSM8K_REPLIES = [
    ("She earned $10.00.", "10", True), ("She earned $10.", "10", True),
    ("10 dollars", "10", True), ("The answer is 10", "10", True), ("It is 10.50 now", "10.5", True),
    ("so 1,000 apples", "1000", True), ("1,000 + 200 = 1,200", "1200", True),
    ("1,000 + 200 = 1,200", "1000", False), ("It falls to -3 degrees.", "-3", True),
    ("It falls 3 degrees.", "-3", False), ("3 + 4 = 7 #### 7", "7", True),
    ("#### 7 because 3 + 4 = 7 and 8", "7", False), ("3 + 4 = 7 ####", "7", False),
    ("seven", "7", False), ("", "7", False), ("0.5 of 20 is 10", "10", True),
    ("He has 12.75 left", "12.75", True), ("$1,205.00 in total", "1205", True),
]


def gsm8k_rows(golds):
    return [{"question": "What is 2+2?", "answer": f"2 + 2 = <<2+2=4>>4\n#### {gold}"} for gold in golds]


def test_the_reward_is_the_evaluation_on_gsm8k_replies(tmp_path, chat_ckpt, monkeypatch):
    """GSM8K's answer rule is one function: each reply scores the same as rl.py's
    final_number reward (the answer read from a GSM8K-layout prompt file) and as eval.py
    --tasks gsm8k (the item read from the same rows, the reply standing in for the model's)."""
    from gptkit.evals import report_card, task_scoring, tasks
    from gptkit.evals.evaluation import Settings, load_candidate

    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in gsm8k_rows(g for _, g, _ in GSM8K_REPLIES)))
    prompts = rl_data.read_prompts(path)
    items = tasks.read_task(tasks.TASKS["gsm8k"], path)
    candidate = load_candidate(str(chat_ckpt))
    settings = Settings(torch.device("cpu"), torch.float32, progress=False)
    for (reply, gold, right), prompt, item in zip(GSM8K_REPLIES, prompts, items):
        monkeypatch.setattr(task_scoring, "generate_greedy", lambda *a, reply=reply: reply)
        line = report_card.score_task(candidate, tasks.TASKS["gsm8k"], [item], settings)
        assert line["items"] == 1 and line["acc"] == float(right), reply
        assert rl_data.final_number(reply, prompt.answer) == float(right), reply


@pytest.mark.parametrize("answer", ["4\n####", "4\n####   ", "4 #### four"])
def test_a_gsm8k_answer_without_its_number_is_one_line_naming_file_and_line(tmp_path, answer):
    """Nothing (or no number) after "####" would reward a reply that writes no number:
    refused at load by both readers, naming the file and the line."""
    from gptkit.evals import tasks

    path = tmp_path / "g.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in gsm8k_rows(["4"]) + [
        {"question": "What is 2+2?", "answer": answer}]))
    for read in (rl_data.read_prompts, lambda p: tasks.read_task(tasks.TASKS["gsm8k"], p)):
        with pytest.raises(rl_data.UserError) as e:
            read(path)
        message = str(e.value)
        assert str(path) in message and ("2:" in message or "line 2" in message)
        assert "after \"####\", not a number" in message and "\n" not in message


def test_gsm8k_by_name_is_eval_pys_download_once(tmp_path, monkeypatch):
    """GSM8K's files as the Hub serves them, on 127.0.0.1: rl.py's train and test prompts
    come from eval.py's cache (one download), then offline; a failed download is one
    line naming the URL and what to pass instead."""
    import functools
    import http.server
    import threading

    from gptkit.evals import tasks
    from task_files import write_rows

    served = tmp_path / "hub"
    for split, gold in (("train", "5"), ("test", "1,000")):
        task = tasks.gsm8k_split(split)
        write_rows(served / "datasets" / task.repo / "resolve" / "main" / task.file, gsm8k_rows([gold]))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("GPTKIT_CACHE_DIR", str(tmp_path / "cache"))
    try:
        train = rl_data.named_prompts("gsm8k", "train")
        held = rl_data.named_prompts("gsm8k", "val")
    finally:
        server.shutdown()
        server.server_close()
    assert [p.answer for p in train] == ["5"] and [p.answer for p in held] == ["1000"]
    assert held[0].messages == [{"role": "user", "content": "What is 2+2?"}]
    cached = tasks.resolve_file(tasks.TASKS["gsm8k"])  # eval.py's file: the one rl.py fetched
    assert cached.parent == tmp_path / "cache" / "tasks" / "gsm8k"
    assert [it.gold for it in tasks.read_task(tasks.TASKS["gsm8k"], cached)] == ["1000"]
    assert rl_data.named_prompts("gsm8k", "val") == held  # the cached copy, server gone
    (cached.parent / tasks.gsm8k_split("train").file.rsplit("/", 1)[1]).unlink()
    with pytest.raises(rl_data.UserError, match=r"could not download GSM8K from http://127\.0\.0\.1.*--task "):
        rl_data.named_prompts("gsm8k", "train")
