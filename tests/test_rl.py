"""rl.py: GRPO's update against the policy gradient written out, DPO's loss and gradient
against TRL's own code, a run stopped by SIGTERM and resumed equal to one never stopped,
two gloo ranks equal to one process, LoRA's reference is the base, DPO raises the
held-out margin, and bad inputs end in one line. The chat model is made here: a tiny
GPT taught the arithmetic template for a few dozen steps (replies of digits and <|end|>)."""

import dataclasses
import json
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


# --------------------------------------------------------------------------- runs
def test_dpo_raises_the_margin_of_its_pairs(tmp_path, chat_ckpt):
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


def test_gsm8k_by_name_downloads_once_from_its_publisher(tmp_path, monkeypatch):
    """GSM8K's files in its authors' layout, served on 127.0.0.1: read by name, cached, then
    read offline; a failed download is one line naming the URL and what to pass instead."""
    import functools
    import http.server
    import threading

    served = tmp_path / "served"
    served.mkdir()
    for split, (q, a) in (("train", ("Ann has 2 apples and buys 3. How many?", "2 + 3 = 5\n#### 5")),
                          ("test", ("Bo has 1,000 and spends 1. Left?", "1000 - 1 = 999\n#### 999"))):
        (served / f"{split}.jsonl").write_text(json.dumps({"question": q, "answer": a}) + "\n")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/{{split}}.jsonl"
    monkeypatch.setattr(rl_data, "GSM8K_URL", url)
    monkeypatch.setenv("GPTKIT_CACHE_DIR", str(tmp_path / "cache"))
    try:
        train = rl_data.named_prompts("gsm8k", "train")
        held = rl_data.named_prompts("gsm8k", "val")
    finally:
        server.shutdown()
        server.server_close()
    assert [p.answer for p in train] == ["5"] and [p.answer for p in held] == ["999"]
    assert rl_data.final_number("She has 999 left. #### 999", held[0].answer) == 1.0
    assert rl_data.named_prompts("gsm8k", "val") == held  # the cached copy, server gone
    (tmp_path / "cache" / "gsm8k" / "train.jsonl").unlink()
    with pytest.raises(rl_data.UserError, match=r"could not download GSM8K from http://127\.0\.0\.1"):
        rl_data.named_prompts("gsm8k", "train")
